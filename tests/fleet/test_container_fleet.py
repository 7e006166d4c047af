"""Containers as the hosts of a fleet: real podman containers, each a host's target, reached through the real
sshd (fixtures_containers, fixtures_ssh)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_containers import CONTAINER_REPO, Box, fill_repo
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project

BOXES = ("c1", "c2")
FILES = {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B}


@pytest.fixture
def two_containers(podman_env: dict[str, str]) -> Iterator[dict[str, Box]]:
    """Two running containers (PID 1 a `sleep`), one per fleet host; removed by name after, even on failure."""
    boxes = {host: Box(f"deployer-test-{uuid.uuid4().hex[:12]}", podman_env) for host in BOXES}
    try:
        for box in boxes.values():
            box.podman("run", "-d", "--name", box.name, "--rootfs", "/:O", "sleep", "infinity")
        yield boxes
    finally:
        for box in boxes.values():
            box.remove()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_one_apply_of_a_fleet_of_containers_ships_into_each_and_verifies_each_host(
        target: Project, two_containers: dict[str, Box]) -> None:
    hosts: dict[str, Any] = {}
    for host, box in two_containers.items():
        fill_repo(box, FILES)
        hosts[host] = {**target.host, "repo": CONTAINER_REPO, "python": "python3",
                       "container": {"engine": "podman", "name": box.name}}
    target.inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"boxes": list(BOXES)}}, sort_keys=False))
    target.playbook()
    result = target.deployer("apply", "fix.yaml", "--host", "boxes", "--parallel", "2", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["status"] == "successful", result.stdout + result.stderr
    assert list(report["hosts"]) == list(BOXES)
    for host, box in two_containers.items():
        sub = report["hosts"][host]
        assert sub["status"] == "successful", sub
        assert box.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
        assert f"Deployer-Run: {sub['run_id']}" in box.git("log", "-1", "--format=%B")
        connected = next(e for e in target.events(sub["run_id"]) if e["type"] == "connected")
        assert connected["host"] == host and connected["transport"]["extra"]["container"] == box.name
    assert not Path(CONTAINER_REPO).exists(), "the host itself is untouched"
    # Each host's run log checked against its target: the commit and the files in that host's container.
    verified = target.deployer("runs", "verify", report["fleet_id"])
    assert verified.returncode == 0, verified.stdout + verified.stderr
