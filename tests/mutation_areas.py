"""The mutation-testing areas of tests/MUTATION.md: which functions each mutates, and the tests that judge them.

Run only in a throwaway copy of the tree (it rewrites deployer/ files):

    python tests/mutation_areas.py AREA      # marks every line outside AREA's functions `# pragma: no mutate`
                                             # and prints the mutmut command to run next
"""

from __future__ import annotations

import ast
import io
import shlex
import sys
import tokenize
from dataclasses import dataclass


@dataclass(frozen=True)
class Area:
    functions: dict[str, tuple[str, ...]]  # file -> functions mutated there (Class.method for a method)
    tests: tuple[str, ...]  # pytest arguments: the narrowest selection that exercises the area
    disable: str = "fstring"  # message texts: an XX at both ends, which no `in` assertion can see

    def command(self) -> str:
        runner = "python -m pytest -q -x -p no:cacheprovider " + shlex.join(self.tests)
        disable = f"--disable-mutation-types {self.disable} " if self.disable else ""
        return f'nice -n 15 mutmut run --paths-to-mutate {",".join(self.functions)} {disable}--runner "{runner}"'


AREAS = {
    # The undo before the commit: files, index, HEAD, index.lock, temps; and the engine's call of it.
    "restore": Area(
        {"deployer/run/restore.py": ("sha256", "run_commits", "pre_run_bytes", "restore_files",
                                     "clear_stale_index_lock", "_staged_by_run", "_undo_own_commit", "_keep_owner",
                                     "remove_temps"),
         "deployer/run/undo.py": ("restore", "stop_running")},
        ("tests/run/test_restore_files.py",
         "tests/run/test_chain.py::test_remote_compile_error_restores_the_files_and_commits_nothing[local]",
         "tests/run/test_chain.py::test_new_file_is_removed_with_its_new_directories_on_failure[local]",
         "tests/run/test_chain.py::test_allow_dirty_restores_the_bytes_and_keeps_the_users_staging[local]",
         "tests/run/test_chain.py::test_shipped_and_restored_files_keep_their_owner[local]",
         "tests/run/test_chain.py::test_a_signal_after_upload_restores_the_target_and_exits_130[local-2]",
         "tests/run/test_restore_faults.py", "tests/run/test_recover.py", "tests/cli/test_readme_claims.py",
         "tests/transport/test_upload_faults.py",
         "-k", "local and (restore or pre_run or recover or killed or second_signal or removed or owner or refuses) "
               "and not co_restart and not secrets and not observing"),
        # number: every number there is a timeout (30 for 31 changes nothing a test can see in time).
        disable="number,fstring"),
    # The agent's put (sha256 of the bytes received and of the temp file on disk, owner/mode, rename), the
    # request that carries the sha256, and the upload step.
    "upload": Area(
        {"deployer/agent/agent.py": ("Agent.op_put", "Agent._make_parents", "Agent._put_into", "_sha256_file"),
         "deployer/agent/protocol.py": ("Put.fields", "Put.parse", "sha256_hex"),
         "deployer/transport/base.py": ("Transport.put",),
         "deployer/steps/upload.py": ("Upload.actions", "Upload.run")},
        ("tests/transport/test_upload_verify.py", "tests/transport/test_upload_faults.py",
         "tests/agent/test_agent_protocol.py",
         "tests/transport/test_ssh_transport.py",
         "tests/run/test_chain.py::test_apply_ships_compiles_bounds_and_commits_exactly_the_shipped_files[local]",
         "tests/run/test_chain.py::test_patch_mode_applies_with_git_apply[local]",
         "tests/run/test_chain.py::test_new_file_is_removed_with_its_new_directories_on_failure[local]",
         "tests/run/test_chain.py::test_shipped_and_restored_files_keep_their_owner[local]",
         "-k", "put or upload or corrupt or cut_write or a_local_write or apply or new_file or large_payload "
               "or bad_requests or any_mode or become_wraps or verify_on_disk or keep_their_owner "
               "or give_the_file_back")),
    # Host keys: known_hosts, reject / accept-new, the pin, a changed key, every ProxyJump hop's key.
    "host-key": Area(
        {"deployer/transport/ssh/hostkeys.py": ("fingerprint", "KnownHosts.guard", "KnownHosts.changed_key_message",
                                                "KnownHosts._unknown_key_message", "KnownHosts._missing_host_key",
                                                "KnownHosts._pin", "_HostKeyGate.missing_host_key",
                                                "_ends_with_newline"),
         "deployer/transport/ssh/config.py": ("host_entry", "Endpoint.entry", "known_hosts_file"),
         "deployer/transport/ssh/connect.py": ("Link.__init__", "Link._connect"),
         "deployer/transport/ssh/transport.py": ("SSHTransport.__init__",)},
        ("tests/transport/test_ssh_transport.py", "tests/run/test_ssh_apply.py", "tests/cli/test_cli_json.py",
         "-k", "host_key or known_hosts or bastion or accept or proxy_jump or fingerprint or become_wraps "
               "or use_after_close or silent_server or agent_authenticates or default_keys")),
    # Rollback: trusting the log only as far as the target's history vouches for it, refusing what changed
    # since or was rolled back already, and the engine's on_failure rollback after the commit.
    "rollback": Area(
        {"deployer/run/rollback.py": ("Target.of", "target_problems", "check_recorded", "refuse_if_rolled_back",
                                      "check", "already_reverted"),
         "deployer/run/undo.py": ("after_commit_failure",)},
        ("tests/run/test_safety_git.py", "tests/run/test_rollback_lock.py", "tests/cli/test_readme_claims.py",
         "tests/run/test_rollback_refusals.py",
         "-k", "local and (rollback or rolled_back or rechained or on_failure or forged or refuse_a_log or "
               "rolling_back or cut_off) and not co_restart and not second_apply and not failed_run_releases "
               "and not sigkill_leaves and not secret and not lock_path and not keeps_the_files_owner "
               "and not sigint_after"),
        disable="number,fstring"),
    # Run-log verify: the seal, chain, sequence, truncation and artifact checks.
    "run-log-verify": Area(
        {"deployer/runlog.py": ("verify", "_seal_intact", "_check_links", "_check_artifact")},
        ("tests/test_runlog_tamper.py",), disable=""),  # as its recorded run was made
}


def confine(path: str, names: tuple[str, ...]) -> None:
    """Mark every line of path `# pragma: no mutate` (mutmut 2 skips those) but the named functions' own."""
    with open(path) as handle:
        src = handle.read()
    keep: set[int] = set()
    found: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + node.name
                if name in names and not isinstance(node, ast.ClassDef):
                    found.add(name)
                    keep.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
                elif isinstance(node, ast.ClassDef):
                    walk(node.body, name + ".")

    walk(ast.parse(src).body, "")
    if missing := set(names) - found:
        raise SystemExit(f"{path} has no {', '.join(sorted(missing))}: update tests/mutation_areas.py")
    # A comment cannot go on a line that ends inside a string or in a backslash continuation.
    inside: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            inside.update(range(tok.start[0], tok.end[0]))
    lines = src.split("\n")
    for number, line in enumerate(lines, 1):
        if number not in keep and line.strip() and not line.lstrip().startswith("#") \
                and number not in inside and not line.endswith("\\"):
            lines[number - 1] = line + "  # pragma: no mutate"
    with open(path, "w") as out:
        out.write("\n".join(lines))


def main(area_name: str) -> None:
    area = AREAS[area_name]
    for path, names in area.functions.items():
        confine(path, names)
    print(area.command())


if __name__ == "__main__":
    main(sys.argv[1])
