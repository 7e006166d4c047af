"""`deployer restart --host UNIT`: a unit's services on two hosts restart as one (stop in reverse unit order,
start in order), through the unit's own restart; each host its own run of kind restart. Real http.server
services; the hosts are local (the ssh path is the single host's, in test_restart.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import ORIGINAL_A, Project, init_repo
from ports import free_port

pytest_plugins = ["fixtures_repo"]


@pytest.fixture
def unit(tmp_path: Path) -> Iterator[Project]:
    """pd-1: prefill on h1, decode on h3, each host its own repo and service."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "health").write_text("ok\n")
    hosts: dict[str, Any] = {}
    for host, service in (("h1", "prefill"), ("h3", "decode")):
        repo = tmp_path / host / "repo"
        init_repo(repo, {"pkg/a.py": ORIGINAL_A})
        port = free_port()
        hosts[host] = {"transport": "local", "repo": str(repo), "python": sys.executable, "services": {service: {
            "start": [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                      str(www)], "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20,
            "stop_grace_s": 5}}}
    project = Project(root=tmp_path, repo=tmp_path / "h1" / "repo", host=hosts["h1"], host_name="h1")
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts, "units": {"pd-1": {
        "services": ["h1:prefill", "h3:decode"], "metrics": "h1"}}}, sort_keys=False))
    yield project
    for host in hosts:
        for pidfile in (tmp_path / host / "repo" / ".git" / "deployer").glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)


def restarted(project: Project) -> dict[str, Any]:
    done = project.deployer("restart", "--host", "pd-1", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def test_restart_of_a_unit_restarts_its_hosts_services_as_one_each_host_a_run_of_kind_restart(
        unit: Project) -> None:
    first = restarted(unit)  # down at first: brought up
    again = restarted(unit)
    assert list(again["hosts"]) == ["h1", "h3"] and again["exit_code"] == 0
    prefill, decode = (unit.events(again["hosts"][h]["run_id"]) for h in ("h1", "h3"))

    def at(events: list[dict[str, Any]], kind: str) -> str:
        return str(next(e["time"] for e in events if e["type"] == kind))
    assert at(decode, "service_stopped") <= at(prefill, "service_stopped") <= at(prefill, "service_started") \
        <= at(decode, "service_started")
    for events, service, host in ((prefill, "prefill", "h1"), (decode, "decode", "h3")):
        pids = next(e for e in events if e["type"] == "restart")["pids"]
        assert pids[service]["old"] == first["hosts"][host]["facts"]["pids"][service]["new"] != pids[service]["new"]
        assert next(e for e in events if e["type"] == "run_start")["kind"] == "restart"
    listed = json.loads(unit.deployer("runs", "list", "--json").stdout)["runs"]
    assert [r["kind"] for r in listed] == ["restart"] * 4
