"""`deployer check --host H [PLAYBOOK]` against a real sshd, real services and real metrics: read-only answers."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import ORIGINAL_A, Project, hold_lock, tree_snapshot
from fixtures_services import GAUGE, Stack


def checks(result: Any) -> dict[str, dict[str, Any]]:
    report = json.loads(result.stdout)
    assert report["exit_code"] == result.returncode
    return {c["name"]: c for c in report["checks"]}


def files_but_service_logs(repo: Path) -> dict[str, str]:
    """Every file of the repo (.git included) except the logs the services append their requests to."""
    return {k: v for k, v in tree_snapshot(repo).items() if not k.endswith(".log")}


@pytest.mark.parametrize("target", ["ssh", "local"], indirect=True)
def test_check_on_a_ready_host_answers_every_question_and_exits_0(stack: Stack) -> None:
    stack.start_services()
    project = stack.project
    project.playbook(steps=["local_compile", "upload", {"drain": {"metric": GAUGE, "to": 5}}])
    before = files_but_service_logs(project.repo)
    result = project.deployer("check", "fix.yaml", "--host", "box", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(result)
    assert found["python"]["detail"].endswith(f"Python {platform.python_version()}")
    assert found["repo"]["status"] == "ok"
    assert found["HEAD"]["detail"].startswith(project.head())
    assert found["lock"]["detail"] == "free"
    for name in ("prefill", "decode"):
        assert found[f"service {name}"]["status"] == "ok"
        assert f"pid {stack.pids()[name]} alive" in found[f"service {name}"]["detail"]
        assert "answers 200" in found[f"service {name}"]["detail"]
    assert found["metrics"]["status"] == "ok"
    assert found["metric (drain)"]["detail"] == f"{GAUGE} = 3"
    assert found["dests"]["status"] == "ok"
    assert all(c["status"] != "fail" for c in found.values())
    assert files_but_service_logs(project.repo) == before  # read-only: not one byte changed, .git included
    shown = project.deployer("check", "--host", "box")
    assert shown.returncode == 0 and "box: ready to deploy" in shown.stdout


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_check_exits_1_for_a_service_that_is_down_and_a_metric_that_is_absent(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=["local_compile", "upload", {"drain": {"metric": "no_such_gauge", "to": 0}}])
    result = project.deployer("check", "fix.yaml", "--host", "box", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    found = checks(result)
    assert found["service prefill"]["status"] == "fail"
    assert found["service prefill"]["detail"].startswith("not running")
    assert found["metrics"]["status"] == "fail"  # nothing serves it: the services are down
    assert json.loads(result.stdout)["error"].startswith("service prefill: not running")


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_check_exits_3_and_names_the_holder_when_the_lock_is_held(target: Project) -> None:
    lock = hold_lock(target)
    result = target.deployer("check", "--host", "box", "--json")
    assert result.returncode == 3, result.stdout + result.stderr
    found = checks(result)
    assert found["lock"]["status"] == "fail"
    assert "held by run 20260101T000000.000Z-abcdef of alice@ops" in found["lock"]["detail"]
    # The way out, as apply names it: recover takes the lock of a run that is gone (and refuses a live one).
    assert "end it with: deployer recover 20260101T000000.000Z-abcdef --host box" in found["lock"]["detail"]
    assert lock.is_dir()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_check_exits_4_when_the_host_key_is_not_pinned(target: Project, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    target.write_inventory(known_hosts=str(empty))
    result = target.deployer("check", "--host", "box")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "host key  FAIL" in result.stdout and "auth      skip" in result.stdout
    assert empty.read_text() == ""


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_check_with_a_playbook_exits_2_for_a_dest_git_does_not_track(target: Project) -> None:
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/a.py", "dest": "pkgg/a.py"}])
    result = target.deployer("check", "fix.yaml", "--host", "box", "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    found = checks(result)
    assert "not tracked by git on the target: pkgg/a.py" in found["dests"]["detail"]
    assert not (target.repo / "pkgg").exists()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_check_with_a_playbook_exits_1_when_a_shipped_file_is_dirty_on_the_target(target: Project) -> None:
    (target.repo / "pkg" / "a.py").write_text("local edit\n")
    target.playbook()
    result = target.deployer("check", "fix.yaml", "--host", "box", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pkg/a.py" in checks(result)["dirty files"]["detail"]


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_check_refuses_an_unpinned_host_key_with_the_same_message_as_plan(target: Project, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    target.write_inventory(known_hosts=str(empty))
    target.playbook()
    plan = target.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 4 and plan.stderr.startswith("error: "), plan.stderr
    message = plan.stderr.removeprefix("error: ").strip()
    assert "--accept-new-host-key" in message and "ssh-keygen -lf" in message
    shown = target.deployer("check", "--host", "box")
    assert shown.returncode == 4, shown.stdout + shown.stderr
    assert shown.stderr.removeprefix("error: ").strip() == message
    as_json = target.deployer("check", "--host", "box", "--json")
    assert json.loads(as_json.stdout)["error"] == json.loads(target.deployer("plan", "fix.yaml", "--host", "box",
                                                                             "--json").stdout)["error"]
    # The one thing check writes: the key --accept-new-host-key pins here, said as a notice.
    pinned = target.deployer("check", "--host", "box", "--accept-new-host-key")
    assert pinned.returncode == 0, pinned.stdout + pinned.stderr
    assert "notice: pinned a new host key for" in pinned.stderr and empty.read_text().strip()


@pytest.mark.parametrize("target", ["ssh", "local"], indirect=True)
def test_a_python_the_host_does_not_have_is_a_config_error_naming_its_inventory_line_not_a_lost_link(
        target: Project) -> None:
    target.write_inventory(python="/nonexistent/python3")
    line = next(n for n, text in enumerate(target.inventory.read_text().splitlines(), 1) if "python:" in text)
    target.playbook()
    result = target.deployer("check", "--host", "box", "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    found = checks(result)
    assert found["python"]["status"] == "fail" and found["python"]["exit_code"] == 2
    assert f"`python: /nonexistent/python3` ({target.inventory}:{line}:" in found["python"]["detail"]
    assert "agent lost" not in result.stdout
    shown = target.deployer("check", "--host", "box")
    assert shown.returncode == 2 and "python    FAIL" in shown.stdout, shown.stdout + shown.stderr
    for command in ("plan", "apply"):
        refused = target.deployer(command, "fix.yaml", "--host", "box")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"`python: /nonexistent/python3` ({target.inventory}:{line}:" in refused.stderr
        assert "agent lost" not in refused.stderr and "agent is gone" not in refused.stderr
        assert "recover" not in refused.stderr  # nothing reached the target: no cut run to end
    assert "refused (exit 2)" in refused.stdout  # the apply's: it changed nothing
    assert target.file("pkg/a.py") == ORIGINAL_A
