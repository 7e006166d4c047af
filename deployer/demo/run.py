"""`deployer demo`: the whole story on this machine, no SSH and no configuration.

A scratch git repo holds the buggy serving stack; its prefill, decode and router run as
real processes (started the way deployer's co_restart starts services, so the apply finds
their PIDs); then the demo playbook runs on it as a `local` host. With `--fleet` the same stack is
split over four local hosts (each its own repo) as two prefill/decode units, deployed as one fleet
run. Every process started here is stopped again unless the caller keeps the stacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from deployer.app.watch import Watch, Watched, watching
from deployer.build import Build
from deployer.config.models import Inventory, LocalHost, Unit, resolve_env
from deployer.config.routers import SGLANG_INFLIGHT, Router, RouterWorker
from deployer.demo.judged import judged_playbook
from deployer.demo.load import Load, LoadReport
from deployer.demo.proof import RouterProof, prove
from deployer.errors import ConfigError, DeployerError, VerificationFailed
from deployer.fleet.record import FleetState
from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel
from deployer.run.engine import RunResult
from deployer.runlog import read_run
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Listener

STACK = Path(__file__).parent / "stack"
PLAYBOOK = Path(__file__).parent / "playbook" / "kvpoll-fix.yaml"  # package data: works from a wheel too
HOST = "demo"
KEPT = "kept.json"  # written by --keep in the workdir: the one sign `demo --stop` goes by
# Written in the workdir once the demo's stack is stopped (at its end, or by `demo --stop`): the one sign that its
# files (repo, inventory, run log) are no demo's in progress, and `demo --stop` may remove them.
STOPPED = "stopped"
GAUGE = "sglang:num_prefill_inflight_queue_reqs"


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status of a GET from this machine (the demo's own stack), None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


SERVICES = ("prefill", "decode", "router")  # the order an operator brings them up in


PORT_NAMES = (*SERVICES, "bootstrap")  # a unit's ports


def unit_ports(units: int, chosen: Sequence[int] = ()) -> list[dict[str, int]]:
    """Each PD unit's ports on 127.0.0.1, shared by the hosts it spans (all of them on this machine): `chosen`
    (len(PORT_NAMES) a unit), else free ones, every socket bound until all are chosen so that no two are the same."""
    names = PORT_NAMES
    if chosen and (len(chosen) != units * len(names) or len(set(chosen)) != len(chosen)):
        raise ValueError(f"{units} unit(s) need {units * len(names)} distinct ports, not {list(chosen)}")
    with contextlib.ExitStack() as held:
        ports = list(chosen)
        while len(ports) < units * len(names):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
    return [dict(zip(names, ports[i * len(names):(i + 1) * len(names)], strict=True)) for i in range(units)]


@dataclass
class DemoStack:
    """One host of the demo: a scratch repo of the stack and the services of its unit that run there."""

    workdir: Path
    ports: dict[str, int] = field(default_factory=dict)
    runs: tuple[str, ...] = SERVICES  # the unit's services this host runs
    # The units whose prefill and decode its router sends traffic to (by default its own), and where its storms
    # go when it runs no router (the fleet demo's one router, on another host).
    fronts: list[dict[str, int]] = field(default_factory=list)
    endpoint: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the services' knobs (deployer/demo/stack's demo_knobs.py)
    server_args: tuple[str, ...] = ()  # more of SGLang's flags for prefill and decode

    @property
    def repo(self) -> Path:
        return self.workdir / "repo"

    @property
    def state(self) -> Path:
        return self.repo / ".git" / "deployer"

    def url(self, service: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}{path}"

    def host(self) -> LocalHost:
        py = sys.executable
        p = self.ports
        common = ["--model-path", "demo-model", "--disaggregation-transfer-backend", "nixl",
                  "--disaggregation-bootstrap-port", str(p["bootstrap"]), "--enable-metrics", *self.server_args]
        start = {
            "prefill": [py, "-m", "sglang.launch_server", "--disaggregation-mode", "prefill",
                        "--port", str(p["prefill"]), *common],
            "decode": [py, "-m", "sglang.launch_server", "--disaggregation-mode", "decode",
                       "--port", str(p["decode"]), "--base-gpu-id", "1", *common],
            "router": [py, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--port", str(p["router"]),
                       *(arg for unit in self.fronts or [p] for arg in (
                           "--prefill", f"http://127.0.0.1:{unit['prefill']}", str(unit["bootstrap"]),
                           "--decode", f"http://127.0.0.1:{unit['decode']}"))],
        }
        services = {name: {"start": start[name], "cwd": "python", "health": self.url(name, "/health"),
                           "health_timeout_s": 30, "stop_grace_s": 5} for name in self.runs}
        facts = {}
        gauge = next((name for name in ("prefill", "decode") if name in self.runs), None)
        if gauge is not None:  # the symptom's gauge lives on prefill
            facts["metrics"] = self.url(gauge, "/metrics")
        endpoint = self.url("router", "") if "router" in self.runs else self.endpoint
        if endpoint is not None:  # where a storm goes
            facts["endpoint"] = endpoint
        return LocalHost.model_validate({
            "transport": "local", "repo": str(self.repo), "python": py,
            "env": {"PYTHONDONTWRITEBYTECODE": "1", **self.env}, "services": services, "lock_ttl_s": 60, **facts})

    def create(self) -> None:
        shutil.copytree(STACK, self.repo, ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache", "*.pyc"))
        (self.repo / ".gitignore").write_text("__pycache__/\n")
        for args in (("init", "-q", "-b", "main"), ("add", "-A"),
                     ("-c", "user.name=demo", "-c", "user.email=demo@localhost", "commit", "-q", "-m",
                      "sglang demo stack (buggy: KVPoll terminal states are not sticky)")):
            subprocess.run(["git", *args], cwd=self.repo, check=True, capture_output=True)
        if not self.ports:  # a stack of its own; the hosts of a unit are given their unit's ports
            self.ports = unit_ports(1)[0]

    def launch(self, name: str) -> None:
        """Start one service as co_restart would (its own session, its pid file where deployer reads it)."""
        host = self.host()
        service = host.services[name]
        assert service.start is not None
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(service.start, cwd=self.repo / "python", stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **resolve_env(host.env)})
        # Whole or not there: `demo --stop` (another process) may read it at any moment.
        temp = self.state / f".{name}.pid.tmp"
        temp.write_text(f"{proc.pid}\n")
        os.replace(temp, self.state / f"{name}.pid")

    def pids(self) -> dict[str, int]:
        """The pid in each service's pid file; one that holds no number (a file of another's) names none."""
        found = {}
        for path in self.state.glob("*.pid") if self.state.exists() else ():
            text = path.read_text(errors="replace").strip()
            if text.isdecimal() and text.isascii():
                found[path.stem] = int(text)
        return found

    def live_pids(self) -> dict[str, int]:
        """The stack's processes still running. A pid file can outlive its process and the number be
        reused, so a pid counts only while its process runs in this stack's repo."""
        live = {}
        for name, pid in self.pids().items():
            try:
                cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                continue
            if process_alive(pid) and cwd.is_relative_to(self.repo.resolve()):
                live[name] = pid
        return live

    def stop(self) -> None:
        live = self.live_pids()
        for pid in live.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for pid in live.values():
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def start_stacks(stacks: list[DemoStack], cancel: CancelToken) -> None:
    """Bring the 'production' stacks up, as an operator would have before the hotfix: every host's
    service of one kind at once, healthy before the next kind starts (a router waits for its workers)."""
    for name in SERVICES:
        chosen = [stack for stack in stacks if name in stack.runs]
        for stack in chosen:
            stack.launch(name)
        for stack in chosen:
            wait_healthy(stack.url(name, "/health"), 30, cancel, stack.state / f"{name}.log")


