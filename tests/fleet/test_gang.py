"""A gang unit: one server whose ranks run on two hosts (the demo stack's `--nnodes 2 --node-rank N
--dist-init-addr`), stopped together and started at once, healthy when its leader (rank 0, the only one with an
HTTP port) is; a rank that dies during the start gets every member stopped and is named."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import ORIGINAL_A, Project, init_repo
from fixtures_services import free_port, wait_dead

from deployer.demo.run import STACK

HOSTS = ("h1", "h2")


def rank(stack: Path, n: int, port: int, rendezvous: int, **env: str) -> dict[str, Any]:
    """Rank n of one demo decode server over two nodes; rank 0 alone has an HTTP port (and a health URL)."""
    argv = [sys.executable, "-m", "sglang.launch_server", "--disaggregation-mode", "decode", "--port", str(port),
            "--nnodes", "2", "--node-rank", str(n), "--dist-init-addr", f"127.0.0.1:{rendezvous}"]
    service: dict[str, Any] = {"start": argv, "stop_grace_s": 2, "env": {
        "PYTHONPATH": str(stack), "SGLANG_DEMO_STARTUP_S": "0.05", "PYTHONDONTWRITEBYTECODE": "1", **env}}
    if n == 0:
        service.update(health=f"http://127.0.0.1:{port}/health", health_timeout_s=20)
    return service


@pytest.fixture(params=["local", "ssh"])
def gang(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Project, dict[str, Any]]]:
    """Unit g1: rank0 on h1, rank1 on h2, a gang led by h1:rank0; the inventory is rewritten by each test."""
    copy = tmp_path / "stack"
    shutil.copytree(STACK, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    hosts: dict[str, Any] = {}
    for name in HOSTS:
        repo = tmp_path / name / "repo"
        init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
        hosts[name] = {"repo": str(repo), "python": sys.executable, "transport": "local"}
        if request.param == "ssh":
            sshd = request.getfixturevalue("sshd")
            hosts[name].update(transport="ssh", address=sshd.host, port=sshd.port, user=sshd.user,
                               identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts),
                               ssh_config="/dev/null")
    port, rendezvous = free_port(), free_port()
    hosts["h1"]["services"] = {"rank0": rank(copy / "python", 0, port, rendezvous)}
    hosts["h2"]["services"] = {"rank1": rank(copy / "python", 1, port, rendezvous)}
    project = Project(root=tmp_path, repo=tmp_path / "h1" / "repo", host=hosts["h1"], host_name="h1")
    inventory = {"hosts": hosts, "units": {"g1": {"services": ["h1:rank0", "h2:rank1"], "gang": True,
                                                  "leader": "h1:rank0"}}}
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    yield project, inventory
    for name in HOSTS:
        for pidfile in (tmp_path / name / "repo" / ".git" / "deployer").glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)


def pid(project: Project, host: str, service: str) -> int:
    return int((project.root / host / "repo" / ".git" / "deployer" / f"{service}.pid").read_text())


def events(project: Project, host: str) -> list[dict[str, Any]]:
    runs = sorted(project.runs.iterdir(), key=lambda p: p.stat().st_mtime)
    logs = [r / "events.jsonl" for r in runs if (r / "events.jsonl").exists()]
    mine = [log for log in logs if f'"host": "{host}"' in log.read_text()]
    return project.events(mine[-1].parent.name)


def test_a_gang_of_two_ranks_on_two_hosts_restarts_together_healthy_from_its_leader(
        gang: tuple[Project, dict[str, Any]]) -> None:
    project, _ = gang
    first = project.deployer("restart", "--host", "g1")  # one after the other, rank 0 would wait for rank 1 forever
    assert first.returncode == 0, first.stdout + first.stderr
    before = {"rank0": pid(project, "h1", "rank0"), "rank1": pid(project, "h2", "rank1")}
    again = project.deployer("restart", "--host", "g1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert wait_dead(before["rank0"]) and wait_dead(before["rank1"])
    leader, follower = events(project, "h1"), events(project, "h2")
    for log, service in ((leader, "rank0"), (follower, "rank1")):
        [restart] = [e for e in log if e["type"] == "restart"]
        assert restart["pids"][service]["old"] == before[service] != restart["pids"][service]["new"]
        assert restart["unit"] == "g1"
    # health is asked of the leader only; the other rank is up once its process runs
    assert [e for e in leader if e.get("action") == "rank0.up_health"]
    assert not [e for e in follower if "health" in str(e.get("action", ""))]
    # started together: rank 1 was started before rank 0 was healthy (rank 0 cannot be healthy without it)
    started = next(e["time"] for e in follower if e["type"] == "service_phase" and e["phase"] == "starting")
    healthy = next(e["time"] for e in leader if e["type"] == "service_healthy")
    assert started <= healthy


def test_a_rank_that_dies_at_start_gets_every_member_stopped_and_the_failure_names_it(
        gang: tuple[Project, dict[str, Any]]) -> None:
    project, inventory = gang
    started = project.deployer("restart", "--host", "g1")
    assert started.returncode == 0, started.stdout + started.stderr
    service = inventory["hosts"]["h2"]["services"]["rank1"]
    service["env"]["SGLANG_DEMO_RANK_CRASH_S"] = "0.3"  # NCCL init fails on node 1; node 0 waits on
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    failed = project.deployer("restart", "--host", "g1")
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert "gang member h2:rank1 failed" in failed.stderr and "exited" in failed.stderr
    assert "stopped every member of the gang (h1:rank0, h2:rank1)" in failed.stderr
    assert "NCCL init failed" in failed.stderr  # the dead rank's own output
    # nothing of the gang is left running: rank 0 did not stay behind waiting at the rendezvous
    assert wait_dead(pid(project, "h1", "rank0")) and wait_dead(pid(project, "h2", "rank1"))


def test_a_gang_whose_leader_is_not_one_of_its_members_is_refused_naming_the_line(
        gang: tuple[Project, dict[str, Any]]) -> None:
    project, inventory = gang
    inventory["units"]["g1"]["leader"] = "h2:rank0"
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    refused = project.deployer("restart", "--host", "g1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "hosts.yaml:" in refused.stderr and "leader 'h2:rank0' is not one of the unit's services" in refused.stderr
