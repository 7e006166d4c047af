"""Rolling PD units behind their router: two units of the demo stack behind one demo router (real HTTP servers, the
Model Gateway's queued worker API), a steady client load through the router while a rolling apply restarts one
unit at a time: each unit's workers are taken out, drained, restarted and put back, and no request fails."""

from __future__ import annotations

import http.client
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import deployer
from fixtures_ssh import SSHD
from polling import wait_for
from ports import demo_ports

from deployer.config.models import LocalHost
from deployer.demo.load import Load
from deployer.demo.run import DemoStack, start_stacks
from deployer.runlog import user_runs_dir
from deployer.steps.cancel import CancelToken

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

SETTLE_S = 0.5  # how long each removed worker must read 0 before its unit restarts
UNITS = {"pd-1": ("gpu-a", "gpu-b"), "pd-2": ("gpu-c", "gpu-d")}  # prefill host (and gpu-a the router's), decode
PLAYBOOK = {
    "name": "note", "files": [{"src": "note.py", "dest": "python/sglang/srt/demo_note.py", "create": True}],
    "steps": ["upload", {"commit": {"message": "demo: a note"}}, "co_restart"],
    "rollout": {"strategy": "rolling"}, "on_failure": "restore",
}


@dataclass
class RouterHost(DemoStack):
    """gpu-a: unit pd-1's prefill, and the one router every unit is behind."""

    router: list[str] = field(default_factory=list)

    def host(self) -> LocalHost:
        host = super().host()
        services = {**host.services, "router": host.services["router"].model_copy(update={"start": self.router})}
        return host.model_copy(update={"services": services})


@dataclass
class PdFleet:
    root: Path
    stacks: dict[str, DemoStack]
    router_port: int
    inventory: dict[str, Any]

    @property
    def runs(self) -> Path:
        """Where its commands, run with no runs dir of their own, keep their runs: the test's history."""
        return user_runs_dir()

    def write(self) -> None:
        (self.root / "hosts.yaml").write_text(yaml.safe_dump(self.inventory, sort_keys=False))

    def pids(self) -> dict[str, dict[str, int]]:
        return {name: stack.pids() for name, stack in self.stacks.items()}

    def workers(self) -> list[dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.router_port, timeout=10)
        try:
            conn.request("GET", "/workers")
            rows: list[dict[str, Any]] = json.loads(conn.getresponse().read())["workers"]
            return rows
        finally:
            conn.close()

    def worker_url(self, host: str, service: str) -> str:
        return self.stacks[host].url(service, "")

    def apply(self, *args: str) -> tuple[int, dict[str, Any], str]:
        result = deployer("apply", "note.yaml", "--host", *args, "--json", cwd=self.root)
        try:
            report = json.loads(result.stdout)
        except json.JSONDecodeError:
            report = {}
        return result.returncode, report, result.stdout + result.stderr

    def events(self, report: dict[str, Any], host: str) -> list[dict[str, Any]]:
        run_id = report["hosts"][host]["run_id"]
        path = self.runs / run_id / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


def make_fleet(tmp_path: Path, router_args: tuple[str, ...] = (), sshd: SSHD | None = None,
               pd_units: dict[str, tuple[str, str]] = UNITS, router_host: str = "gpu-a") -> PdFleet:
    """pd_units: unit -> (its prefill host, its decode host); router_host runs the router: the first prefill host,
    or a host of its own."""
    ports = demo_ports(len(pd_units))
    router_port = ports[0]["router"]
    stacks: dict[str, DemoStack] = {}
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--port", str(router_port),
            "--worker-queue-delay-secs", "0.1", *router_args]
    for (prefill, decode), unit_ports_ in zip(pd_units.values(), ports, strict=True):
        argv += ["--prefill", f"http://127.0.0.1:{unit_ports_['prefill']}", str(unit_ports_["bootstrap"]),
                 "--decode", f"http://127.0.0.1:{unit_ports_['decode']}"]
        if prefill == router_host:
            stacks[prefill] = RouterHost(tmp_path / prefill, unit_ports_, ("prefill", "router"), router=argv)
        else:
            stacks[prefill] = DemoStack(tmp_path / prefill, unit_ports_, ("prefill",))
        stacks[decode] = DemoStack(tmp_path / decode, unit_ports_, ("decode",))
    if router_host not in stacks:  # the router alone on a host of its own (argv grew with every unit above)
        stacks[router_host] = RouterHost(tmp_path / router_host, ports[0], ("router",), router=argv)
    units = {name: {"services": [f"{prefill}:prefill", f"{decode}:decode"], "router": "pd-router",
                    "workers": [{"service": f"{prefill}:prefill", "worker_type": "prefill",
                                 "bootstrap_port": stacks[prefill].ports["bootstrap"]},
                                {"service": f"{decode}:decode", "worker_type": "decode"}]}
             for name, (prefill, decode) in pd_units.items()}
    routers = {"pd-router": {"host": router_host, "url": f"http://127.0.0.1:{router_port}", "change_timeout_s": 10,
                             "drain_timeout_s": 20, "interval_s": 0.05, "settle_s": SETTLE_S}}
    for stack in stacks.values():
        stack.create()
    hosts = {name: stack.host().model_dump(exclude_defaults=True) for name, stack in stacks.items()}
    if sshd is not None:  # the same stacks, every host reached over the real sshd
        for host in hosts.values():
            host.update(transport="ssh", address=sshd.host, port=sshd.port, user=sshd.user,
                        identity_file=str(sshd.client_key), known_hosts=str(sshd.known_hosts), ssh_config="/dev/null")
    inventory = {"hosts": hosts, "routers": routers, "units": units}
    fleet = PdFleet(tmp_path, stacks, router_port, inventory)
    fleet.write()
    (tmp_path / "note.py").write_text("NOTE = 'rolled'\n")
    (tmp_path / "note.yaml").write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
    return fleet


