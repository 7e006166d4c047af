"""Fleet runs over real sshd: four hosts on two sshd instances, each host its own repo."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import (
    FIXED_A,
    ORIGINAL_A,
    ORIGINAL_B,
    Project,
    age_lock,
    git,
    init_repo,
    signal_one,
    staged_bytes,
    target_python,
)
from fixtures_ssh import SSHD, session_sshd

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

HOSTS = ("h1", "h2", "h3", "h4")
BOUNDED = ["local_compile", "upload", "remote_compile",
           {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
           {"commit": {"message": "pkg: answer is 42"}}]


def slow_remote_compile(project: Project, seconds: int) -> None:
    """Every host's python sleeps before a step's call (the agent starts at once): the runs stay busy a while."""
    slow = target_python(project, f"sleep {seconds}")
    inventory = yaml.safe_load(project.inventory.read_text())
    for host in inventory["hosts"].values():
        host["python"] = slow
    project.inventory.write_text(yaml.safe_dump(inventory))


@pytest.fixture(scope="session")
def second_sshd() -> Iterator[SSHD]:
    yield from session_sshd()


@pytest.fixture
def fleet(tmp_path: Path, sshd: SSHD, second_sshd: SSHD) -> Project:
    """h1, h2 behind one sshd, h3, h4 behind the other; groups `all` and `gpu`."""
    hosts: dict[str, Any] = {}
    for index, name in enumerate(HOSTS):
        server = sshd if index < 2 else second_sshd
        repo = tmp_path / name / "repo"
        init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B})
        hosts[name] = {"transport": "ssh", "address": server.host, "port": server.port, "user": server.user,
                       "identity_file": server.client_key, "known_hosts": server.known_hosts,
                       "ssh_config": "/dev/null", "repo": str(repo), "python": sys.executable}
    project = Project(root=tmp_path, repo=tmp_path / "h1" / "repo", host=hosts["h1"], host_name="h1")
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"all": list(HOSTS)}}, sort_keys=False))
    project.write("fix/a.py", FIXED_A)
    return project


def repo(project: Project, host: str) -> Path:
    return project.root / host / "repo"


def as_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not one JSON object (exit {result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}") from None
    assert isinstance(data, dict)
    return data


def test_a_fleet_run_applies_every_host_with_its_own_sub_run_and_verifies(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED)
    heads = {h: git(repo(fleet, h), "rev-parse", "HEAD").strip() for h in HOSTS}
    result = fleet.deployer("apply", "fix.yaml", "--host", "h*", "--parallel", "4", "--json")
    report = as_json(result)
    assert result.returncode == 0 and report["status"] == "successful", report
    assert list(report["hosts"]) == list(HOSTS) and report["untouched"] == []
    for host in HOSTS:
        sub = report["hosts"][host]
        assert sub["status"] == "successful" and sub["git_before"] == heads[host]
        message = git(repo(fleet, host), "log", "-1", "--format=%B")
        assert f"Deployer-Run: {sub['run_id']}" in message  # each host its own run, its own trailer
        assert (repo(fleet, host) / "pkg/a.py").read_text() == FIXED_A
        start = json.loads((fleet.runs / sub["run_id"] / "events.jsonl").read_text().splitlines()[0])
        assert start["host"] == host and start["fleet"] == report["fleet_id"]
    fleet_id = report["fleet_id"]
    listed = as_json(fleet.deployer("runs", "list", "--json"))
    [shown] = [f for f in listed["fleets"] if f["fleet_id"] == fleet_id]
    assert {h: r["status"] for h, r in shown["hosts"].items()} == dict.fromkeys(HOSTS, "successful")
    assert fleet_id in fleet.deployer("runs", "list").stdout
    shown_text = fleet.deployer("runs", "show", fleet_id).stdout
    assert all(f"{h}  " in shown_text for h in HOSTS) and f"fleet run {fleet_id} (apply): successful" in shown_text
    assert fleet.deployer("runs", "verify", fleet_id).returncode == 0
    events = fleet.runs / report["hosts"]["h3"]["run_id"] / "events.jsonl"
    events.write_text(events.read_text().replace('"h3"', '"hX"', 1))
    tampered = fleet.deployer("runs", "verify", fleet_id)
    assert tampered.returncode == 5 and "h3: run " in tampered.stderr


def test_runs_verify_target_of_a_fleet_exits_4_naming_an_unreachable_host_and_5_only_for_a_tampered_log(
        fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED)
    report = as_json(fleet.deployer("apply", "fix.yaml", "--host", "h1,h3", "--json"))
    fleet_id = report["fleet_id"]
    assert fleet.deployer("runs", "verify", fleet_id, "--target").returncode == 0
    inventory = yaml.safe_load(fleet.inventory.read_text())
    closed = socket.socket()  # bound, never listening: the connect is refused (create_server would listen)
    closed.bind(("127.0.0.1", 0))
    inventory["hosts"]["h3"]["port"] = closed.getsockname()[1]
    fleet.inventory.write_text(yaml.safe_dump(inventory))
    try:
        unreachable = fleet.deployer("runs", "verify", fleet_id, "--target")
        assert unreachable.returncode == 4, unreachable.stdout + unreachable.stderr
        assert "h3: not verified against the target" in unreachable.stderr and "h1" not in unreachable.stderr
        events = fleet.runs / report["hosts"]["h1"]["run_id"] / "events.jsonl"
        events.write_text(events.read_text().replace('"h1"', '"hX"', 1))
        tampered = fleet.deployer("runs", "verify", fleet_id, "--target")
        assert tampered.returncode == 5 and "h1: run " in tampered.stderr, tampered.stderr
    finally:
        closed.close()


def test_fleet_rollback_reverts_the_chosen_hosts_then_the_rest(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED)
    trees = {h: git(repo(fleet, h), "rev-parse", "HEAD^{tree}").strip() for h in HOSTS}
    applied = as_json(fleet.deployer("apply", "fix.yaml", "--host", "all", "--json"))
    fleet_id = applied["fleet_id"]

    some = fleet.deployer("rollback", fleet_id, "--host", "h1,h3", "--json")
    partial = as_json(some)
    assert some.returncode == 0 and set(partial["hosts"]) == {"h1", "h3"} and partial["of_fleet"] == fleet_id
    for host in HOSTS:
        reverted = git(repo(fleet, host), "rev-parse", "HEAD^{tree}").strip() == trees[host]
        assert reverted == (host in ("h1", "h3")), host
    message = git(repo(fleet, "h3"), "log", "-1", "--format=%B")
    assert f"Deployer-Rollback-Of: {applied['hosts']['h3']['run_id']}" in message

    rest = as_json(fleet.deployer("rollback", fleet_id, "--json"))
    assert set(rest["hosts"]) == {"h2", "h4"} and rest["status"] == "successful"
    assert all(git(repo(fleet, h), "rev-parse", "HEAD^{tree}").strip() == trees[h] for h in HOSTS)
    again = fleet.deployer("rollback", fleet_id)
    assert again.returncode == 2 and "left no commit to roll back" in again.stderr
    original = as_json(fleet.deployer("runs", "list", "--json"))
    [record] = [f for f in original["fleets"] if f["fleet_id"] == fleet_id]
    assert record["rolled_back_by"] == [partial["fleet_id"], rest["fleet_id"]]


def test_a_canary_rollout_stops_at_a_failed_batch_and_rollback_fleet_restores_earlier_hosts(fleet: Project) -> None:
    # h2's file is long: replacing it deletes more lines than the bounds allow.
    long_a = "".join(f"# line {i}\n" for i in range(20)) + ORIGINAL_A
    (repo(fleet, "h2") / "pkg/a.py").write_text(long_a)
    git(repo(fleet, "h2"), "commit", "-qam", "longer a.py")
    fleet.playbook(steps=BOUNDED, rollout={"batches": [1, "25%", "100%"], "max_failures": 0},
                   on_failure="rollback_fleet")
    heads = {h: git(repo(fleet, h), "rev-parse", "HEAD").strip() for h in HOSTS}
    trees = {h: git(repo(fleet, h), "rev-parse", "HEAD^{tree}").strip() for h in HOSTS}

    result = fleet.deployer("apply", "fix.yaml", "--host", "all", "--json")
    report = as_json(result)
    assert result.returncode == 1, report
    assert report["batches"] == [["h1"], ["h2"], ["h3", "h4"]]
    hosts = report["hosts"]
    assert hosts["h1"]["status"] == "successful" and hosts["h1"]["git_after"]
    assert hosts["h2"]["status"] == "failed" and "diff_bounds" in hosts["h2"]["error"]
    assert report["untouched"] == ["h3", "h4"] and hosts["h3"]["run_id"] is None
    assert hosts["h1"]["rollback_status"] == "successful"
    # h1 is back on its old tree by a revert commit; h2 was restored by its own run; h3, h4 never changed.
    assert git(repo(fleet, "h1"), "rev-parse", "HEAD^{tree}").strip() == trees["h1"]
    assert (repo(fleet, "h1") / "pkg/a.py").read_text() == ORIGINAL_A
    assert git(repo(fleet, "h2"), "rev-parse", "HEAD").strip() == heads["h2"]
    for host in ("h3", "h4"):
        assert git(repo(fleet, host), "rev-parse", "HEAD").strip() == heads[host]
    shown = fleet.deployer("runs", "show", report["fleet_id"]).stdout
    [h1_row] = [line for line in shown.splitlines() if line.startswith("h1 ")]
    # applied (its state, as the README names it), then rolled back (that run's status)
    assert "never touched: h3, h4" in shown and h1_row.split()[2] == "succeeded" and "successful" in h1_row


def test_two_overlapping_fleet_runs_one_proceeds_the_other_exits_3_naming_the_holder(fleet: Project) -> None:
    slow_remote_compile(fleet, 2)
    fleet.playbook(steps=BOUNDED, rollout={"batches": [1, "100%"]})
    first = fleet.popen("apply", "fix.yaml", "--host", "all", "--json")
    second = fleet.popen("apply", "fix.yaml", "--host", "h1,h2,h3,h4", "--json")
    outcomes = []
    for proc in (first, second):
        out, err = proc.communicate(timeout=120)
        outcomes.append((proc.returncode, json.loads(out), err))
    assert sorted(code for code, _, _ in outcomes) == [0, 3], outcomes
    (_, winner, _), (_, loser, _) = sorted(outcomes, key=lambda o: o[0])
    assert all(run["status"] == "successful" for run in winner["hosts"].values())
    holder = winner["hosts"]["h1"]["run_id"]
    assert f"held by run {holder}" in loser["error"]
    assert loser["untouched"] == ["h2", "h3", "h4"]
    for host in HOSTS:  # exactly one deploy commit on each host
        assert git(repo(fleet, host), "rev-list", "--count", "--grep=^Deployer-Run: ", "HEAD").strip() == "1"


def test_a_single_host_keeps_the_plain_run_and_bad_selections_exit_2(fleet: Project) -> None:
    fleet.playbook(steps=BOUNDED)
    single = fleet.deployer("apply", "fix.yaml", "--host", "all", "--limit", "h4", "--json")
    report = as_json(single)
    assert single.returncode == 0 and "fleet_id" not in report and report["status"] == "successful"
    unknown = fleet.deployer("apply", "fix.yaml", "--host", "h1,nope")
    assert unknown.returncode == 2 and "'nope' is not a host, group or unit" in unknown.stderr
    fleet.playbook(steps=[*BOUNDED, "co_restart"])  # no host has a service: refused before any host connects
    refused = fleet.deployer("apply", "fix.yaml", "--host", "all")
    assert refused.returncode == 2 and "co_restart: host h1 defines no service" in refused.stderr
    assert sorted(p.name for p in fleet.runs.iterdir()) == [report["run_id"]]  # no fleet run, no sub-run began


def test_hosts_of_one_fleet_start_their_runs_concurrently_in_one_runs_dir(tmp_path: Path) -> None:
    # A fleet's sub-runs share a process: the runs dir's writability probe must not be shared between threads.
    from concurrent.futures import ThreadPoolExecutor

    from deployer.runstate import ensure_headroom

    def probe(_: int) -> None:
        for _ in range(200):
            ensure_headroom(tmp_path / "runs", 0)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(probe, range(8)))


def test_the_live_view_of_64_hosts_is_a_summary_line_and_only_the_running_and_failed_hosts() -> None:
    import io

    from deployer.ui.console import make_console
    from deployer.ui.live import FleetView

    hosts = [f"gpu-{i:02d}" for i in range(64)]
    console = make_console()
    console.file, console.width = io.StringIO(), 120
    view = FleetView(console, hosts)
    assert view.live is None  # not a terminal: plain lines
    for host in hosts[:40]:
        view({"type": "host_status", "host": host, "status": "running"})
        view({"type": "host_status", "host": host, "status": "successful", "elapsed_s": 1.0, "run_id": "r"})
    for host in hosts[40:45]:
        view({"type": "host_status", "host": host, "status": "running"})
        view({"type": "step_start", "host": host, "step": "upload"})
    view({"type": "step_end", "host": "gpu-44", "step": "upload", "status": "failed", "error": "boom\nmore"})
    view({"type": "host_status", "host": "gpu-44", "status": "failed", "error": "step 'upload' failed: boom"})
    plain = console.file.getvalue().splitlines()
    assert "[gpu-44] upload failed 0.00s boom" in plain and "[gpu-00] successful run r" in plain

    terminal = make_console()
    terminal.file, terminal.width = io.StringIO(), 120
    terminal.print(view._render())
    shown = terminal.file.getvalue().splitlines()
    assert shown[0] == "fleet: 64 hosts: 1 failed, 4 running, 40 successful, 19 waiting"
    rows = [line.split()[0] for line in shown[2:]]
    assert rows == ["gpu-40", "gpu-41", "gpu-42", "gpu-43", "gpu-44"]
    assert "upload" in shown[2] and "failed" in shown[-1] and "boom" in shown[-1]


@pytest.fixture
def pd_unit(fleet: Project) -> Iterator[Project]:
    """Unit pd-1: prefill on h1 (one sshd), decode on h3 (the other sshd); h1 serves the unit's metrics.
    h2 and h4 are plain hosts with a server of their own."""
    from fixtures_services import metrics_text
    from ports import free_port

    www = fleet.root / "www"
    www.mkdir()
    (www / "health").write_text("ok\n")
    (www / "metrics").write_text(metrics_text(0.0))
    inventory = yaml.safe_load(fleet.inventory.read_text())
    for host, name in (("h1", "prefill"), ("h2", "server"), ("h3", "decode"), ("h4", "server")):
        port = free_port()
        # prefill comes up slowly, so a decode started before prefill is healthy shows in the event times
        delay = "sleep 0.5; " if name == "prefill" else ""
        serve = f"{delay}exec {sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {www}"
        inventory["hosts"][host]["services"] = {name: {
            "start": ["sh", "-c", serve],
            "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20, "stop_grace_s": 5}}
        if name != "decode":
            inventory["hosts"][host]["metrics"] = f"http://127.0.0.1:{port}/metrics"
    inventory["units"] = {"pd-1": {"services": ["h1:prefill", "h3:decode"], "metrics": "h1"}}
    fleet.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    yield fleet
    for host in HOSTS:
        for pidfile in (repo(fleet, host) / ".git" / "deployer").glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)


GAUGE = "sglang:num_prefill_inflight_queue_reqs"
UNIT_STEPS = [*BOUNDED, "co_restart", {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.1, "within_s": 1}}]
# A rollback judges the reverted build's gauge against the baseline read before the fix (none: the drain is not run).
UNIT_BASELINE = {"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10}}


def serving(pd_unit: Project) -> None:
    """The unit's services up before the fix, so that its baseline reads them."""
    started = pd_unit.deployer("restart", "--host", "pd-1")
    assert started.returncode == 0, started.stderr