def process_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan can linger unreaped for a while)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] != "Z"


def stacks_in(directory: Path) -> list[DemoStack]:
    """The demo's hosts in a workdir: the single demo's one repo, or one per host of the fleet demo."""
    if (directory / "repo" / ".git").is_dir():
        return [DemoStack(directory)]
    return [DemoStack(d) for d in sorted(directory.iterdir()) if (d / "repo" / ".git").is_dir()] \
        if directory.is_dir() else []


def kept_workdirs() -> list[Path]:
    """Demos that --keep left in the default place (a temp dir named deployer-demo-*). Only the record
    --keep writes counts: a demo running there without it is someone's demo in progress."""
    return [d for d in sorted(Path(tempfile.gettempdir()).glob("deployer-demo-*")) if (d / KEPT).is_file()]


def stop_kept_stacks(workdir: Path | None,
                     found: Callable[[Path], list[DemoStack]] = stacks_in) -> dict[Path, dict[str, int]]:
    """Stop what `deployer demo --keep` left running: in workdir, or in the one kept demo in the temp dir.
    Empty when nothing was kept there. `found` reads a workdir's stacks (the container demo's knows its own)."""
    if workdir is not None:
        if not found(workdir):
            raise ConfigError(f"{workdir} holds no demo (no repo/.git there, nor in a host directory)")
        chosen = [workdir] if (workdir / KEPT).is_file() else []
    else:
        chosen = kept_workdirs()
        if len(chosen) > 1:
            raise ConfigError("several kept demos are running; pick one with --workdir: "
                              + ", ".join(map(str, chosen)))
    stopped = {}
    for directory in chosen:
        for stack in found(directory):
            stopped[stack.workdir] = stack.live_pids()
            stack.stop()
            still = stack.live_pids()
            if still:
                raise DeployerError(f"{stack.workdir}: still running after SIGKILL: {still}")
        (directory / KEPT).unlink()
        (directory / STOPPED).touch()
    return stopped


