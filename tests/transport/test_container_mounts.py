"""Where a file shipped into a container lives (from `podman inspect`'s Mounts and Id), against real podman
containers (fixtures_containers): a repo bind-mounted from the host, a repo in the writable layer, and a
container recreated after a run."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures_containers import CONTAINER_REPO, Box, fill_repo
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project

FILES = {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B}
LAYER = "in the container's writable layer: kept across restart, lost when the container is recreated"


def run_box(box: Box, *volumes: str) -> None:
    """box (by its name) running from the host's root as an overlay, with these `-v` mounts."""
    flags = [arg for volume in volumes for arg in ("-v", volume)]
    started = box.podman("run", "-d", "--name", box.name, *flags, "--rootfs", "/:O", "sleep", "infinity",
                         check=False)
    assert started.returncode == 0, started.stderr  # podman itself is there: the podman_env fixture said so


@pytest.fixture
def boxes(podman_env: dict[str, str]) -> Iterator[Callable[..., Box]]:
    """Makes running containers with the given `-v` mounts; each removed by name after the test."""
    made: list[Box] = []

    def make(*volumes: str) -> Box:
        box = Box(f"deployer-test-{uuid.uuid4().hex[:12]}", podman_env)
        made.append(box)
        run_box(box, *volumes)
        return box

    try:
        yield make
    finally:
        for box in made:
            box.remove()


def in_box(target: Project, box: Box) -> Project:
    """target's host with its repo at CONTAINER_REPO in box (the repo's files are not made here)."""
    host = {**target.host, "repo": CONTAINER_REPO, "python": "python3",
            "container": {"engine": "podman", "name": box.name}}
    project = dataclasses.replace(target, repo=Path(CONTAINER_REPO), host=host)
    project.write_inventory()
    return project


def container_id(box: Box) -> str:
    return str(box.podman("inspect", "--format", "{{.ID}}", box.name).stdout.strip())


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_repo_bind_mounted_from_the_host_is_planned_as_bind_and_persist_required_ships(
        target: Project, boxes: Callable[..., Box]) -> None:
    # The target fixture's repo is on the host: mounted into the container, the inspect runs beside the agent
    # (over sshd: its own channel), and the bind's host path is named.
    box = boxes(f"{target.repo}:{CONTAINER_REPO}")
    project = in_box(target, box)
    project.playbook(persist="required")
    planned = project.deployer("plan", "fix.yaml", "--host", "box")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert f"pkg/a.py: bind mount of the host's {target.repo} at {CONTAINER_REPO}: persistent" in planned.stdout
    checked = project.deployer("check", "fix.yaml", "--host", "box")
    row = next(line for line in checked.stdout.splitlines() if " placement " in line)
    assert "ok" in row and f"pkg/a.py: bind mount of the host's {target.repo}" in row, checked.stdout

    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (target.repo / "pkg/a.py").read_text() == FIXED_A, "the host's file is the container's"
    placement = next(e for e in project.events() if e["type"] == "placement")
    assert placement["id"] == container_id(box)
    assert placement["files"] == {"pkg/a.py": {"kind": "bind", "source": str(target.repo), "mount": CONTAINER_REPO}}
    end = next(e for e in project.events() if e["type"] == "run_end")
    assert end["facts"]["placement"]["files"]["pkg/a.py"]["kind"] == "bind"


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_repo_in_the_writable_layer_is_planned_as_layer_and_persist_required_refuses_before_any_change(
        target: Project, boxes: Callable[..., Box]) -> None:
    box = boxes()
    fill_repo(box, FILES)
    project = in_box(target, box)
    project.playbook()
    planned = project.deployer("plan", "fix.yaml", "--host", "box")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert f"pkg/a.py: {LAYER}" in planned.stdout

    before = box.git("rev-parse", "HEAD")
    project.playbook(persist="required")
    checked = project.deployer("check", "fix.yaml", "--host", "box")
    assert checked.returncode == 2, checked.stdout + checked.stderr  # a setting this target cannot meet, as a pod's
    assert "persist: required refuses it" in checked.stdout
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 2, applied.stdout + applied.stderr
    said = " ".join(applied.stderr.split())
    assert "fix.yaml:" in said and "persist: required, but pkg/a.py" in said and "writable layer" in said, said
    assert "nothing was changed" in said
    assert box.read(f"{CONTAINER_REPO}/pkg/a.py") == ORIGINAL_A
    assert box.git("rev-parse", "HEAD") == before
    assert not any(e["type"] == "step_start" for e in project.events()), "no step ran"


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_container_recreated_after_a_run_is_said_by_check_runs_show_and_refused_by_rollback(
        target: Project, boxes: Callable[..., Box]) -> None:
    box = boxes()
    fill_repo(box, FILES)
    project = in_box(target, box)
    run_id = project.applied()
    assert box.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
    old = container_id(box)
    # Recreated as `docker compose up` after an image change does: the same name, a new container from the
    # image (whose checkout is the one before the run).
    box.remove()
    run_box(box)
    fill_repo(box, FILES)
    assert container_id(box) != old

    checked = project.deployer("check", "--host", "box")
    said = " ".join(checked.stdout.split())
    assert f"run {run_id}: container {box.name} was recreated since the run (id {old[:12]} then" in said, said
    assert "the run's files in its writable layer are gone from it (pkg/a.py)" in said

    rolled = project.deployer("rollback", run_id)
    assert rolled.returncode == 2, rolled.stdout + rolled.stderr
    refused = " ".join(rolled.stderr.split())
    assert f"container {box.name} was recreated since the run" in refused, refused
    assert "rollback cannot undo what is no longer there" in refused and "nothing was changed" in refused
    assert box.read(f"{CONTAINER_REPO}/pkg/a.py") == ORIGINAL_A

    shown = project.deployer("runs", "show", run_id)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = " ".join(shown.stdout.split())
    assert f"in podman container {box.name} (id {old[:12]}): pkg/a.py: {LAYER}" in text, text
    assert f"container {box.name} was recreated since the run" in text and "(as run " in text