def test_a_pd_unit_on_two_hosts_restarts_as_one_and_is_drained_on_its_metrics_host(pd_unit: Project) -> None:
    pd_unit.playbook(steps=[UNIT_BASELINE, *UNIT_STEPS], on_failure="rollback")
    serving(pd_unit)
    result = pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1", "--json")
    report = as_json(result)
    assert result.returncode == 0, report
    assert report["units"] == {"pd-1": ["h1", "h3"]} and list(report["hosts"]) == ["h1", "h3"]
    prefill, decode = (pd_unit.events(report["hosts"][h]["run_id"]) for h in ("h1", "h3"))

    def at(events: list[dict[str, Any]], kind: str) -> str:
        return str(next(e["time"] for e in events if e["type"] == kind))
    # decode stops before prefill; prefill is started and healthy before decode starts
    assert at(decode, "service_stopped") <= at(prefill, "service_stopped") <= at(prefill, "service_started") \
        <= at(decode, "service_started")
    for events, service in ((prefill, "prefill"), (decode, "decode")):
        pids = next(e for e in events if e["type"] == "restart")["pids"]
        assert list(pids) == [service] and pids[service]["new"] != pids[service]["old"]
        assert (repo(pd_unit, "h1" if service == "prefill" else "h3") / "pkg/a.py").read_text() == FIXED_A
    drained = [e["step"] for e in prefill if e["type"] == "step_end" and e["step"] == "drain"]
    assert drained == ["drain"] and not [e for e in decode if e.get("step") == "drain"]

    part = pd_unit.deployer("rollback", report["fleet_id"], "--host", "h3")
    assert part.returncode == 2 and "takes part of unit pd-1 (h1, h3) but not h1" in part.stderr
    undone = pd_unit.deployer("rollback", report["fleet_id"], "--json")
    rolled = as_json(undone)
    assert undone.returncode == 0 and rolled["units"] == {"pd-1": ["h1", "h3"]}, rolled
    prefill, decode = (pd_unit.events(rolled["hosts"][h]["run_id"]) for h in ("h1", "h3"))
    assert at(decode, "service_stopped") <= at(prefill, "service_stopped") <= at(prefill, "service_started") \
        <= at(decode, "service_started")
    assert [e["step"] for e in prefill if e["type"] == "step_end" and e["status"] == "ok"][-2:] == \
        ["rollback:co_restart", "rollback:drain"]
    for host in ("h1", "h3"):
        assert (repo(pd_unit, host) / "pkg/a.py").read_text() == ORIGINAL_A
        original = pd_unit.events(report["hosts"][host]["run_id"])
        assert original[-1]["type"] == "rolled_back_by" and original[-1]["by"] == rolled["hosts"][host]["run_id"]