def remove_stopped(workdir: Path | None) -> list[Path]:
    """Remove the files of stopped demos: workdir's, or this user's in the default place (the temp dir, which
    other users share: root's --stop would remove theirs too); a demo still running, or kept, is left alone.
    The directories removed."""
    chosen = [workdir] if workdir is not None else [
        directory for directory in sorted(Path(tempfile.gettempdir()).glob("deployer-demo-*"))
        if directory.lstat().st_uid == os.getuid()]
    removed = [directory for directory in chosen if (directory / STOPPED).is_file()]
    for directory in removed:
        shutil.rmtree(directory)
    return removed


def size_of(directory: Path) -> int:
    """The bytes of every file under directory."""
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file() and not path.is_symlink())


def wait_healthy(url: str, seconds: float, cancel: CancelToken, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while http_status(url) != 200:
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise DeployerError(f"demo stack: {url} did not become healthy in {seconds:g}s\n{tail}")
        cancel.wait(0.1)


T = TypeVar("T")


def serve(workdir: Path | None, stacks: Callable[[Path], dict[str, DemoStack]],
          inventory_of: Callable[[dict[str, DemoStack]], Inventory], keep: bool, cancel: CancelToken,
          deploy: Callable[[Path, dict[str, DemoStack], Inventory], T]) -> T:
    """Make the demo's hosts (their repos and inventory) in workdir, start their stacks, deploy; then stop
    every process started here unless the caller keeps them (and the deploy got that far)."""
    directory = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="deployer-demo-"))
    if directory.is_dir() and any(directory.iterdir()):  # its hosts.yaml, runs and repos would mix with others
        raise ConfigError(f"--workdir {directory} is not empty; give a new or empty directory")
    directory.mkdir(parents=True, exist_ok=True)
    made = stacks(directory)
    kept = False
    try:
        for stack in made.values():
            stack.create()
        inventory = inventory_of(made)
        (directory / "hosts.yaml").write_text(
            yaml.safe_dump(inventory.model_dump(exclude_defaults=True), sort_keys=False))
        start_stacks(list(made.values()), cancel)
        outcome = deploy(directory, made, inventory)
        if keep:  # what `demo --stop` may stop: nothing without this record
            (directory / KEPT).write_text(json.dumps({str(s.workdir): s.live_pids() for s in made.values()}))
        kept = keep
        return outcome
    finally:
        if not kept:
            for stack in made.values():
                stack.stop()
            (directory / STOPPED).touch()


@dataclass
class DemoOutcome:
    stack: DemoStack
    result: RunResult
    kept: bool


def run_demo(workdir: Path | None, *, keep: bool, watch: Watch | None = None,
             stack: Callable[[Path], DemoStack] = DemoStack) -> DemoOutcome:
    """The demo playbook on one local host; `stack` makes that host's stack (the container demo's, say). The
    demo is one run to the caller's watch (as app's use cases hand theirs), from its stack's start on."""
    cancel = CancelToken()
    listeners: list[Listener] = []

    def deploy(directory: Path, stacks: dict[str, DemoStack], inventory: Inventory) -> DemoOutcome:
        build = Build(directory / "runs", listeners=tuple(listeners))
        engine = build.engines(PLAYBOOK, {HOST: inventory.hosts[HOST]}, cancel=cancel)[HOST]
        return DemoOutcome(stacks[HOST], engine.apply(), keep)

    with watching(watch, Watched("host", [HOST], cancel, listeners)):
        return serve(workdir, lambda directory: {HOST: stack(directory)}, hosts_of, keep, cancel, deploy)


