"""The target's git, read and written safely: resolved dests, the git dir, hooks, anchored run logs, rollbacks.

Every test runs over a local host and over the real sshd (the `target` fixture), unless it says why not.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project, git, tree_snapshot

from deployer.agent.protocol import Stat
from deployer.errors import StepFailed
from deployer.run.preflight import refuse_unsafe_dests
from deployer.runlog import GENESIS, RunLogWriter, seal
from deployer.steps.context import Context

FIXED_B = "VALUE = 2\n"
CONN = "python/sglang/srt/disaggregation/common/conn.py"


def log_path(project: Project, run_id: str) -> Path:
    return project.runs / run_id / "events.jsonl"


def rechain(project: Project, run_id: str, edit: Callable[[list[dict[str, Any]]], None]) -> None:
    """Edit a run log and recompute every hash, as someone rewriting it wholesale would."""
    events = project.events(run_id)
    edit(events)
    prev, lines = GENESIS, []
    for event in events:
        record = {k: v for k, v in event.items() if k != "line_sha256"}
        record["prev"] = prev
        line = seal(record)
        lines.append(line + b"\n")
        prev = hashlib.sha256(line).hexdigest()
    log_path(project, run_id).write_bytes(b"".join(lines))


def refused_on_target(project: Project, run_id: str, head: str, said: str) -> str:
    """A re-chained log verifies alone, but not against the target (exit 5, its stderr returned); rollback and its
    plan refuse it with exit 5 saying `said`, and the target is left as it was."""
    assert project.deployer("runs", "verify", run_id).returncode == 0  # the chain alone cannot tell
    checked = project.deployer("runs", "verify", run_id, "--target")
    assert checked.returncode == 5 and said in checked.stderr, checked.stderr
    for command in (("rollback", run_id), ("plan", "--rollback", run_id)):
        result = project.deployer(*command)
        assert result.returncode == 5 and said in result.stderr, result.stderr
    assert project.head() == head and project.file("pkg/a.py") == FIXED_A
    return checked.stderr


def run_end(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in events if e["type"] == "run_end")


def commit_symlink(project: Project, name: str, points_to: str) -> None:
    os.symlink(points_to, project.repo / name)
    git(project.repo, "add", "--", name)
    git(project.repo, "commit", "-q", "-m", f"track {name}")


# -- item 1: paths read back from the target are NUL-delimited --------------------------------------------


def test_resolved_dests_are_read_nul_delimited_so_a_newline_cannot_shift_the_answers(
        target: Project, context: Context, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    commit_symlink(target, "out", str(outside))
    # The loader refuses a newline in a dest; the check on the target must not depend on that.
    crafted = [f"a\n{target.repo}/zzz", "out/victim.txt"]
    # The agent answers one structured entry per path: an odd name cannot shift the others.
    repo, *seen = context.transport.call(Stat((str(target.repo), *(context.in_repo(d) for d in crafted))))
    git_dir = os.path.realpath(target.repo / ".git")
    with pytest.raises(StepFailed) as refused:
        refuse_unsafe_dests(crafted, repo, [git_dir, git_dir], seen)
    assert "out/victim.txt" in str(refused.value) and "outside the repo" in str(refused.value)


def test_odd_legal_dest_names_ship_while_a_symlink_escape_beside_them_is_refused(
        target: Project, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    commit_symlink(target, "out", str(outside))
    odd = "pkg/sp ace \"dq\" 'sq' ünï $x.py"
    target.write("fix/odd.py", "ODD = 1\n")
    target.write("fix/victim.txt", "overwritten\n")
    steps = ["upload", {"diff_bounds": {"files": [1, 2]}}, {"commit": {"message": "odd"}}]
    target.playbook(files=[{"src": "fix/odd.py", "dest": odd, "create": True},
                           {"src": "fix/victim.txt", "dest": "out/victim.txt", "create": True}], steps=steps)
    snapshot = tree_snapshot(target.repo)
    refused = target.deployer("apply", "fix.yaml", "--host", "box")
    assert refused.returncode == 1 and "out/victim.txt" in refused.stderr and "outside the repo" in refused.stderr
    assert (outside / "victim.txt").read_text() == "precious\n"
    assert tree_snapshot(target.repo) == snapshot

    target.playbook(files=[{"src": "fix/odd.py", "dest": odd, "create": True}], steps=steps)
    shipped = target.deployer("apply", "fix.yaml", "--host", "box")
    assert shipped.returncode == 0, shipped.stderr
    assert git(target.repo, "diff", "--name-only", "-z", "HEAD~1", "HEAD") == odd + "\0"


# -- item 2: the git dir, fsmonitor, hooks -----------------------------------------------------------------


FSMONITOR_CONFIG = "[core]\n\tfsmonitor = /bin/sh -c 'touch {marker}'\n"


def test_a_dest_inside_the_git_dir_through_a_tracked_symlink_is_refused(target: Project, tmp_path: Path) -> None:
    commit_symlink(target, "gitdir_link", ".git")
    marker = tmp_path / "fsmonitor-ran"
    target.write("fix/config", FSMONITOR_CONFIG.format(marker=marker))
    target.playbook(files=[{"src": "fix/config", "dest": "gitdir_link/config", "create": True}],
                    steps=["upload", {"commit": {"message": "m"}}])
    config_before = (target.repo / ".git" / "config").read_text()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "gitdir_link/config" in result.stderr and "git dir" in result.stderr
    assert (target.repo / ".git" / "config").read_text() == config_before
    assert not marker.exists()


def test_a_dest_inside_the_common_git_dir_of_a_linked_worktree_is_refused(target: Project) -> None:
    worktree = target.repo / "wt"
    git(target.repo, "worktree", "add", "-q", "-b", "wt", str(worktree))
    target.repo = worktree
    target.write_inventory(repo=str(worktree))
    commit_symlink(target, "common_link", "../.git")  # the main checkout's .git: this worktree's common dir
    target.write("fix/config", "[core]\n\tbare = true\n")
    target.playbook(files=[{"src": "fix/config", "dest": "common_link/config", "create": True}], steps=["upload"])
    config_before = (worktree.parent / ".git" / "config").read_text()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "common_link/config" in result.stderr and "inside the git dir" in result.stderr
    assert (worktree.parent / ".git" / "config").read_text() == config_before


@pytest.mark.parametrize("command", ["apply", "check"])  # check read the target with raw git once
def test_deployers_git_commands_run_no_fsmonitor_program_the_repo_configures(
        target: Project, tmp_path: Path, command: str) -> None:
    marker = tmp_path / "fsmonitor-ran"
    hook = target.write("fsmonitor.sh", f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    hook.chmod(0o755)
    git(target.repo, "config", "core.fsmonitor", str(hook))
    marker.unlink(missing_ok=True)  # the test's own git calls may have run it
    target.playbook()
    result = target.deployer(command, "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not marker.exists()
    assert target.file("pkg/a.py") == (FIXED_A if command == "apply" else ORIGINAL_A)


DEPLOYER = Path(__file__).resolve().parents[2] / "deployer"
GITOPS = DEPLOYER / "steps" / "gitops.py"


def raw_git_argvs(source: str) -> list[int]:
    """Lines of the tuple and list literals that start with "git", except those handed straight to subprocess:
    those run git here, on the operator's machine (a scratch diff, `git apply --check`, the demo's repo)."""
    tree = ast.parse(source)
    local = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
             and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
             and call.func.value.id == "subprocess"}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Tuple | ast.List) and node.elts and isinstance(node.elts[0], ast.Constant)
            and node.elts[0].value == "git" and id(node) not in local]


def test_no_module_but_gitops_builds_a_raw_git_argv_for_the_target() -> None:
    # A source check, not a run over a target: it is about where argv are built, whatever runs them.
    assert raw_git_argvs(GITOPS.read_text()), "the scan finds nothing: it no longer sees git()'s own argv"
    assert raw_git_argvs('ctx.run(["git", "status"])\nsubprocess.run(["git", "apply"])\n') == [1]
    raw = {f"{path.relative_to(DEPLOYER.parent)}:{line}" for path in sorted(DEPLOYER.rglob("*.py"))
           if path != GITOPS for line in raw_git_argvs(path.read_text())}
    assert not raw, f"build these with deployer.steps.gitops.git(): {', '.join(sorted(raw))}"


def test_a_commits_files_are_listed_by_one_argv_that_never_guesses_renames() -> None:
    # A source check: recover once listed them with its own copy, which had lost --no-renames.
    from deployer.steps.gitops import touched_argv

    assert "--no-renames" in touched_argv("HEAD")
    built = sorted(f"{path.relative_to(DEPLOYER.parent)}" for path in DEPLOYER.rglob("*.py")
                   if '"diff-tree"' in path.read_text())
    assert built == ["deployer/steps/gitops.py"], built


def test_commit_skips_the_targets_hooks_unless_the_commit_step_says_hooks_true(
        target: Project, tmp_path: Path) -> None:
    marker = tmp_path / "post-commit-ran"
    target.hook("pre-commit", "#!/bin/sh\necho 'pre-commit says no' >&2\nexit 1\n")
    target.hook("post-commit", f"#!/bin/sh\ntouch {marker}\n")
    steps: list[Any] = ["upload", {"diff_bounds": {"files": 1}}, {"commit": {"message": "m", "hooks": True}}]
    target.playbook(steps=steps)
    before = target.head()
    with_hooks = target.deployer("apply", "fix.yaml", "--host", "box")
    assert with_hooks.returncode == 1, with_hooks.stderr
    assert "pre-commit says no" in with_hooks.stderr
    assert target.head() == before and target.file("pkg/a.py") == ORIGINAL_A
    assert git(target.repo, "status", "--porcelain") == ""

    target.playbook(steps=[*steps[:2], {"commit": {"message": "m"}}])
    default = target.deployer("apply", "fix.yaml", "--host", "box")
    assert default.returncode == 0, default.stderr
    assert git(target.repo, "rev-parse", "HEAD~1").strip() == before
    assert not marker.exists()


# -- item 6: rollback trusts only a log that verifies and matches the target -------------------------------


def test_the_commit_carries_the_sha256_of_the_log_up_to_where_it_was_sent(target: Project) -> None:
    run_id = target.applied()
    data = log_path(target, run_id).read_bytes()
    lines = data.splitlines(keepends=True)
    # Sent with the changes, behind the checks (the log says so right after), or in its own turn.
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "sent_ahead" or
               (json.loads(line)["type"] == "step_start" and json.loads(line)["kind"] == "commit"))
    assert json.loads(lines[cut])["type"] == "sent_ahead"
    expected = hashlib.sha256(b"".join(lines[:cut])).hexdigest()
    message = git(target.repo, "log", "-1", "--format=%B")
    assert f"Deployer-Run: {run_id}\n" in message and f"Deployer-Log: sha256:{expected}\n" in message
    verified = target.deployer("runs", "verify", run_id, "--target")
    assert verified.returncode == 0, verified.stderr


def test_rollback_and_its_plan_refuse_a_log_that_fails_verify(target: Project) -> None:
    run_id = target.applied()
    path = log_path(target, run_id)
    before = run_end(target.events(run_id))["git"]["before"]
    path.write_text(path.read_text().replace(f'"before": "{before}"', f'"before": "{"0" * 40}"')
                    .replace('"playbook_name": "answer fix"', '"playbook_name": "answer fiX"'))  # a second line
    head = target.head()
    for command in (("rollback", run_id), ("plan", "--rollback", run_id)):
        result = target.deployer(*command)
        assert result.returncode == 5, result.stderr
        assert "does not match its own hash" in result.stderr and "runs verify" in result.stderr
        # Every problem on a line of its own, under the refusal.
        assert re.search(r"refusing to act on it:\n  line 1: [^\n]*own hash[^\n]*\n  line \d+: ", result.stderr), \
            result.stderr
    assert target.head() == head and target.file("pkg/a.py") == FIXED_A


def test_a_log_rechained_wholesale_is_caught_against_the_targets_history(target: Project) -> None:
    run_id = target.applied()
    head = target.head()

    def forge(events: list[dict[str, Any]]) -> None:
        events[0]["operator"] = "someone-else@elsewhere"
    rechain(target, run_id, forge)
    checked = refused_on_target(target, run_id, head, "Deployer-Log")
    said = re.search(r"commit [0-9a-f]{12} on the target has Deployer-Log sha256:[0-9a-f]{64}, which matches no "
                     r"beginning of this log: the log was rewritten after that commit\n", checked)
    assert said, checked


@pytest.mark.parametrize("field", ["before", "after", "files"])
def test_a_rechained_run_end_that_disagrees_with_the_target_is_refused(target: Project, field: str) -> None:
    # A later hand commit to pkg/a.py, then the run; a forged git.before would silently discard the hand commit.
    (target.repo / "pkg/a.py").write_text(ORIGINAL_A + "# tuned by hand\n")
    git(target.repo, "commit", "-q", "-am", "hand tuning")
    first = git(target.repo, "rev-list", "--max-parents=0", "HEAD").strip()
    target.write("fix/a.py", ORIGINAL_A + "# tuned by hand\n# and fixed\n")
    run_id = target.applied(steps=["upload", {"commit": {"message": "m"}}])
    head, shipped = target.head(), target.file("pkg/a.py")
    forged = {"before": first, "after": first, "files": ["pkg/a.py", "pkg/b.py"]}[field]

    def forge(events: list[dict[str, Any]]) -> None:
        end = run_end(events)
        if field == "files":
            end["files"] = forged
        else:
            end["git"][field] = forged
    rechain(target, run_id, forge)
    result = target.deployer("rollback", run_id)
    assert result.returncode == 5, result.stderr
    assert "does not match the target" in result.stderr
    assert target.head() == head and target.file("pkg/a.py") == shipped
    assert target.deployer("runs", "verify", run_id, "--target").returncode == 5


def test_an_on_failure_revert_is_anchored_too_and_counts_as_the_runs_rollback(target: Project) -> None:
    # diff_bounds after the commit sees zero changes against HEAD: a failure past the commit.
    target.playbook(steps=["upload", {"commit": {"message": "m"}}, {"diff_bounds": {"files": 1}}],
                    on_failure="rollback")
    failed = target.deployer("apply", "fix.yaml", "--host", "box")
    assert failed.returncode == 5, failed.stderr
    run_id = target.newest_run()
    assert git(target.repo, "log", "-1", "--format=%(trailers:key=Deployer-Rollback-Of,valueonly)").strip() == run_id
    assert "Deployer-Log: sha256:" in git(target.repo, "log", "-1", "--format=%B")
    verified = target.deployer("runs", "verify", run_id, "--target")
    assert verified.returncode == 0, verified.stderr
    head = target.head()
    again = target.deployer("rollback", run_id)
    assert again.returncode == 2 and "already rolled back by its own on_failure" in again.stderr
    assert target.head() == head


FORGED = "20990101T000000.000Z-forged"


def test_a_forged_rolled_back_by_line_fails_on_the_target_and_is_never_taken_for_a_rollback(target: Project) -> None:
    run_id = target.applied()
    link = RunLogWriter.reopen(target.runs, run_id)
    link.write({"type": "rolled_back_by", "by": FORGED, "status": "successful", "commit": "f" * 40})
    link.close()
    # The chain alone cannot tell; the target's history names the line: no such run, no such revert.
    said = refused_on_target(target, run_id, target.head(), f"rolled_back_by names run '{FORGED}'")
    assert "the revert ffffffffffff, which is not a revert of this run" in said and "already rolled back" not in said
    # Without it, the rollback goes, and the real one is the one that counts.
    def unforged(events: list[dict[str, Any]]) -> None:
        events[:] = [e for e in events if e.get("by") != FORGED]
        for seq, event in enumerate(events):
            event["seq"] = seq
    rechain(target, run_id, unforged)
    result = target.deployer("rollback", run_id)
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
    real = target.newest_run()
    again = target.deployer("rollback", run_id)  # the real one is on the target: that one counts
    assert again.returncode == 2 and f"already rolled back by run {real}" in again.stderr


# -- item 7: rolling back a run that created a file -------------------------------------------------------


NEW_FILES = [{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/new.py", "dest": "pkg/new/new.py", "create": True}]
NEW_STEPS = ["upload", {"diff_bounds": {"files": 2}}, {"commit": {"message": "m"}}]


def test_rolling_back_a_run_that_created_a_file_finishes_and_is_safe_to_repeat(target: Project) -> None:
    target.write("fix/new.py", "NEW = 1\n")
    pre_tree = git(target.repo, "rev-parse", "HEAD^{tree}").strip()
    run_id = target.applied(files=NEW_FILES, steps=NEW_STEPS)
    result = target.deployer("rollback", run_id)
    assert result.returncode == 0, result.stderr
    assert git(target.repo, "rev-parse", "HEAD^{tree}").strip() == pre_tree
    assert not (target.repo / "pkg/new/new.py").exists()
    assert git(target.repo, "status", "--porcelain") == ""
    head = target.head()
    again = target.deployer("rollback", run_id)
    assert again.returncode == 2 and "already rolled back" in again.stderr
    assert target.head() == head


def test_a_rollback_cut_off_before_its_commit_finishes_on_the_next_attempt(target: Project) -> None:
    target.write("fix/new.py", "NEW = 1\n")
    pre_tree = git(target.repo, "rev-parse", "HEAD^{tree}").strip()
    run_id = target.applied(files=NEW_FILES, steps=NEW_STEPS)
    before = run_end(target.events(run_id))["git"]["before"]
    # What a rollback killed between its `git checkout`/`git rm` and its commit leaves behind.
    git(target.repo, "checkout", before, "--", "pkg/a.py")
    git(target.repo, "rm", "-q", "-f", "--", "pkg/new/new.py")
    result = target.deployer("rollback", run_id)
    assert result.returncode == 0, result.stderr
    assert git(target.repo, "rev-parse", "HEAD^{tree}").strip() == pre_tree
    assert git(target.repo, "rev-list", "--count", f"{before}..HEAD").strip() == "2"
    assert git(target.repo, "status", "--porcelain") == ""


# -- item 8: a dest git does not track needs create: true --------------------------------------------------


def test_a_dest_git_does_not_track_needs_create_true_and_the_error_names_the_closest_tracked_path(
        target: Project) -> None:
    (target.repo / CONN).parent.mkdir(parents=True)
    (target.repo / CONN).write_text("CONN = 1\n")
    git(target.repo, "add", "--", CONN)
    git(target.repo, "commit", "-q", "-m", "conn")
    target.write("fix/conn.py", "CONN = 2\n")
    typo = CONN.removeprefix("python/")
    target.playbook(files=[{"src": "fix/conn.py", "dest": typo}], steps=["upload"])
    snapshot = tree_snapshot(target.repo)
    for command in ("apply", "plan"):
        result = target.deployer(command, "fix.yaml", "--host", "box")
        assert result.returncode == 2, result.stderr
        assert f"did you mean {CONN}?" in result.stderr and "create: true" in result.stderr
        assert "fix.yaml:" in result.stderr and "files.0.dest" in result.stderr
        assert tree_snapshot(target.repo) == snapshot

    target.playbook(files=[{"src": "fix/conn.py", "dest": typo, "create": True}],
                    steps=["upload", {"commit": {"message": "m"}}])
    created = target.deployer("apply", "fix.yaml", "--host", "box")
    assert created.returncode == 0, created.stderr
    assert (target.repo / typo).read_text() == "CONN = 2\n"


def make_patch(project: Project, rel: str, new: str) -> str:
    """A git diff turning rel's committed content into new (the repo is left as it was)."""
    original = (project.repo / rel).read_bytes() if (project.repo / rel).exists() else None
    (project.repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (project.repo / rel).write_text(new)
    git(project.repo, "add", "-N", "--", rel)
    patch = git(project.repo, "diff", "--", rel)
    if original is None:
        git(project.repo, "rm", "-q", "--cached", "--", rel)
        (project.repo / rel).unlink()
    else:
        (project.repo / rel).write_bytes(original)
    return patch


def test_a_patch_that_creates_a_file_needs_no_create_flag(target: Project) -> None:
    target.write("fix.diff", make_patch(target, "pkg/made.py", "MADE = 1\n"))
    target.playbook(patch="fix.diff", steps=["upload", {"diff_bounds": {"files": 1}}, {"commit": {"message": "m"}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/made.py") == "MADE = 1\n"


# -- item 9: owner and mode survive every write path ------------------------------------------------------


def own(project: Project, rel: str) -> None:
    os.chown(project.repo / rel, 12345, 12346)
    os.chmod(project.repo / rel, 0o640)


def ownership(project: Project, rel: str) -> tuple[int, int, int]:
    st = (project.repo / rel).stat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_a_patch_apply_keeps_the_files_owner_and_mode(target: Project) -> None:
    target.write("fix.diff", make_patch(target, "pkg/a.py", FIXED_A))
    own(target, "pkg/a.py")
    target.playbook(patch="fix.diff")
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == FIXED_A
    assert ownership(target, "pkg/a.py") == (12345, 12346, 0o640)


def test_a_rollback_keeps_the_files_owner_and_mode(target: Project) -> None:
    own(target, "pkg/a.py")
    run_id = target.applied()
    assert ownership(target, "pkg/a.py") == (12345, 12346, 0o640)
    result = target.deployer("rollback", run_id)
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
    assert ownership(target, "pkg/a.py") == (12345, 12346, 0o640)


# -- item 10: a tracked symlink is not a dest --------------------------------------------------------------


def test_a_tracked_symlink_as_dest_is_refused(target: Project) -> None:
    commit_symlink(target, "pkg/alias.py", "a.py")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/alias.py"}])
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "pkg/alias.py" in result.stderr and "symlink" in result.stderr and "pkg/a.py" in result.stderr
    assert tree_snapshot(target.repo) == snapshot
    assert (target.repo / "pkg/alias.py").is_symlink()


# -- item 11: "already applied" is decided against HEAD ----------------------------------------------------


def test_allow_dirty_over_a_file_already_holding_the_shipped_bytes_commits_it(target: Project) -> None:
    (target.repo / "pkg/a.py").write_text(FIXED_A)  # shipped by hand, never committed
    target.write("fix/b.py", FIXED_B)
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                    steps=["upload", {"diff_bounds": {"files": 2}}, {"commit": {"message": "m"}}])
    plan = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)
    result = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty")
    assert result.returncode == 0, result.stderr
    committed = git(target.repo, "diff", "--numstat", "HEAD~1", "HEAD").splitlines()
    assert sorted(line.split("\t")[2] for line in committed) == ["pkg/a.py", "pkg/b.py"]
    assert planned["stat"].startswith("2 files changed")
    assert git(target.repo, "status", "--porcelain") == ""
    assert target.file("pkg/b.py") == FIXED_B and ORIGINAL_B != FIXED_B


# -- item 20: a failed step points into the playbook -------------------------------------------------------


def test_a_step_failure_names_the_playbook_file_and_line_of_the_step(target: Project) -> None:
    path = target.playbook(steps=["upload", {"diff_bounds": {"files": 9}}])
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "diff_bounds" in text)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert f"fix.yaml:{line}:" in result.stderr and "diff_bounds" in result.stderr
