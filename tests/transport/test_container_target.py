"""A host whose repo lives in a container: the agent runs through `<engine> exec -i` over the host's own
transport (locally, and over the real sshd), against a real podman container (fixtures_containers)."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from fixtures_containers import CONTAINER_REPO, PODMAN_DOCKER, Box, fill_repo
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project
from polling import wait_for

FILES = {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B}


def in_container(target: Project, box: Box, **container: Any) -> Project:
    """target's host (local or over sshd) with its repo and python those of box."""
    fill_repo(box, FILES)
    host = {**target.host, "repo": CONTAINER_REPO, "python": "python3",
            "container": {"engine": "podman", "name": box.name, **container}}
    project = dataclasses.replace(target, repo=Path(CONTAINER_REPO), host=host)
    project.write_inventory()
    return project


def test_apply_ships_into_the_containers_repo_and_rollback_undoes_it(target: Project, container: Box) -> None:
    project = in_container(target, container)
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert container.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
    assert container.git("log", "-1", "--format=%s").strip() == "pkg: answer is 42"
    assert not Path(CONTAINER_REPO).exists(), "the host itself is untouched"
    run_id = project.newest_run()
    connected = next(e for e in project.events(run_id) if e["type"] == "connected")
    assert connected["transport"]["kind"] == target.host["transport"]
    assert connected["transport"]["extra"]["container"] == container.name
    assert connected["transport"]["extra"]["engine"] == "podman"

    rolled = project.deployer("rollback", run_id)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert container.read(f"{CONTAINER_REPO}/pkg/a.py") == ORIGINAL_A


def test_a_run_cut_after_its_commit_is_recovered_in_the_container(target: Project, container: Box) -> None:
    project = in_container(target, container)
    marker, git_dir = "/srv/post-commit.reached", f"{CONTAINER_REPO}/.git"
    # The post-commit hook blocks (in the container) once git made the commit: the deployer is killed there.
    container.sh(f"printf '#!/bin/sh\\necho $$ > {marker}\\nwhile :; do sleep 0.05; done\\n' "
                 f"> {git_dir}/hooks/post-commit && chmod +x {git_dir}/hooks/post-commit")
    before = container.git("rev-parse", "HEAD").strip()
    project.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42", "hooks": True}}])
    proc = project.popen("apply", "fix.yaml", "--host", "box")
    try:
        wait_for(lambda: container.read(marker) or proc.poll() is not None, "the post-commit hook")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        container.sh(f"kill -9 $(cat {marker}) 2>/dev/null || true")
    run = sorted(project.runs.iterdir())[0]
    # recover takes over only a stale lock: the killed run's heartbeat, backdated (its agent has exited).
    container.sh(f"touch -d '2 days ago' {git_dir}/deployer.run.lock/heartbeat")
    recovered = project.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert json.loads((run / "state.json").read_text())["phase"] == "failed_committed"
    assert container.git("rev-parse", "HEAD~1").strip() == before
    assert f"Deployer-Run: {run.name}" in container.git("log", "-1", "--format=%B")
    assert container.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
    assert container.read(f"{git_dir}/deployer/inflight.json") is None, "the intent record is still there"
    assert container.sh(f"test -e {git_dir}/deployer.run.lock && echo held || true") == "", "the lock is still there"


def test_check_reports_the_container_the_agent_runs_in(target: Project, container: Box) -> None:
    project = in_container(target, container)
    checked = project.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    row = next(line for line in checked.stdout.splitlines() if " container " in line)
    assert "ok" in row and f"podman container {container.name}" in row
    assert f"repo         ok      {CONTAINER_REPO}" in checked.stdout


def test_a_stopped_container_is_exit_4_naming_it_in_check_and_apply(target: Project, container: Box) -> None:
    project = in_container(target, container)
    container.stop()
    checked = project.deployer("check", "--host", "box")
    assert checked.returncode == 4, checked.stdout + checked.stderr
    # The check's row points at the error, which is said once, on stderr.
    assert f"the podman container {container.name!r} is not running" in checked.stderr
    assert "see the error below" in checked.stdout
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 4, applied.stdout + applied.stderr
    assert f"the podman container {container.name!r} is not running" in applied.stderr


def test_a_missing_engine_is_exit_4_naming_it_and_the_container(target: Project, container: Box,
                                                                tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dir" / "podman")
    project = in_container(target, container, engine_path=missing)
    checked = project.deployer("check", "--host", "box")
    assert checked.returncode == 4, checked.stdout + checked.stderr
    said = f"the container engine podman ({missing}) is not installed on the host, so container {container.name!r}"
    assert said in checked.stderr and "see the error below" in checked.stdout
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 4, applied.stdout + applied.stderr
    assert said in applied.stderr


def test_engine_docker_runs_through_podman_docker(target: Project, container: Box) -> None:
    project = in_container(target, container, engine="docker", engine_path=PODMAN_DOCKER)
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert container.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
    connected = next(e for e in project.events() if e["type"] == "connected")
    assert connected["transport"]["extra"]["engine_command"] == PODMAN_DOCKER


@pytest.mark.parametrize(("container_field", "said"), [
    ({"engine": "rkt", "name": "x"}, "engine"),
    ({"engine": "podman", "name": "-x"}, "name"),
    ({"engine": "podman", "name": "x", "engine_path": "bin/podman"}, "engine_path"),
])
def test_a_bad_container_field_is_a_config_error_naming_it(target: Project, container_field: dict[str, str],
                                                           said: str) -> None:
    target.write_inventory(container=container_field)
    checked = target.deployer("check", "--host", "box")
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "hosts.yaml:" in checked.stderr and f"container.{said}" in checked.stderr