def test_a_unit_that_fails_its_drain_rolls_back_restarts_and_drains_every_host_of_the_unit(
        pd_unit: Project) -> None:
    from fixtures_services import gauge_server

    inventory = yaml.safe_load(pd_unit.inventory.read_text())
    for host, service in (("h1", "prefill"), ("h3", "decode")):
        spec = inventory["hosts"][host]["services"][service]
        port = int(spec["health"].rsplit(":", 1)[1].split("/")[0])
        # the fix leaves the gauge at 3, the reverted build drains it: only a drain after the revert passes
        spec["start"] = gauge_server(pd_unit.root, port, repo(pd_unit, host), pd_unit.root / "www")
        spec["env"] = {"PYTHONDONTWRITEBYTECODE": "1"}
    pd_unit.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    pd_unit.playbook(steps=[UNIT_BASELINE, *UNIT_STEPS], on_failure="rollback")
    serving(pd_unit)
    trees = {h: git(repo(pd_unit, h), "rev-parse", "HEAD^{tree}").strip() for h in ("h1", "h3")}
    result = pd_unit.deployer("apply", "fix.yaml", "--host", "h1,h3", "--json")
    report = as_json(result)
    assert result.returncode == 5, report
    for host in ("h1", "h3"):
        sub = report["hosts"][host]
        assert sub["phase"] == "rolled_back" and "Rolled back every host of the unit (h1, h3)" in sub["error"]
        assert git(repo(pd_unit, host), "rev-parse", "HEAD^{tree}").strip() == trees[host]
        events = pd_unit.events(sub["run_id"])
        assert [e["status"] for e in events if e["type"] == "step_end" and e["step"] == "rollback:co_restart"] \
            == ["ok"]
    # As a manual unit rollback: the drain again after the revert, once, on the unit's metrics host.
    prefill, decode = (pd_unit.events(report["hosts"][h]["run_id"]) for h in ("h1", "h3"))
    ended = [(e["step"], e["status"]) for e in prefill if e["type"] == "step_end"]
    assert ("drain", "failed") in ended and ended[-2:] == [("rollback:co_restart", "ok"), ("rollback:drain", "ok")]
    assert not [e for e in decode if e.get("step") == "rollback:drain"]