@pytest.fixture
def transport(request: pytest.FixtureRequest) -> str:
    """How deployer reaches the hosts: local unless a test parametrizes it (indirect) with "ssh"."""
    return str(getattr(request, "param", "local"))


@pytest.fixture
def pd_fleet(tmp_path: Path, request: pytest.FixtureRequest, transport: str) -> Iterator[PdFleet]:
    """The four hosts' stacks started (prefill, decode, then the router over both units); every process of them
    stopped at the end, those the restarts made too."""
    sshd = request.getfixturevalue("sshd") if transport == "ssh" else None
    with running(make_fleet(tmp_path, tuple(getattr(request, "param", ())), sshd)) as fleet:
        yield fleet


@contextmanager
def load_through(fleet: PdFleet, what: str) -> Iterator[Load]:
    """A steady client load through the router, served already before `what` starts."""
    with Load(f"http://127.0.0.1:{fleet.router_port}/generate", timeout_s=30) as load:
        wait_for(lambda: load.ok >= 5, f"the load through the router is served before {what}", 30)
        yield load


@contextmanager
def running(fleet: PdFleet) -> Iterator[PdFleet]:
    """The fleet's stacks started; every process of them stopped at the end, those the restarts made too."""
    try:
        start_stacks(list(fleet.stacks.values()), CancelToken())
        yield fleet
    finally:
        for stack in fleet.stacks.values():
            stack.stop()


def listed_healthy(fleet: PdFleet) -> set[str]:
    return {w["url"] for w in fleet.workers() if w["is_healthy"]}


def every_worker(fleet: PdFleet) -> set[str]:
    return {fleet.worker_url(host, service) for host, service in
            (("gpu-a", "prefill"), ("gpu-b", "decode"), ("gpu-c", "prefill"), ("gpu-d", "decode"))}


@pytest.mark.parametrize("transport", ["local", "ssh"], indirect=True)
def test_a_rolling_apply_restarts_one_unit_at_a_time_behind_the_router_and_no_request_fails(pd_fleet: PdFleet) -> None:
    before = pd_fleet.pids()
    with load_through(pd_fleet, "the apply") as load:
        code, report, output = pd_fleet.apply("pd-1,pd-2")
        served_during = load.ok
    assert code == 0, output
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    assert served_during > 5
    assert report["batches"] == [["gpu-a", "gpu-b"], ["gpu-c", "gpu-d"]]  # one unit at a time
    after = pd_fleet.pids()
    for host, pids in before.items():
        for service, pid in pids.items():
            assert (after[host][service] == pid) == (service == "router"), (host, service)  # only the workers new
    assert listed_healthy(pd_fleet) == every_worker(pd_fleet)
    for unit, (prefill, _decode) in UNITS.items():
        kinds = [e["type"] for e in pd_fleet.events(report, prefill) if e.get("unit") == unit
                 and e["type"].startswith(("router_", "worker_"))]
        assert kinds[:2] == ["router_remove", "router_remove"] and "worker_inflight" in kinds, (unit, kinds)
        assert kinds[-3:] == ["router_add", "router_add", "router_listed"], (unit, kinds)
        # Drained only once every worker read 0 for settle_s: a request already on its way would have shown by then.
        readings = [e for e in pd_fleet.events(report, prefill) if e.get("unit") == unit
                    and e["type"] == "worker_inflight"]
        busy = [i for i, e in enumerate(readings) if e["value"] != 0]
        quiet = readings[busy[-1] + 1 if busy else 0:]
        # The quiet run began after the last busy reading (or at the drain's start), and its last pass began settle_s
        # later: bounds from the drain's own clock, whatever each HTTP read cost (elapsed_s is rounded to 1 ms).
        began = readings[busy[-1]]["elapsed_s"] if busy else 0.0
        assert quiet[-1]["elapsed_s"] - began >= SETTLE_S - 0.002, (unit, quiet)
        assert len({e["worker"] for e in quiet}) == 2 and len(quiet) >= 4, (unit, quiet)  # each worker twice at least