def hosts_of(stacks: dict[str, DemoStack]) -> Inventory:
    return Inventory(hosts={name: stack.host() for name, stack in stacks.items()})


# -- `deployer demo --fleet`: two PD units over four hosts behind one router, rolled one at a time -----------

FLEET = {"pd-1": ("gpu-a", "gpu-b"), "pd-2": ("gpu-c", "gpu-d")}  # unit: its prefill host, its decode host
ROUTER, ROUTER_HOST = "pd-router", "gpu-a"  # the one router both units are behind, beside pd-1's prefill
# A loaded server's time to first token (its simulated wait a median of 0.2 s, with a long slow tail), which the
# analysis judges, in buckets 0.1 s wide up to 3 s (SGLang's own are 1 s wide from 1 s to 2 s, 2 s wide above: a p99
# there moves little whatever the build does; docs/how-to/analysis.md "Buckets decide what can be seen").
FLEET_ENV = {"SGLANG_DEMO_TTFT_S": "0.2"}
FLEET_ARGS = ("--bucket-time-to-first-token", *(f"{n / 10:g}" for n in range(1, 31)), "4", "6", "8", "10")
# What a removed worker must finish before it stops: every in-flight gauge but the prefill inflight queue, which the
# bug this rollout fixes leaves stuck (it never drains on the old code).
DEMO_INFLIGHT = [gauge for gauge in SGLANG_INFLIGHT if gauge != GAUGE]


def fleet_hosts() -> list[str]:
    return [host for pair in FLEET.values() for host in pair]


def fleet_stacks(directory: Path) -> dict[str, DemoStack]:
    """Each host its own repo under directory; the router on gpu-a sends traffic to both units, and every
    unit's storms go through it (as a client's requests do)."""
    ports = unit_ports(len(FLEET))
    router = f"http://127.0.0.1:{ports[0]['router']}"
    stacks = {}
    for (prefill, decode), unit in zip(FLEET.values(), ports, strict=True):
        runs = ("prefill", "router") if prefill == ROUTER_HOST else ("prefill",)
        stacks[prefill] = DemoStack(directory / prefill, {**unit, "router": ports[0]["router"]}, runs, ports, router,
                                    FLEET_ENV, FLEET_ARGS)
        stacks[decode] = DemoStack(directory / decode, unit, ("decode",), env=FLEET_ENV, server_args=FLEET_ARGS)
    return stacks


def fleet_inventory(stacks: dict[str, DemoStack]) -> Inventory:
    """The four hosts, the router, and the units behind it with their workers as the router knows them."""
    router = stacks[ROUTER_HOST]
    units = {name: Unit(services=[f"{prefill}:prefill", f"{decode}:decode"], metrics=prefill, router=ROUTER,
                        workers=[RouterWorker(service=f"{prefill}:prefill", worker_type="prefill",
                                              bootstrap_port=stacks[prefill].ports["bootstrap"]),
                                 RouterWorker(service=f"{decode}:decode", worker_type="decode")])
             for name, (prefill, decode) in FLEET.items()}
    routers = {ROUTER: Router(host=ROUTER_HOST, url=router.url("router", ""), inflight=DEMO_INFLIGHT,
                              drain_timeout_s=30, interval_s=0.1)}
    return Inventory(hosts={name: stack.host() for name, stack in stacks.items()}, routers=routers, units=units)