def test_part_of_a_unit_cannot_be_deployed_alone_and_a_unit_plans_per_host(pd_unit: Project) -> None:
    pd_unit.playbook(steps=UNIT_STEPS)
    planned = pd_unit.deployer("plan", "fix.yaml", "--host", "pd-1", "--json")
    plans = as_json(planned)
    assert planned.returncode == 0 and [p["host"] for p in plans["hosts"]] == ["h1", "h3"]
    assert [[s["name"] for s in p["steps"]][-2:] for p in plans["hosts"]] == [["co_restart", "drain"],
                                                                              ["commit", "co_restart"]]
    refused = pd_unit.deployer("apply", "fix.yaml", "--host", "h3")
    assert refused.returncode == 2 and "takes part of unit 'pd-1'" in refused.stderr


def test_a_unit_restart_does_on_each_host_exactly_what_its_plan_lists_there_in_that_order(pd_unit: Project) -> None:
    """One co_restart routine for one host and for a unit: each host's run log records its part's planned actions,
    in the planned order, every unconditional one included (the free-port check, the still-running check)."""
    pd_unit.playbook(steps=UNIT_STEPS, on_failure="rollback")
    plans = as_json(pd_unit.deployer("plan", "fix.yaml", "--host", "pd-1", "--json"))
    planned = {p["host"]: next(s["actions"] for s in p["steps"] if s["name"] == "co_restart") for p in plans["hosts"]}
    result = pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1", "--json")
    report = as_json(result)
    assert result.returncode == 0, report
    for host, service in (("h1", "prefill"), ("h3", "decode")):
        keys = [a["key"] for a in planned[host]]
        done = [e["action"] for e in pd_unit.events(report["hosts"][host]["run_id"])
                if e.get("step") == "co_restart" and "action" in e]
        assert all(k.startswith(f"{service}.") for k in keys) and set(done) <= set(keys), (keys, done)
        assert done == sorted(set(done), key=keys.index), f"{host}: out of plan order or twice: {done}"
        assert {a["key"] for a in planned[host] if a["when"] is None} <= set(done), (keys, done)
        assert {f"{service}.free", f"{service}.still"} <= set(done)


