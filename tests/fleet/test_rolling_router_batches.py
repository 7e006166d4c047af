"""Rolling PD units behind their router, several at a time (`max_unavailable`), and the connection to the
router's host one fleet run shares among its units (split from test_rolling_router.py, whose fixtures and stacks
these reuse, so that the suite's workers share the long rolling runs)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import deployer
from fixtures_ssh import SSHD, session_sshd
from polling import wait_for, within
from test_rolling_router import PLAYBOOK, UNITS, PdFleet, listed_healthy, load_through, make_fleet, running

from deployer.app.applies import ApplyOptions, apply
from deployer.demo.run import process_alive
from deployer.steps.context import Listener

THREE = {**UNITS, "pd-3": ("gpu-e", "gpu-f")}


def test_max_unavailable_restarts_two_pd_units_at_once_keeping_one_serving_and_no_request_fails(
        tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path, pd_units=THREE)
    (tmp_path / "note.yaml").write_text(yaml.safe_dump(
        {**PLAYBOOK, "rollout": {"strategy": "rolling", "max_unavailable": 2}}, sort_keys=False))
    shown = deployer("plan", "note.yaml", "--host", "pd-1,pd-2,pd-3", cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "batch 1: pd-1, pd-2 — router pd-router keeps prefill 1/3, decode 1/3" in shown.stdout, shown.stdout
    assert "batch 2: pd-3 — router pd-router keeps prefill 2/3, decode 2/3" in shown.stdout
    assert "router pd-router cannot tell a patched worker from an unpatched one" in shown.stdout
    with running(fleet):
        before = fleet.pids()
        with load_through(fleet, "the apply") as load:
            code, report, output = fleet.apply("pd-1,pd-2,pd-3")
        assert code == 0, output
        assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
        # 2 of 3 units at once: the third keeps a prefill and a decode behind the router
        assert report["batches"] == [["gpu-a", "gpu-b", "gpu-c", "gpu-d"], ["gpu-e", "gpu-f"]]
        after = fleet.pids()
        assert all(after[host][service] != pid for host, pids in before.items() for service, pid in pids.items()
                   if service != "router")
        times = {unit: [e["time"] for e in fleet.events(report, prefill) if e.get("unit") == unit
                        and e["type"] in ("router_remove", "router_listed")]
                 for unit, (prefill, _) in THREE.items()}
        # pd-2 left the router before pd-1 came back to it, and pd-3 only after both had
        assert min(times["pd-2"]) < max(times["pd-1"]) and min(times["pd-1"]) < max(times["pd-2"]), times
        assert min(times["pd-3"]) > max(times["pd-1"] + times["pd-2"]), times
        wait_for(lambda: listed_healthy(fleet) == {fleet.worker_url(host, role) for prefill, decode in THREE.values()
                                                   for host, role in ((prefill, "prefill"), (decode, "decode"))},
                 "every worker listed again", 10)


# How sshd logs a client's end of an authenticated connection (a close, or the reset of one), as
# tests/run/test_early_connection.py reads it.
CLOSED = r"^(?:Disconnected from user|Received disconnect from|Read error from remote host|Connection (?:closed|reset))"


@pytest.fixture
def router_sshd() -> Iterator[SSHD]:
    """An sshd of the router's host alone: each connection to that host is one login in its log."""
    yield from session_sshd()


def router_host_over(fleet: PdFleet, sshd: SSHD) -> Path:
    """gpu-r, the router's host, reached over `sshd`, its python a wrapper that records each agent started there
    (its pid: exec keeps it): the file it writes, one line an agent."""
    started, python = fleet.root / "router-agents", fleet.root / "router-python"
    python.write_text(f'#!/bin/sh\necho $$ >> {started}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    fleet.inventory["hosts"]["gpu-r"].update(
        transport="ssh", address=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(sshd.client_key),
        known_hosts=str(sshd.known_hosts), ssh_config="/dev/null", python=str(python))
    fleet.write()
    return started


def rolled_with_the_router_elsewhere(tmp_path: Path, sshd: SSHD, listener: Listener | None = None
                                     ) -> tuple[list[int], Counter[str]]:
    """Three PD units behind one router on gpu-r (over its own sshd), two at a time (so two units ask for the
    router's host at once): the agents started on gpu-r, and each unit's router_remove events, once the in-process
    apply returned (exit 0)."""
    fleet = make_fleet(tmp_path, pd_units=THREE, router_host="gpu-r")
    (tmp_path / "note.yaml").write_text(yaml.safe_dump(
        {**PLAYBOOK, "rollout": {"strategy": "rolling", "max_unavailable": 2}}, sort_keys=False))
    started = router_host_over(fleet, sshd)
    with running(fleet):
        outcome = apply(ApplyOptions(playbook=tmp_path / "note.yaml", host="pd-1,pd-2,pd-3",
                                     inventory=tmp_path / "hosts.yaml", runs_dir=tmp_path / "runs"), listener=listener)
        assert outcome.exit_code == 0, outcome.error
        removed = Counter(e["unit"] for path in (tmp_path / "runs").glob("*/events.jsonl")
                          for e in map(json.loads, path.read_text().splitlines()) if e["type"] == "router_remove")
        return [int(pid) for pid in started.read_text().split()], removed


def test_a_fleet_run_shares_one_connection_to_the_routers_host_and_closes_it_when_the_run_ends(
        tmp_path: Path, router_sshd: SSHD) -> None:
    agents, removed = rolled_with_the_router_elsewhere(tmp_path, router_sshd)
    assert removed == {"pd-1": 2, "pd-2": 2, "pd-3": 2}  # every unit went through the router
    assert router_sshd.log().count("Accepted publickey") == 1, router_sshd.log()  # one connection for 3 units
    assert len(agents) == 1, agents
    # Closed when the run ended, with this process still alive: nothing of it is left on the router's host.
    wait_for(lambda: not process_alive(agents[0]), "the router host's agent ended with the run", 10)
    assert within(lambda: re.search(CLOSED, router_sshd.log().split("Accepted publickey", 1)[1], re.M), 10), \
        router_sshd.log()  # and its connection


def test_a_connection_to_the_routers_host_lost_between_batches_is_opened_again_by_the_next_unit(
        tmp_path: Path, router_sshd: SSHD) -> None:
    ended: list[str] = []

    def kill_after_the_first_batch(event: dict[str, Any]) -> None:
        """Once the first batch's four runs ended (the runner waits for them), the router host's agent dies."""
        if event["type"] == "run_end":
            ended.append(event["host"])
            if len(ended) == 4:
                [pid] = (tmp_path / "router-agents").read_text().split()
                os.kill(int(pid), signal.SIGKILL)
                wait_for(lambda: not process_alive(int(pid)), "the router host's agent killed", 10)

    agents, removed = rolled_with_the_router_elsewhere(tmp_path, router_sshd, kill_after_the_first_batch)
    assert removed == {"pd-1": 2, "pd-2": 2, "pd-3": 2}  # pd-3 went through the router on a new connection
    assert router_sshd.log().count("Accepted publickey") == 2, router_sshd.log()
    assert len(agents) == 2, agents
    wait_for(lambda: not process_alive(agents[1]), "the second agent ended with the run", 10)
