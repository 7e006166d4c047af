"""Bad playbooks and inventories: exit 2, file:line:column and the field, before any connection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures_repo import ORIGINAL_A, Project, tree_snapshot

from deployer.config.models import load_inventory
from deployer.errors import ConfigError
from deployer.steps.playbook import load_playbook


def write(tmp_path: Path, text: str, name: str = "fix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    (tmp_path / "a.py").write_text("x = 1\n")
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_playbook(path)
    return str(caught.value)


def test_unknown_key_names_file_line_column_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles:\n  - src: a.py\n    dest: a.py\n    mode: 644\nsteps: [upload]\n")
    assert error_of(path) == f"{path}:5:5: files.0.mode: unknown key"


def test_bad_type_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps:\n"
                           "  - diff_bounds: {files: many}\n")
    message = error_of(path)
    assert message.startswith(f"{path}:4:26: steps.0.diff_bounds.files:")


@pytest.mark.parametrize("dest, why", [("/etc/passwd", "not absolute"), ("../outside.py", "'..'"),
                                       ("pkg/../../x.py", "'..'"), (".git/hooks/post-commit", ".git")])
def test_dest_escaping_the_repo_is_refused(tmp_path: Path, dest: str, why: str) -> None:
    path = write(tmp_path, f"name: x\nfiles:\n  - src: a.py\n    dest: {dest}\nsteps: [upload]\n")
    message = error_of(path)
    assert f"{path}:4:11: files.0.dest:" in message and why in message


def test_object_constructing_tags_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "name: !!python/object/apply:os.system ['touch pwned']\nsteps: [upload]\n")
    assert "tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed" in error_of(path)
    assert not (tmp_path / "pwned").exists()


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nname: y\nsteps: [upload]\n")
    assert error_of(path) == f"{path}:2:1: duplicate key 'name'"


def test_yaml_syntax_error_has_a_position(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nsteps: [upload\n")
    assert error_of(path).startswith(f"{path}:3:1: invalid YAML")


def test_unknown_step_kind(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps:\n  - upload\n  - deploy_it\n")
    message = error_of(path)
    assert message.startswith(f"{path}:5:5: steps.1: unknown step kind 'deploy_it'") and "known:" in message


def test_files_and_patch_are_exclusive(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\npatch: p.diff\nsteps: [upload]\n")
    assert "exactly one of 'files' or 'patch'" in error_of(path)


def test_missing_source_file_points_at_src(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles:\n  - src: nope.py\n    dest: a.py\nsteps: [upload]\n")
    assert error_of(path).startswith(f"{path}:3:10: files.0.src: cannot read")


def test_inventory_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  h:\n    repo: relative/path\n    host_key_policy: trust-all\n",
                 "hosts.yaml")
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    lines = sorted(str(caught.value).splitlines())
    assert lines[0].startswith(f"{path}:3:11: hosts.h.repo: must be an absolute path")
    assert lines[1] == f"{path}:4:22: hosts.h.host_key_policy: must be 'reject' or 'accept-new', got 'trust-all'"


def test_service_needs_exactly_one_manager(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  h:\n    repo: /r\n    services:\n      prefill: {health: http://x}\n",
                 "hosts.yaml")
    with pytest.raises(ConfigError, match=r"hosts.yaml:5:16: hosts.h.services.prefill: .*exactly one of 'start'"):
        load_inventory(path)


def test_cli_config_errors_exit_2_before_connecting(target: Project) -> None:
    target.write("fix.yaml", "name: x\nfiles:\n  - {src: fix/a.py, dest: ../escape.py}\nsteps: [upload]\n")
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 2
    assert "fix.yaml:3:27: files.0.dest:" in result.stderr
    assert not target.runs.exists()  # refused before a run (and a connection) started
    missing = target.deployer("apply", "fix.yaml", "--host", "nope")
    assert missing.returncode == 2


def test_inventory_lookup_order(target: Project, tmp_path: Path) -> None:
    target.playbook()
    target.extra_env["DEPLOYER_INVENTORY"] = str(tmp_path / "absent.yaml")
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2 and "$DEPLOYER_INVENTORY" in result.stderr
    explicit = target.deployer("plan", "fix.yaml", "--host", "box", "-i", str(target.inventory))
    assert explicit.returncode == 0, explicit.stderr


def test_symlink_escaping_the_repo_is_refused_on_the_target(target: Project, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, target.repo / "pkg" / "link")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/link/a.py"}], steps=["upload"])
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1
    assert "outside the repo" in result.stderr
    assert list(outside.iterdir()) == []
    assert tree_snapshot(target.repo) == snapshot
    assert target.file("pkg/a.py") == ORIGINAL_A


@pytest.mark.parametrize("steps, where, message", [
    ("[upload, co_restart, {commit: {message: m}}]", "2:17", "co_restart must come after commit"),
    ("[upload, local_compile]", "2:17", "local_compile must come before upload"),
    ("[remote_compile, upload]", "2:9", "remote_compile must come after upload"),
])
def test_step_orders_that_would_defeat_the_restore_are_refused(tmp_path: Path, steps: str, where: str,
                                                                message: str) -> None:
    path = write(tmp_path, f"name: x\nsteps: {steps}\nfiles: [{{src: a.py, dest: a.py}}]\n")
    assert error_of(path).startswith(f"{path}:{where}: {message}")


def test_restart_only_playbooks_have_no_order_constraint(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps: [co_restart]\n")
    _, steps = load_playbook(path)
    assert [s.kind for s in steps] == ["co_restart"]


def test_steps_that_need_host_facts_fail_before_connecting(target: Project) -> None:
    target.playbook(steps=[{"baseline": {"metric": "m"}}, {"storm": {"requests": 5}},
                           {"co_restart": {"services": ["nosuch"]}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert "fix.yaml:6:3: baseline: no metrics URL" in lines[0]
    assert "fix.yaml:8:3: storm: no storm URL" in lines[1]
    assert "fix.yaml:10:3: co_restart: host box defines no service nosuch" in lines[2]
    assert not target.runs.exists()


def test_an_unknown_key_suggests_the_key_it_was_likely_meant_to_be(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps: [upload]\non_falure: rollback\n")
    assert error_of(path) == f"{path}:4:1: on_falure: unknown key (did you mean 'on_failure'?)"
    step = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps:\n  - drain: {metric: m, too: 0}\n")
    assert "steps.0.drain.too: unknown key (did you mean 'to'?)" in error_of(step)
    far = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps: [upload]\nzzz: 1\n")
    assert error_of(far) == f"{far}:4:1: zzz: unknown key"  # nothing close: no guess
    inventory = write(tmp_path, "hosts:\n  h:\n    repo: /r\n    adress: x\n", "hosts.yaml")
    with pytest.raises(ConfigError) as caught:
        load_inventory(inventory)
    assert str(caught.value) == f"{inventory}:4:5: hosts.h.adress: unknown key (did you mean 'address'?)"


def error_positions(path: Path) -> list[tuple[int, ...]]:
    """The line:column of each problem the inventory at path is refused with, in the order printed."""
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    lines = str(caught.value).splitlines()
    return [tuple(int(n) for n in line.removeprefix(f"{path}:").split(":")[:2]) for line in lines]


def test_inventory_errors_come_in_the_order_of_their_lines(tmp_path: Path) -> None:
    fields = write(tmp_path, "hosts:\n  b:\n    python: 3\n    repo: relative\n  a:\n    port: x\n", "hosts.yaml")
    topology = write(tmp_path, "hosts:\n  b: {repo: /r}\n  a: {repo: /r}\ngroups:\n  b: [a]\n  g: [nope]\n"
                               "units:\n  a: {services: [a:x]}\n", "topology.yaml")
    for path in (fields, topology):  # the model's field order, and the order the topology checks run in
        positions = error_positions(path)
        assert len(positions) >= 3 and positions == sorted(positions), positions


@pytest.mark.parametrize("data", [b"\x00\x01binary", b"caf\xe9 = 1\n"], ids=["nul", "latin-1"])
def test_a_binary_src_is_named_and_refused_as_a_usage_error(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path, "name: x\nfiles:\n  - src: blob.py\n    dest: a.py\nsteps: [upload]\n")
    (tmp_path / "blob.py").write_bytes(data)
    with pytest.raises(ConfigError) as caught:
        load_playbook(path)
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith(f"{path}:3:10: files.0.src: {tmp_path / 'blob.py'} is a binary file (")
    assert "codec" not in str(caught.value)


def test_a_src_over_16_mib_is_refused_by_its_size_before_it_is_read_and_the_target_is_untouched(
        target: Project) -> None:
    big = target.root / "fix" / "big.py"
    big.touch()
    os.truncate(big, 50 << 20)  # sparse: reading it would cost 50 MB, stating it nothing
    target.playbook(files=[{"src": "fix/big.py", "dest": "pkg/a.py"}])
    snapshot, head = tree_snapshot(target.repo), target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    assert (f"fix.yaml:3:8: files.0.src: fix/big.py is {50 << 20:,} bytes, over the 16 MiB ({16 << 20:,} bytes) "
            "a shipped file may have") in result.stderr, result.stderr
    assert tree_snapshot(target.repo) == snapshot and target.head() == head
    assert not target.runs.exists()  # refused before a run (and a connection) started


def test_a_services_own_log_is_an_absolute_path_and_needs_a_start_command(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  h:\n    repo: /r\n    services:\n"
                           "      a: {start: [serve], log: /var/log/a.log}\n"
                           "      b: {start: [serve], log: logs/b.log}\n"
                           "      c: {systemd: c.service, log: /var/log/c.log}\n", "hosts.yaml")
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    said = str(caught.value)
    assert "hosts.h.services.b.log: must be an absolute path" in said
    assert "hosts.h.services.c: 'log' needs 'start'" in said
    assert "services.a" not in said
