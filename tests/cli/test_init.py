"""`deployer init`: a playbook written from a local clone ships exactly the local change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures_repo import FIXED_A, Project, git

FIXED_B = "VALUE = 2\nOTHER = 3\n"


def clone(target: Project) -> Path:
    local = target.root / "clone"
    git(target.root, "clone", "-q", str(target.repo), str(local))
    git(local, "config", "user.email", "dev@example.invalid")
    git(local, "config", "user.name", "dev")
    return local


def edit(local: Path, rel: str, text: str) -> None:
    (local / rel).parent.mkdir(parents=True, exist_ok=True)
    (local / rel).write_text(text)


def local_diff(local: Path, *base: str) -> str:
    """The local change as git shows it (new files included, through a throwaway index)."""
    env_index = local / ".git" / "deployer-test-index"
    env = {**os.environ, "GIT_INDEX_FILE": str(env_index)}
    subprocess.run(["git", "-C", str(local), "read-tree", "HEAD"], env=env, check=True)
    subprocess.run(["git", "-C", str(local), "add", "-A"], env=env, check=True)
    return subprocess.run(["git", "-C", str(local), "diff", "--cached", *(base or ("HEAD",))], env=env, check=True,
                          capture_output=True, text=True).stdout


def loaded(path: Path) -> dict[str, object]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("target", ["local"], indirect=True)
@pytest.mark.parametrize("as_patch", [False, True], ids=["files", "patch"])
def test_init_from_two_edited_files_applies_exactly_the_local_diff(target: Project, as_patch: bool) -> None:
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    edit(local, "pkg/b.py", FIXED_B)
    made = target.deployer("init", "--from", str(local), "-o", "out/fix.yaml", "--message", "pkg: answer 42",
                           *(["--patch"] if as_patch else []))
    assert made.returncode == 0, made.stderr
    playbook = target.root / "out" / "fix.yaml"
    text = playbook.read_text()
    assert text.startswith(f"# Written by `deployer init` from {local.resolve()}")
    body = loaded(playbook)
    steps = body["steps"]
    assert isinstance(steps, list)
    assert {"diff_bounds": {"files": 2, "insertions": [5, 9], "deletions": [0, 4]}}  # measured +7 -2 in steps
    if as_patch:
        assert body["patch"] == "fix.diff"
    else:
        assert body["files"] == [{"src": "fix/pkg/a.py", "dest": "pkg/a.py"},
                                 {"src": "fix/pkg/b.py", "dest": "pkg/b.py"}]
        assert (target.root / "out" / "fix" / "pkg" / "b.py").read_text() == FIXED_B
    plan = target.deployer("plan", "out/fix.yaml", "--host", "box")
    assert plan.returncode == 0 and "bounds: ok" in plan.stdout, plan.stdout + plan.stderr
    applied = target.deployer("apply", "out/fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert git(target.repo, "diff", "HEAD~1", "HEAD") == local_diff(local)
    assert git(target.repo, "log", "-1", "--format=%s") == "pkg: answer 42\n"


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_init_from_a_commit_range_takes_the_message_from_the_commit_and_marks_new_files_create(
        target: Project) -> None:
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    edit(local, "pkg/new_module.py", "def helper():\n    return 1\n")
    git(local, "add", "-A")
    git(local, "commit", "-q", "-m", "pkg: answer 42 with a helper")
    edit(local, "pkg/b.py", FIXED_B)  # uncommitted: not in the range
    made = target.deployer("init", "--from", str(local), "--base", "HEAD~1..HEAD", "-o", "range.yaml", "--json")
    assert made.returncode == 0, made.stdout + made.stderr
    assert json.loads(made.stdout)["message"] == "pkg: answer 42 with a helper"
    body = loaded(target.root / "range.yaml")
    assert body["files"] == [{"src": "range/pkg/a.py", "dest": "pkg/a.py"},
                             {"src": "range/pkg/new_module.py", "dest": "pkg/new_module.py", "create": True}]
    assert {"commit": {"message": "pkg: answer 42 with a helper"}} in body["steps"]  # type: ignore[operator]
    applied = target.deployer("apply", "range.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert git(target.repo, "diff", "HEAD~1", "HEAD") == git(local, "diff", "HEAD~1", "HEAD")


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_init_with_a_host_adds_co_restart_and_with_a_metric_baseline_and_drain(target: Project) -> None:
    service = {"start": [sys.executable, "-c", "pass"], "health": "http://127.0.0.1:9/health"}
    target.write_inventory(services={"web": service, "worker": {"start": "true"}},
                           metrics="http://127.0.0.1:9/metrics")
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    made = target.deployer("init", "--from", str(local), "--host", "box", "--metric", "queue_depth",
                           "-o", "svc.yaml")
    assert made.returncode == 0, made.stderr
    body = loaded(target.root / "svc.yaml")
    steps = body["steps"]
    assert steps[0] == {"baseline": {"metric": "queue_depth"}}  # type: ignore[index]
    assert {"co_restart": {"services": ["web", "worker"]}} in steps  # type: ignore[operator]
    assert steps[-1] == {"drain": {"metric": "queue_depth", "to": 0, "within_s": 60}}  # type: ignore[index]
    assert body["on_failure"] == "rollback"
    plan = target.deployer("plan", "svc.yaml", "--host", "box")  # it loads, and fits the host and the change
    assert plan.returncode == 0 and "bounds: ok" in plan.stdout, plan.stdout + plan.stderr
    assert "start web" in plan.stdout and "queue_depth" in plan.stdout


@pytest.mark.parametrize("target", ["local"], indirect=True)
@pytest.mark.parametrize(("change", "said"), [
    ("delete", "pkg/b.py: deleted"),
    ("binary", "pkg/blob.bin: a binary file"),
    ("symlink", "pkg/link.py: resolves outside the repo (/etc/hostname)"),
    ("nothing", "no changes against HEAD"),
])
def test_init_refuses_what_it_cannot_ship_with_exit_2(target: Project, change: str, said: str) -> None:
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    if change == "delete":
        (local / "pkg" / "b.py").unlink()
    elif change == "binary":
        (local / "pkg" / "blob.bin").write_bytes(b"\x00\x01binary")
    elif change == "symlink":
        os.symlink("/etc/hostname", local / "pkg" / "link.py")
    else:
        git(local, "checkout", "--", "pkg/a.py")
    made = target.deployer("init", "--from", str(local), "-o", "x.yaml")
    assert made.returncode == 2, made.stdout + made.stderr
    assert said in made.stderr
    assert not (target.root / "x.yaml").exists() and not (target.root / "x").exists()


@pytest.mark.parametrize("target", ["local"], indirect=True)
@pytest.mark.parametrize("change", ["adds", "turns_a_file_into"])
def test_init_refuses_a_commit_range_that_ships_a_symlink_with_exit_2_naming_it(target: Project, change: str) -> None:
    # The link points inside the repo, so only the mode 120000 in the range's diff can refuse it: the work tree's
    # own symlink check never runs for a range.
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    link = local / "pkg" / ("link.py" if change == "adds" else "b.py")
    if change != "adds":
        link.unlink()
    os.symlink("a.py", link)
    git(local, "add", "-A")
    git(local, "commit", "-q", "-m", "pkg: a symlink rides along")
    made = target.deployer("init", "--from", str(local), "--base", "HEAD~1..HEAD", "-o", "x.yaml")
    assert made.returncode == 2, made.stdout + made.stderr
    rel = link.relative_to(local).as_posix()
    assert f"{rel}: a symlink" in made.stderr, made.stderr
    assert not (target.root / "x.yaml").exists() and not (target.root / "x").exists()


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_init_never_overwrites_an_existing_playbook(target: Project) -> None:
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    target.write("fix.yaml", "mine\n")
    made = target.deployer("init", "--from", str(local))
    assert made.returncode == 2 and "exists already" in made.stderr
    assert (target.root / "fix.yaml").read_text() == "mine\n"


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_init_with_a_host_endpoint_storms_in_the_baseline_and_before_the_drain(target: Project) -> None:
    service = {"start": [sys.executable, "-c", "pass"], "health": "http://127.0.0.1:9/health"}
    target.write_inventory(services={"web": service}, metrics="http://127.0.0.1:9/metrics",
                           endpoint="http://127.0.0.1:9")
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    made = target.deployer("init", "--from", str(local), "--host", "box", "--metric", "queue_depth", "-o", "s.yaml")
    assert made.returncode == 0, made.stderr
    steps = loaded(target.root / "s.yaml")["steps"]
    assert isinstance(steps, list)
    assert steps[0] == {"baseline": {"metric": "queue_depth", "storm": True}}
    assert steps[-2:] == ["storm", {"drain": {"metric": "queue_depth", "to": 0, "within_s": 60}}]
    assert steps.index({"co_restart": {"services": ["web"]}}) < steps.index("storm")
    assert "WARNING" not in (target.root / "s.yaml").read_text() and "no storm" not in made.stdout
    plan = target.deployer("plan", "s.yaml", "--host", "box")
    assert plan.returncode == 0 and "bounds: ok" in plan.stdout, plan.stdout + plan.stderr


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_init_without_an_endpoint_warns_in_the_playbook_and_the_output_that_the_drain_proves_nothing(
        target: Project) -> None:
    target.write_inventory(metrics="http://127.0.0.1:9/metrics")
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    made = target.deployer("init", "--from", str(local), "--host", "box", "--metric", "queue_depth", "-o", "w.yaml")
    assert made.returncode == 0, made.stderr
    text = (target.root / "w.yaml").read_text()
    assert "# WARNING: no storm: the host has no `endpoint`" in text and "proves nothing" in text
    assert "note: no storm: the host has no `endpoint`" in made.stdout
    assert "storm" not in yaml.safe_dump(loaded(target.root / "w.yaml")["steps"])


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_init_names_the_given_host_in_its_next_step_and_says_a_placeholder_message_is_one(target: Project) -> None:
    local = clone(target)
    edit(local, "pkg/a.py", FIXED_A)
    made = target.deployer("init", "--from", str(local), "--host", "box", "-o", "kv.yaml")
    assert made.returncode == 0, made.stderr
    assert "next: deployer plan kv.yaml --host box" in made.stdout and "HOST" not in made.stdout
    assert "#   deployer plan kv.yaml --host box\n" in (target.root / "kv.yaml").read_text()
    assert (target.root / "kv" / "pkg" / "a.py").read_text() == FIXED_A  # beside it, named after it
    assert {"commit": {"message": "hotfix: pkg/a.py"}} in loaded(target.root / "kv.yaml")["steps"]  # type: ignore[operator]
    assert "note: the commit message is 'hotfix: pkg/a.py' (uncommitted work has no subject" in made.stdout