@pytest.mark.parametrize("transport", ["local", "ssh"], indirect=True)
@pytest.mark.parametrize("pd_fleet", [("--api-key", "s3cret")], indirect=True)
def test_a_router_that_refuses_the_removal_stops_the_rollout_before_anything_restarts(pd_fleet: PdFleet) -> None:
    before = pd_fleet.pids()
    code, report, output = pd_fleet.apply("pd-1,pd-2")
    assert code == 5, output
    worker = pd_fleet.worker_url("gpu-a", "prefill")
    assert f"router pd-router (http://127.0.0.1:{pd_fleet.router_port} on gpu-a) refused the removal of worker " \
           f"{worker} (gpu-a:prefill): HTTP 401" in report["error"], report["error"]
    assert "The old workers are back in router pd-router" in report["error"]
    assert report["hosts"]["gpu-c"]["status"] == "untouched"  # the rollout stopped after the first unit
    assert pd_fleet.pids() == before  # nothing restarted
    assert listed_healthy(pd_fleet) == every_worker(pd_fleet)


def test_a_worker_that_never_drains_fails_at_the_deadline_and_the_old_workers_are_put_back(pd_fleet: PdFleet) -> None:
    pd_fleet.inventory["routers"]["pd-router"]["drain_timeout_s"] = 0.5
    pd_fleet.write()
    before = pd_fleet.pids()
    # A request straight to pd-1's decode whose room its prefill never gets: it waits in the transfer queue.
    decode = pd_fleet.stacks["gpu-b"]
    conn = http.client.HTTPConnection("127.0.0.1", decode.ports["decode"], timeout=60)
    try:
        conn.request("POST", "/generate", body=json.dumps({
            "text": "stuck", "bootstrap_host": "127.0.0.1", "bootstrap_port": decode.ports["bootstrap"],
            "bootstrap_room": 12345, "sampling_params": {"max_new_tokens": 4}}),
            headers={"Content-Type": "application/json"})
        code, report, output = pd_fleet.apply("pd-1,pd-2")
    finally:
        conn.close()
    assert code == 5, output
    assert f"unit pd-1: worker {pd_fleet.worker_url('gpu-a', 'prefill')} (gpu-a:prefill) did not drain within " \
           "0.5s" in report["error"] or f"worker {pd_fleet.worker_url('gpu-b', 'decode')} (gpu-b:decode) did not " \
           "drain within 0.5s" in report["error"], report["error"]
    assert "The old workers are back in router pd-router" in report["error"]
    assert pd_fleet.pids() == before  # nothing restarted
    wait_for(lambda: listed_healthy(pd_fleet) == every_worker(pd_fleet), "every worker listed again", 10)