@dataclass
class FleetDemoOutcome:
    workdir: Path
    stacks: dict[str, DemoStack]
    state: FleetState
    load: LoadReport  # the clients' requests through the router during the rollout
    kept: bool
    proof: RouterProof | None = None  # the storm through the router after a rollout that succeeded

    @property
    def runs(self) -> Path:
        return self.workdir / "runs"

    @property
    def router_url(self) -> str:
        return self.stacks[ROUTER_HOST].url("router", "")

    @property
    def exit_code(self) -> int:
        """The fleet run's; a client request that failed, or a gauge the proof through the router saw stay up,
        fails a demo that promises neither."""
        failed = self.load.failed or (self.proof is not None and self.proof.error)
        return self.state.exit_code or (VerificationFailed.exit_code if failed else 0)

    @property
    def error(self) -> str | None:
        if self.state.error:
            return self.state.error
        problems = [f"load: {self.load.failed} of {self.load.sent} client requests through router {ROUTER} failed "
                    f"during the rollout (first: {'; '.join(self.load.failures)})"] if self.load.failed else []
        if self.proof is not None and self.proof.error:
            problems.append(f"proof through router {ROUTER}: {self.proof.error}")
        return "\n".join(problems) or None

    def unit_events(self) -> dict[str, list[dict[str, Any]]]:
        """Each unit's run log on its metrics host: where its baseline and drain samples are."""
        found = {}
        for unit, (prefill, _) in FLEET.items():
            run_id = self.state.hosts[prefill].run_id
            try:
                found[unit] = read_run(self.runs, run_id).events if run_id else []
            except DeployerError:
                found[unit] = []
        return found

    def analyses(self) -> dict[str, dict[str, Any] | None]:
        """Per unit: its analysis's outcome and each check's (None: it did not judge), from its run log."""
        found: dict[str, dict[str, Any] | None] = {}
        for unit, events in self.unit_events().items():
            judged = [e for e in events if e.get("type") == "analysis"]
            found[unit] = None if not judged else {
                "outcome": judged[-1].get("outcome"),
                "checks": {str(v.get("check")): v.get("outcome") for v in judged[-1].get("verdicts") or []}}
        return found

    def gauges(self) -> dict[str, dict[str, float | None]]:
        """Per unit: the gauge the baseline left (the bug) and the drain's last sample."""
        def last(events: list[dict[str, Any]], step: str) -> float | None:
            values = [e.get("value") for e in events
                      if e.get("type") == "sample" and e.get("step") == step and e.get("metric") == GAUGE]
            return values[-1] if values else None
        return {unit: {"before": last(events, "baseline"), "after": last(events, "drain")}
                for unit, events in self.unit_events().items()}


# Steady and light (2 cores run the whole demo; a request mostly waits), bounded well past the rollout's minute or
# so; enough requests that each side of a unit's analysis counts 20 or more in its short windows, the regression's
# slower side too (deployer/demo/judged.py). Not many more: each is a request queued at a prefill's 4 KV transfer
# workers, and on a loaded machine the old build's p99 time to first token read up to 2.8 s under 12, 2.1 s under 6.
LOAD: dict[str, Any] = {"clients": 10, "max_requests": 5000, "seconds": 300.0, "timeout_s": 10.0, "pause_s": 0.05}
# The rollout starts once the load is steady: the first unit's before-windows are read right away, and requests
# served while every stack, the router and the clients were still starting are no baseline a later unit gets.
WARM_UP_REQUESTS, WARM_UP_WITHIN_S = 3 * LOAD["clients"], 30.0


def run_fleet_demo(workdir: Path | None, *, keep: bool, watch: Watch | None = None,
                   regression: bool = False) -> FleetDemoOutcome:
    """The demo playbook, judged by an analysis too (deployer/demo/judged.py), as one rolling fleet run: one unit at
    a time read in windows, taken out of the router, its hosts shipped, committed and restarted as one, drained on
    its prefill host, put back and read again, while clients send requests through the router the whole time; then,
    every unit back, the playbook's storm through the router and every unit drained (deployer/demo/proof.py).
    `regression`: the fix ships a slower build, which the first unit's analysis fails and its rollback undoes."""
    def deploy(directory: Path, stacks: dict[str, DemoStack], inventory: Inventory) -> FleetDemoOutcome:
        build = Build(directory / "runs", str(directory / "hosts.yaml"))  # the router's host is connected by name
        playbook = judged_playbook(directory, PLAYBOOK, STACK, regression=regression)
        engines = build.engines(playbook, dict(inventory.hosts))
        fleet = build.fleet_apply(engines, dict(inventory.units), parallel=DEFAULT_PARALLEL, cancel=cancel,
                                  listeners=listeners, inventory=inventory)
        load = Load(stacks[ROUTER_HOST].url("router", "/generate"), **LOAD).start()
        try:
            load.served(WARM_UP_REQUESTS, WARM_UP_WITHIN_S, cancel)
            state = fleet.run()
        finally:
            report = load.stop()
        proof = None if state.status != "successful" else prove(
            stacks[ROUTER_HOST].url("router", ""), {unit: stacks[prefill].url("prefill", "/metrics")
                                                    for unit, (prefill, _) in FLEET.items()}, PLAYBOOK, cancel)
        return FleetDemoOutcome(directory, stacks, state, report, keep, proof)

    cancel = FleetCancel()
    listeners: list[Listener] = []
    with watching(watch, Watched("fleet", fleet_hosts(), cancel, listeners)):
        return serve(workdir, fleet_stacks, fleet_inventory, keep, cancel, deploy)