def test_a_unit_restart_refuses_a_health_url_that_another_process_still_answers_after_the_stop(
        pd_unit: Project) -> None:
    """The unit gets the single host's check: a health URL served by a process deployer did not start (which
    would pass the new process's health check for it) refuses the unit before any host changes."""
    inventory = yaml.safe_load(pd_unit.inventory.read_text())
    port = int(inventory["hosts"]["h3"]["services"]["decode"]["health"].rsplit(":", 1)[1].split("/")[0])
    squatter = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                 "--directory", str(pd_unit.root / "www")], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            assert time.monotonic() < deadline and squatter.poll() is None, "the hand-started server never listened"
            time.sleep(0.05)
        pd_unit.playbook(steps=UNIT_STEPS)
        report = as_json(pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1", "--json"))
        assert report["exit_code"] == 1, report
        said = " ".join(report["hosts"]["h3"]["error"].split())
        assert (f"service decode: http://127.0.0.1:{port}/health answers 200, but no process deployer started "
                "(or adopted) runs decode") in said, said
        assert all(report["hosts"][h]["phase"] == "failed_restored" or report["hosts"][h]["git_after"] is None
                   for h in ("h1", "h3")), report
        assert squatter.poll() is None  # not deployer's to kill
        for host in ("h1", "h3"):
            events = pd_unit.events(report["hosts"][host]["run_id"])
            assert not [e for e in events if e["type"] == "service_started"], host
    finally:
        squatter.kill()
        squatter.wait()


def test_a_unit_host_failing_before_its_commit_restores_every_host_and_restarts_nothing(pd_unit: Project) -> None:
    long_a = "".join(f"# line {i}\n" for i in range(20)) + ORIGINAL_A
    (repo(pd_unit, "h3") / "pkg/a.py").write_text(long_a)
    git(repo(pd_unit, "h3"), "commit", "-qam", "longer a.py")
    pd_unit.playbook(steps=UNIT_STEPS, on_failure="rollback")
    heads = {h: git(repo(pd_unit, h), "rev-parse", "HEAD").strip() for h in ("h1", "h3")}
    report = as_json(pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1", "--json"))
    assert report["exit_code"] == 1 and "diff_bounds" in report["hosts"]["h3"]["error"]
    assert report["error"].startswith("2 of 2 host(s) failed; first: h3: ") and "diff_bounds" in report["error"]
    assert report["hosts"]["h1"]["phase"] == "failed_restored"
    assert "another host of the unit failed" in report["hosts"]["h1"]["error"]
    for host in ("h1", "h3"):
        assert git(repo(pd_unit, host), "rev-parse", "HEAD").strip() == heads[host]
        assert git(repo(pd_unit, host), "status", "--porcelain").strip() == ""
        events = pd_unit.events(report["hosts"][host]["run_id"])
        assert not [e for e in events if e["type"] == "service_started"]


def test_recover_of_a_killed_fleet_run_restores_every_cut_host(fleet: Project) -> None:
    slow_remote_compile(fleet, 30)
    fleet.playbook(steps=BOUNDED)
    heads = {h: git(repo(fleet, h), "rev-parse", "HEAD").strip() for h in ("h1", "h3")}
    proc = fleet.popen("apply", "fix.yaml", "--host", "h1,h3")
    try:
        deadline = time.monotonic() + 30
        while not all(staged_bytes(repo(fleet, h), "pkg/a.py") == FIXED_A for h in ("h1", "h3")):
            assert time.monotonic() < deadline and proc.poll() is None, "the uploads were never staged"
            time.sleep(0.05)
    finally:
        proc.kill()  # cut in the compile: both hosts hold the staged bytes, a lock and an intent record
        proc.communicate(timeout=30)
    for host in ("h1", "h3"):
        age_lock(repo(fleet, host))
    [fleet_id] = [p.name for p in fleet.runs.iterdir() if (p / "fleet.json").is_file()]
    recovered = fleet.deployer("recover", fleet_id, "--json")
    report = as_json(recovered)
    assert recovered.returncode == 0 and report["kind"] == "recover" and report["of_fleet"] == fleet_id, report
    assert set(report["hosts"]) == {"h1", "h3"}
    for host in ("h1", "h3"):
        assert (repo(fleet, host) / "pkg/a.py").read_text() == ORIGINAL_A
        assert git(repo(fleet, host), "rev-parse", "HEAD").strip() == heads[host]
        assert not (repo(fleet, host) / ".git" / "deployer.run.lock").exists()
    # As for a single run: a second recover finds nothing to do, says so, exits 0 and writes nothing.
    logs = {p: p.read_bytes() for p in fleet.runs.glob("*/events.jsonl")}
    again = fleet.deployer("recover", fleet_id)
    assert (again.returncode, again.stdout) == (0, f"fleet run {fleet_id}: nothing to recover (every host's "
                                                   "record and log ended)\n"), again.stdout + again.stderr
    assert {p: p.read_bytes() for p in fleet.runs.glob("*/events.jsonl")} == logs
    listed = as_json(fleet.deployer("runs", "list", "--json"))
    [cut] = [f for f in listed["fleets"] if f["fleet_id"] == fleet_id]
    assert cut["status"] == "failed" and {h: r["phase"] for h, r in cut["hosts"].items()} == \
        dict.fromkeys(("h1", "h3"), "failed_restored")
    assert fleet.deployer("runs", "verify", fleet_id).returncode == 0


def test_two_overlapping_unit_runs_never_deadlock_one_proceeds_the_other_exits_3(pd_unit: Project) -> None:
    slow_remote_compile(pd_unit, 2)
    pd_unit.playbook(steps=UNIT_STEPS)
    # One names the unit, the other its hosts in the other order: locks are still taken h1 first.
    procs = [pd_unit.popen("apply", "fix.yaml", "--host", spec, "--json") for spec in ("pd-1", "h3,h1")]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        outcomes.append((proc.returncode, json.loads(out), err))
    assert sorted(code for code, _, _ in outcomes) == [0, 3], outcomes
    (_, winner, _), (_, loser, _) = sorted(outcomes, key=lambda o: o[0])
    assert f"held by run {winner['hosts']['h1']['run_id']}" in loser["hosts"]["h1"]["error"]
    assert loser["untouched"] == ["h3"]  # its second lock was never even tried
    for host in ("h1", "h3"):
        assert git(repo(pd_unit, host), "rev-list", "--count", "--grep=^Deployer-Run: ", "HEAD").strip() == "1"


def test_parallel_counts_every_host_of_a_unit(pd_unit: Project) -> None:
    # One batch: unit pd-1 (h1, h3), h2 and h4 at --parallel 2. Each host's steps take a second or more, so
    # a pool that counted the unit as one piece of work would run three hosts at once.
    slow_remote_compile(pd_unit, 1)
    pd_unit.playbook(steps=UNIT_STEPS)
    report = as_json(pd_unit.deployer("apply", "fix.yaml", "--host", "all", "--parallel", "2", "--json"))
    assert report["status"] == "successful", report
    spans = []
    for host in HOSTS:
        events = pd_unit.events(report["hosts"][host]["run_id"])
        spans.append((events[0]["time"], events[-1]["time"]))
    busiest = max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)
    assert busiest == 2, spans  # never more than --parallel; and the unit's two hosts did run together


def test_a_unit_in_a_rollout_is_one_batch_entry_and_rollback_fleet_restarts_it_as_one(pd_unit: Project) -> None:
    long_a = "".join(f"# line {i}\n" for i in range(20)) + ORIGINAL_A
    (repo(pd_unit, "h2") / "pkg/a.py").write_text(long_a)
    git(repo(pd_unit, "h2"), "commit", "-qam", "longer a.py")
    pd_unit.playbook(steps=UNIT_STEPS, rollout={"batches": [1, 1, "100%"]}, on_failure="rollback_fleet")
    trees = {h: git(repo(pd_unit, h), "rev-parse", "HEAD^{tree}").strip() for h in HOSTS}
    report = as_json(pd_unit.deployer("apply", "fix.yaml", "--host", "all", "--json"))
    assert report["batches"] == [["h1", "h3"], ["h2"], ["h4"]] and report["untouched"] == ["h4"], report
    assert report["exit_code"] == 1 and "diff_bounds" in report["hosts"]["h2"]["error"]
    prefill, decode = ([e for e in pd_unit.events(report["hosts"][h]["rollback_run_id"])
                        if e.get("step") == "rollback:co_restart"] for h in ("h1", "h3"))

    def at(events: list[dict[str, Any]], kind: str) -> str:
        return str(next(e["time"] for e in events if e["type"] == kind))
    assert at(decode, "service_stopped") <= at(prefill, "service_stopped") <= at(prefill, "service_started") \
        <= at(decode, "service_started")
    assert {e.get("unit") for e in prefill + decode if e["type"].startswith("service_")} == {"pd-1"}
    for host in HOSTS:
        assert git(repo(pd_unit, host), "rev-parse", "HEAD^{tree}").strip() == trees[host], host


@pytest.fixture
def demo_unit(tmp_path: Path, sshd: SSHD, second_sshd: SSHD) -> Iterator[tuple[Project, dict[str, Any]]]:
    """The demo's buggy stack split over two hosts: prefill and router on h1 (one sshd), decode on h3 (the
    other sshd), each host its own copy of the repo; unit pd-1 with h1 as its metrics host."""
    from ports import demo_ports

    from deployer.demo.run import DemoStack, wait_healthy
    from deployer.steps.cancel import CancelToken

    stacks = {host: DemoStack(tmp_path / host, demo_ports()[0]) for host in ("h1", "h3")}
    for stack in stacks.values():
        stack.create()
    stacks["h3"].ports = stacks["h1"].ports  # one stack: both sides know the same ports
    placed = {"prefill": "h1", "decode": "h3", "router": "h1"}
    hosts: dict[str, Any] = {}
    for host, server in (("h1", sshd), ("h3", second_sshd)):
        model = stacks[host].host().model_dump(exclude_defaults=True)
        model["services"] = {n: s for n, s in model["services"].items() if placed[n] == host}
        if host != "h1":
            del model["metrics"], model["endpoint"]
        hosts[host] = {**model, "transport": "ssh", "address": server.host, "port": server.port,
                       "user": server.user, "identity_file": server.client_key, "known_hosts": server.known_hosts,
                       "ssh_config": "/dev/null"}
    project = Project(root=tmp_path, repo=stacks["h1"].repo, host=hosts["h1"], host_name="h1")
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts, "units": {"pd-1": {
        "services": ["h1:prefill", "h3:decode", "h1:router"], "metrics": "h1"}}}, sort_keys=False))
    for name, host in placed.items():  # the "production" stack, up before the hotfix
        stack = stacks[host]
        service = stack.host().services[name]
        assert service.start is not None and service.health is not None
        stack.state.mkdir(parents=True, exist_ok=True)
        with open(stack.state / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(service.start, cwd=stack.repo / "python", stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        (stack.state / f"{name}.pid").write_text(f"{proc.pid}\n")
        wait_healthy(service.health, 30, CancelToken(), stack.state / f"{name}.log")
    try:
        yield project, {host: stack.pids for host, stack in stacks.items()}
    finally:
        for stack in stacks.values():
            stack.stop()


def test_a_pd_unit_of_the_demo_stack_on_two_hosts_gets_the_kvpoll_fix_restarted_as_one_and_drains(
        demo_unit: tuple[Project, dict[str, Any]]) -> None:
    from deployer.demo.run import GAUGE, PLAYBOOK

    project, pids_of = demo_unit
    before = {host: pids() for host, pids in pids_of.items()}
    result = project.deployer("apply", str(PLAYBOOK), "--host", "pd-1", "--json", timeout=180)
    report = as_json(result)
    assert result.returncode == 0, report
    h1, h3 = (project.events(report["hosts"][h]["run_id"]) for h in ("h1", "h3"))
    end = next(e for e in h1 if e["type"] == "run_end")
    assert end["facts"]["baseline"][GAUGE] >= 1  # the bug showed under the storm, before the fix
    assert end["facts"]["drain"][GAUGE]["final"] == 0  # the same storm drains on the fixed unit
    after = {host: pids() for host, pids in pids_of.items()}
    assert after["h1"]["prefill"] != before["h1"]["prefill"] and after["h3"]["decode"] != before["h3"]["decode"]
    assert after["h1"]["router"] == before["h1"]["router"]  # the playbook restarts prefill and decode only
    assert next(e for e in h3 if e["type"] == "restart")["pids"]["decode"]["old"] == before["h3"]["decode"]

    def at(events: list[dict[str, Any]], kind: str) -> str:
        return str(next(e["time"] for e in events if e["type"] == kind))
    assert at(h3, "service_stopped") <= at(h1, "service_stopped") <= at(h1, "service_started") \
        <= at(h3, "service_started")
    for host in ("h1", "h3"):
        message = git(project.root / host / "repo", "log", "-1", "--format=%B")
        assert f"Deployer-Run: {report['hosts'][host]['run_id']}" in message


@pytest.mark.parametrize("to", ["process", "worker thread"])
def test_a_signal_stops_every_host_of_a_fleet_at_a_safe_point_and_restores_each(fleet: Project, to: str) -> None:
    """The kernel hands a process's signal to any thread that takes it; Python runs the handler in the main thread.
    `worker thread` sends it to one that is not the main thread (what a loaded machine did now and then): the main
    thread, waiting for the hosts, must still run the handler at once, not once every host has committed."""
    from deployer.run.lock import LOCK_NAME

    # Each host's remote compile waits 4 s: the signal lands before any host's commit even on a loaded machine
    # (with 2 s, one run under a load average of 6 saw every host past its last safe point).
    slow_remote_compile(fleet, 4)
    fleet.playbook(steps=BOUNDED)
    heads = {h: git(repo(fleet, h), "rev-parse", "HEAD").strip() for h in HOSTS}
    proc = fleet.popen("apply", "fix.yaml", "--host", "all", "--json")
    deadline = time.monotonic() + 30
    while not all(staged_bytes(repo(fleet, h), "pkg/a.py") == FIXED_A for h in HOSTS):
        assert time.monotonic() < deadline and proc.poll() is None, "the uploads were never staged"
        time.sleep(0.05)
    # kill(2) of a thread's id tries that thread first: a non-main one, blocked in a read or a wait, takes it.
    signal_one(proc.pid, signal.SIGTERM, to_a_worker_thread=to == "worker thread")
    out, err = proc.communicate(timeout=60)
    report = json.loads(out)
    # Each host's phase and error in the message: a run that ends otherwise says where each host was.
    assert proc.returncode == 130 and report["status"] == "canceled", (report["hosts"], err)
    for host in HOSTS:
        assert report["hosts"][host]["phase"] == "failed_restored", report["hosts"][host]
        assert (repo(fleet, host) / "pkg/a.py").read_text() == ORIGINAL_A
        assert git(repo(fleet, host), "rev-parse", "HEAD").strip() == heads[host]
        assert not os.path.lexists(repo(fleet, host) / ".git" / LOCK_NAME)


def test_a_unit_host_whose_commit_fails_rolls_back_the_hosts_that_committed_without_a_restart(
        pd_unit: Project) -> None:
    hook = repo(pd_unit, "h3") / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'refused by policy' >&2\nexit 1\n")
    hook.chmod(0o755)
    steps = [*UNIT_STEPS]
    steps[4] = {"commit": {"message": "pkg: answer is 42", "hooks": True}}
    pd_unit.playbook(steps=steps, on_failure="rollback")
    trees = {h: git(repo(pd_unit, h), "rev-parse", "HEAD^{tree}").strip() for h in ("h1", "h3")}
    heads = {h: git(repo(pd_unit, h), "rev-parse", "HEAD").strip() for h in ("h1", "h3")}
    report = as_json(pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1", "--json"))
    assert report["exit_code"] == 1 and "first: h3: " in report["error"], report
    h1, h3 = report["hosts"]["h1"], report["hosts"]["h3"]
    assert h3["phase"] == "failed_restored" and git(repo(pd_unit, "h3"), "rev-parse", "HEAD").strip() == heads["h3"]
    assert h1["phase"] == "rolled_back" and h1["git_after"]  # h1 had committed: a revert commit undoes it
    assert git(repo(pd_unit, "h1"), "rev-list", "--count", f"{heads['h1']}..HEAD").strip() == "2"
    for host in ("h1", "h3"):
        assert git(repo(pd_unit, host), "rev-parse", "HEAD^{tree}").strip() == trees[host]
        events = pd_unit.events(report["hosts"][host]["run_id"])
        assert not [e for e in events if e["type"] in ("service_stopped", "service_started")]


def test_a_unit_rollback_whose_old_build_fails_its_check_still_ends_rolled_back_on_every_host(
        pd_unit: Project) -> None:
    from fixtures_services import gauge_server, metrics_text

    www = pd_unit.root / "www"
    inventory = yaml.safe_load(pd_unit.inventory.read_text())
    for host, service in (("h1", "prefill"), ("h3", "decode")):
        spec = inventory["hosts"][host]["services"][service]
        port = int(spec["health"].rsplit(":", 1)[1].split("/")[0])
        argv = gauge_server(pd_unit.root, port, repo(pd_unit, host), www)
        spec["start"] = [*argv[:-2], str(www / "drained.prom"), str(www / "old.prom")]  # the old build: old.prom
        spec["env"] = {"PYTHONDONTWRITEBYTECODE": "1"}
    pd_unit.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    (www / "old.prom").write_text(metrics_text(3.0))
    pd_unit.playbook(steps=[UNIT_BASELINE, *UNIT_STEPS])
    serving(pd_unit)
    report = as_json(applied := pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1", "--json"))
    assert applied.returncode == 0, report
    (www / "old.prom").write_text(metrics_text(9.0))  # the old build now wedges worse than before the fix
    undone = pd_unit.deployer("rollback", report["fleet_id"], "--json")
    rolled = as_json(undone)
    assert undone.returncode == 5, rolled
    for host in ("h1", "h3"):
        sub = rolled["hosts"][host]
        assert sub["phase"] == "rolled_back", sub
        state = json.loads((pd_unit.runs / sub["run_id"] / "state.json").read_text())
        assert state["checks_failed"] == ["drain"]
        assert (repo(pd_unit, host) / "pkg/a.py").read_text() == ORIGINAL_A
        assert "a rollback again would not change the old build" in " ".join(sub["error"].lower().split())
    again = pd_unit.deployer("rollback", report["fleet_id"], "--json")
    assert again.returncode != 0 and "already rolled back" in again.stdout, again.stdout