def test_a_unit_alone_behind_its_router_needs_allow_downtime(pd_fleet: PdFleet) -> None:
    pd_fleet.inventory["units"]["pd-2"] = {"services": ["gpu-c:prefill", "gpu-d:decode"]}  # pd-2 leaves the router
    pd_fleet.write()
    before = pd_fleet.pids()
    assert downtime_planned(pd_fleet) == [{"router": "pd-router", "units": ["pd-1"], "expected_s": None}]
    code, _, output = pd_fleet.apply("pd-1")
    assert code == 2, output
    assert "router pd-router: no other unit serves behind it while pd-1 restarts: that is downtime; pass " \
           "--allow-downtime to accept it" in output
    assert pd_fleet.pids() == before
    code, report, output = pd_fleet.apply("pd-1", "--allow-downtime")
    assert code == 0, output
    assert pd_fleet.pids()["gpu-b"]["decode"] != before["gpu-b"]["decode"]
    wait_for(lambda: {pd_fleet.worker_url("gpu-a", "prefill"), pd_fleet.worker_url("gpu-b", "decode")}
             <= listed_healthy(pd_fleet), "pd-1's workers listed again", 10)
    [planned] = downtime_planned(pd_fleet)  # now from the apply's times to healthy (prefill, then decode)
    assert planned["units"] == ["pd-1"] and isinstance(planned["expected_s"], float) and planned["expected_s"] > 0
    shown = deployer("plan", "note.yaml", "--host", "pd-1", cwd=pd_fleet.root)
    assert f"router pd-router: no other unit serves behind it while pd-1 restarts: downtime, about " \
           f"{planned['expected_s']:g}s (apply needs --allow-downtime)" in shown.stdout, shown.stdout
    applied = pd_fleet.pids()["gpu-b"]["decode"]
    refused = deployer("rollback", report["fleet_id"], cwd=pd_fleet.root)  # its rollback is the same downtime
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "router pd-router: no other unit serves behind it while pd-1 restarts: that is downtime; pass " \
           "--allow-downtime to accept it" in refused.stdout + refused.stderr
    assert pd_fleet.pids()["gpu-b"]["decode"] == applied
    rolled = deployer("rollback", report["fleet_id"], "--allow-downtime", cwd=pd_fleet.root)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert pd_fleet.pids()["gpu-b"]["decode"] != applied


def downtime_planned(fleet: PdFleet) -> list[dict[str, Any]]:
    result = deployer("plan", "note.yaml", "--host", "pd-1", "--json", cwd=fleet.root)
    assert result.returncode == 0, result.stdout + result.stderr
    downtime: list[dict[str, Any]] = json.loads(result.stdout)["downtime"]
    return downtime


def test_a_unit_naming_an_unknown_router_or_a_worker_outside_it_is_refused_with_file_line_and_field(
        tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)  # nothing started: the inventory is refused before any host connects
    fleet.inventory["units"]["pd-1"]["router"] = "nope"
    fleet.inventory["units"]["pd-2"]["workers"][1]["service"] = "gpu-a:decode"
    refused_at_load(fleet, "pd-1,pd-2",
                    r"hosts\.yaml:\d+:13: units\.pd-1\.router: 'nope' is not in routers: \(pd-router\)",
                    r"hosts\.yaml:\d+:\d+: units\.pd-2\.workers\.1\.service: 'gpu-a:decode' is not a service of "
                    r"unit 'pd-2' \(gpu-c:prefill, gpu-d:decode\)")


def refused_at_load(fleet: PdFleet, selection: str, *problems: str) -> None:
    """The inventory as written now is refused by `plan` over the selection (exit 2), naming each problem (a regex
    over its file:line:column line)."""
    fleet.write()
    result = deployer("plan", "note.yaml", "--host", selection, cwd=fleet.root)
    assert result.returncode == 2, result.stdout + result.stderr
    for problem in problems:
        assert re.search(problem, result.stderr), result.stderr


def test_the_older_sglang_router_calls_take_a_unit_out_and_put_it_back_too(pd_fleet: PdFleet) -> None:
    pd_fleet.inventory["routers"]["pd-router"]["api"] = "sglang-router"  # /remove_worker, /add_worker, /list_workers
    pd_fleet.write()
    before = pd_fleet.pids()
    code, report, output = pd_fleet.apply("pd-1")  # pd-2 serves meanwhile
    assert code == 0, output
    assert pd_fleet.pids()["gpu-a"]["prefill"] != before["gpu-a"]["prefill"]
    kinds = [e["type"] for e in pd_fleet.events(report, "gpu-a") if e["type"].startswith("router_")]
    assert kinds.count("router_remove") == 2 and kinds.count("router_add") == 2, kinds
    conn = http.client.HTTPConnection("127.0.0.1", pd_fleet.router_port, timeout=10)
    try:
        conn.request("GET", "/list_workers")
        assert set(json.loads(conn.getresponse().read())["urls"]) == every_worker(pd_fleet)
    finally:
        conn.close()
    prefill = next(w for w in pd_fleet.workers() if w["url"] == pd_fleet.worker_url("gpu-a", "prefill"))
    assert prefill["worker_type"] == "prefill" and prefill["bootstrap_port"] == pd_fleet.stacks["gpu-a"].ports[
        "bootstrap"] and prefill["is_healthy"]


def router_steps(fleet: PdFleet, run_id: str) -> list[str]:
    path = fleet.runs / run_id / "events.jsonl"
    return [e["type"] for e in map(json.loads, path.read_text().splitlines())
            if e["type"].startswith(("router_", "worker_"))]


def drained_around_restart(kinds: list[str]) -> bool:
    """Both workers removed, the router seen without them, drained, then both added and seen listed."""
    return (kinds[:3] == ["router_remove", "router_remove", "router_listed"] and "worker_inflight" in kinds
            and kinds[-3:] == ["router_add", "router_add", "router_listed"])


def test_restart_of_a_unit_behind_its_router_takes_it_out_around_the_restart_and_no_request_fails(
        pd_fleet: PdFleet) -> None:
    before = pd_fleet.pids()
    with load_through(pd_fleet, "the restart") as load:
        result = deployer("restart", "--host", "pd-1", "--json", cwd=pd_fleet.root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    assert pd_fleet.pids()["gpu-b"]["decode"] != before["gpu-b"]["decode"]
    report = json.loads(result.stdout)
    kinds = router_steps(pd_fleet, report["hosts"]["gpu-a"]["run_id"])
    assert drained_around_restart(kinds), kinds
    assert listed_healthy(pd_fleet) == every_worker(pd_fleet)


class RouterWatch:
    """The router's healthy workers, read every `interval_s` while something runs (bounded in count and time):
    what a client could be sent to at each moment."""

    def __init__(self, fleet: PdFleet, interval_s: float = 0.05, seconds: float = 120, most: int = 4000) -> None:
        self.fleet, self.interval_s, self.seconds, self.most = fleet, interval_s, seconds, most
        self.samples: list[set[str] | str] = []  # a sample, or why the router could not be read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="router-watch", daemon=True)

    def _watch(self) -> None:
        deadline = time.monotonic() + self.seconds
        while not self._stop.is_set() and time.monotonic() < deadline and len(self.samples) < self.most:
            try:
                self.samples.append(listed_healthy(self.fleet))
            except (OSError, http.client.HTTPException, ValueError, KeyError) as exc:
                self.samples.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RouterWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def without_a_unit(self) -> list[set[str] | str]:
        """The samples in which no unit had both its workers listed healthy: nothing served through the router."""
        units = [{self.fleet.worker_url(prefill, "prefill"), self.fleet.worker_url(decode, "decode")}
                 for prefill, decode in UNITS.values()]
        return [s for s in self.samples if isinstance(s, str) or not any(unit <= s for unit in units)]


def router_changes(fleet: PdFleet, run_ids: list[str]) -> list[tuple[str, str]]:
    """The units' router_remove/router_add events over several runs, in the order they happened: (unit, change)."""
    found = [(e["time"], e["unit"], e["type"]) for run_id in run_ids
             for e in map(json.loads, (fleet.runs / run_id / "events.jsonl")
                          .read_text().splitlines()) if e["type"] in ("router_remove", "router_add")]
    return [(unit, change) for _, unit, change in sorted(found)]


ONE_AT_A_TIME = [("pd-1", "router_remove")] * 2 + [("pd-1", "router_add")] * 2 + [
    ("pd-2", "router_remove")] * 2 + [("pd-2", "router_add")] * 2


def test_a_fleet_rollback_of_two_units_behind_one_router_rolls_them_one_at_a_time_and_no_request_fails(
        pd_fleet: PdFleet) -> None:
    code, report, output = pd_fleet.apply("pd-1,pd-2")
    assert code == 0, output
    applied = pd_fleet.pids()
    with load_through(pd_fleet, "the rollback") as load, RouterWatch(pd_fleet) as watch:
        result = deployer("rollback", report["fleet_id"], "--json", cwd=pd_fleet.root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    rolled = json.loads(result.stdout)
    assert rolled["batches"] == [["gpu-a", "gpu-b"], ["gpu-c", "gpu-d"]]  # the apply's rolling order
    assert len(watch.samples) > 10 and not watch.without_a_unit(), watch.without_a_unit()[:5]
    runs = [rolled["hosts"][host]["run_id"] for host in ("gpu-a", "gpu-c")]
    assert router_changes(pd_fleet, runs) == ONE_AT_A_TIME  # each unit out and back before the next leaves
    for unit, (prefill, decode) in UNITS.items():
        assert drained_around_restart(router_steps(pd_fleet, rolled["hosts"][prefill]["run_id"])), unit
        assert pd_fleet.pids()[decode]["decode"] != applied[decode]["decode"], unit
    assert listed_healthy(pd_fleet) == every_worker(pd_fleet)


# pd-1's prefill fails every direct generation (HTTP 200, finish_reason error) when it starts on the shipped note.
FAILS_ON_THE_NOTE = 'grep -q rolled sglang/srt/demo_note.py 2>/dev/null && export SGLANG_DEMO_GENERATE_FAIL=error; ' \
                    'exec "$@"'


def test_a_canary_that_fails_on_the_first_unit_rolls_it_back_into_the_router_and_the_other_unit_is_never_taken_out(
        pd_fleet: PdFleet) -> None:
    prefill = pd_fleet.inventory["hosts"]["gpu-a"]["services"]["prefill"]
    prefill["start"] = ["sh", "-c", FAILS_ON_THE_NOTE, "canary-knob", *prefill["start"]]
    pd_fleet.write()
    playbook = {**PLAYBOOK, "steps": [*PLAYBOOK["steps"], {"canary": {"service": "prefill", "max_new_tokens": 4}}],
                "on_failure": "rollback"}
    (pd_fleet.root / "note.yaml").write_text(yaml.safe_dump(playbook, sort_keys=False))
    before = pd_fleet.pids()
    with Load(f"http://127.0.0.1:{pd_fleet.router_port}/generate", timeout_s=30) as load, \
            RouterWatch(pd_fleet) as watch:
        wait_for(lambda: load.ok >= 5, "the load through the router is served before the apply", 30)
        code, report, output = pd_fleet.apply("pd-1,pd-2")
    assert code == 5, output
    assert "canary POST http://127.0.0.1:" in report["error"] and "finish_reason" in report["error"], report["error"]
    assert "Rolled back every host of the unit (gpu-a, gpu-b) and restarted it again" in report["error"]
    assert "The old workers are back in router pd-router" in report["error"], report["error"]
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    for host in ("gpu-a", "gpu-b"):
        assert report["hosts"][host]["phase"] == "rolled_back", report["hosts"][host]
    assert [report["hosts"][host]["status"] for host in ("gpu-c", "gpu-d")] == ["untouched", "untouched"]
    after = pd_fleet.pids()
    assert after["gpu-b"]["decode"] != before["gpu-b"]["decode"]  # restarted onto the old code
    assert (after["gpu-c"], after["gpu-d"]) == (before["gpu-c"], before["gpu-d"])
    assert listed_healthy(pd_fleet) == every_worker(pd_fleet)  # the old workers are listed again
    pd_2 = {pd_fleet.worker_url("gpu-c", "prefill"), pd_fleet.worker_url("gpu-d", "decode")}
    assert watch.samples and all(isinstance(s, set) and pd_2 <= s for s in watch.samples), watch.samples[:5]
    kinds = router_steps(pd_fleet, report["hosts"]["gpu-a"]["run_id"])
    assert kinds.count("router_remove") == 2 and kinds[-3:] == ["router_add", "router_add", "router_listed"], kinds


def test_the_plain_output_shows_each_router_step_of_the_unit_on_a_line(pd_fleet: PdFleet) -> None:
    result = deployer("apply", "note.yaml", "--host", "pd-1", cwd=pd_fleet.root)  # not a terminal: plain lines
    assert result.returncode == 0, result.stdout + result.stderr
    prefill, decode = pd_fleet.worker_url("gpu-a", "prefill"), pd_fleet.worker_url("gpu-b", "decode")
    lines = result.stdout.splitlines()
    where = "[gpu-a] [router pd-router] unit pd-1:"
    for expected in (f"{where} removed worker {prefill} (gpu-a:prefill)",
                     f"{where} removed worker {decode} (gpu-b:decode)",
                     f"{where} added worker {prefill} (gpu-a:prefill)",
                     f"{where} added worker {decode} (gpu-b:decode)"):
        assert expected in lines, (expected, result.stdout)
    assert any(re.fullmatch(rf"{re.escape(where)} seen to stop listing: lists http://127\.0\.0\.1:\d+, "
                            r"http://127\.0\.0\.1:\d+", line) for line in lines), result.stdout
    assert any(re.fullmatch(rf"{re.escape(where)} worker {re.escape(prefill)} \(gpu-a:prefill\) in flight: 0, "
                            r"\d+\.\ds of 20s", line) for line in lines), result.stdout
    assert any(line.startswith(f"{where} seen to list (as healthy): lists ") for line in lines), result.stdout
