"""Failed client requests, p99 latency and the apply's wall time while PD units restart behind one router (issues 22
and 37): (a) today's unit restart (every unit in one batch, the router never told) against (b) the rolling restart
with router drain (one unit at a time taken out, drained, restarted, put back) and (c) the same with
`max_unavailable: 25%` (a quarter of the units out at once), for 2 and 4 units, under the same steady load.

Run by hand (never in CI): python bench/bench_rollout.py [--units 2 4 16] [--runs 1] [--ways b c] [--breakdown]
[--startup-s S]
Everything is the demo stack on 127.0.0.1 (local hosts, one repo each); every process started is stopped.
The ways take turns run by run (b c b c, not b b c c), so that each run of a way has a run of the others beside it
under about the same load from the rest of the machine: each run's ratio to one-at-a-time is printed, and their spread
says how noisy the machine was. cpu s is the CPU the apply and its agents used (user + system): on a shared machine
it moves less than the wall time does.
--startup-s S gives the stand-in servers S seconds of warm-up (SGLANG_DEMO_STARTUP_S; their own default is 0.3 s,
where a real server loads its model for tens of seconds to minutes): with 0.3 s a restart is mostly deployer's own
work and the machine's CPU, which units restarted side by side share; with more, the waits a batch overlaps.
--breakdown adds, per batch, where its wall time went (read from the runs' logs): the median over the batch's
units of each phase on the unit's leader (its first host, which takes the unit out of the router and back), and the
batch's span from its first run's start to its last run's end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deployer.demo.load import Load, LoadReport
from deployer.demo.run import DEMO_INFLIGHT, DemoStack, start_stacks, unit_ports
from deployer.steps.cancel import CancelToken

TODAY, ROLLING, WIDE = "(a) unit restart, no drain", "(b) rolling + router drain", "(c) rolling, 25% at once"
# each way: the playbook's rollout (None: none), and whether the units are behind the router in the inventory
WAYS: dict[str, tuple[dict[str, Any] | None, bool]] = {
    TODAY: (None, False), ROLLING: ({"strategy": "rolling"}, True),
    WIDE: ({"strategy": "rolling", "max_unavailable": "25%"}, True)}
NOTE = {"name": "note", "files": [{"src": "note.py", "dest": "python/sglang/srt/demo_note.py", "create": True}],
        "steps": ["upload", {"commit": {"message": "bench: a note"}}, "co_restart"], "on_failure": "restore"}
LOAD: dict[str, Any] = {"clients": 4, "max_requests": 20000, "seconds": 300.0, "timeout_s": 10.0, "pause_s": 0.02}


def fleet(root: Path, units: int, rollout: dict[str, Any] | None, routed: bool) -> tuple[list[DemoStack], str]:
    """`units` PD units (prefill host, decode host), the router on the first prefill host fronting all of them."""
    ports = unit_ports(units)
    router = f"http://127.0.0.1:{ports[0]['router']}"
    stacks: dict[str, DemoStack] = {}
    spec: dict[str, Any] = {}
    for n, unit in enumerate(ports):
        prefill, decode = f"p{n}", f"d{n}"
        runs = ("prefill", "router") if n == 0 else ("prefill",)
        stacks[prefill] = DemoStack(root / prefill, {**unit, "router": ports[0]["router"]}, runs, ports, router)
        stacks[decode] = DemoStack(root / decode, unit, ("decode",))
        spec[f"pd-{n}"] = {"services": [f"{prefill}:prefill", f"{decode}:decode"]}
        if routed:
            spec[f"pd-{n}"] |= {"router": "r", "workers": [
                {"service": f"{prefill}:prefill", "worker_type": "prefill", "bootstrap_port": unit["bootstrap"]},
                {"service": f"{decode}:decode", "worker_type": "decode"}]}
    for stack in stacks.values():
        stack.create()
    inventory: dict[str, Any] = {"hosts": {n: s.host().model_dump(exclude_defaults=True) for n, s in stacks.items()},
                                 "units": spec}
    if routed:
        inventory["routers"] = {"r": {"host": "p0", "url": router, "inflight": DEMO_INFLIGHT, "interval_s": 0.1}}
    (root / "hosts.yaml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    (root / "note.py").write_text("NOTE = 'rolled'\n")
    (root / "note.yaml").write_text(yaml.safe_dump(NOTE if rollout is None else {**NOTE, "rollout": rollout}))
    return list(stacks.values()), router


# A unit's leader's run (the unit's first host, whose run takes the unit out of the router and back), cut at these
# events (the first of each kind): lock and preflight, ship and commit, the connection to the router's host (a unit
# not on it opens its own), the workers removed and unlisted, drained, the services stopped, started and healthy, and
# back into the router with the lock released.
PHASES = (("preflight", "run_start", "status"), ("ship", "status", "step_end:commit"),
          ("router conn", "step_end:commit", "router_remove"), ("unlisted", "router_remove", "router_listed"),
          ("drained", "router_listed", "step_start:co_restart"), ("stop", "step_start:co_restart", "service_stopped"),
          ("start", "service_stopped", "step_end:co_restart"), ("back+end", "step_end:co_restart", "run_end"))


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def breakdown(runs: Path) -> list[tuple[int, float, dict[str, float]]]:
    """Per batch of the fleet run in `runs`: its span in seconds and the median of each phase over its leaders."""
    [record] = [json.loads(p.read_text()) for p in runs.glob("*/fleet.json")]
    logs: dict[str, list[dict[str, Any]]] = {}
    for path in runs.glob("*/events.jsonl"):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        logs[events[0]["host"]] = events
    found = []
    for number, hosts in enumerate(record["batches"]):
        ran = [logs[h] for h in hosts if h in logs]
        span = max(at(e[-1]) for e in ran) - min(at(e[0]) for e in ran)
        phases: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}
        leaders = [hosts_of[0] for hosts_of in record["units"].values() if hosts_of[0] in hosts]
        for events in (logs[h] for h in leaders if h in logs):
            first: dict[str, float] = {}
            for event in events:
                for key in (event["type"], f"{event['type']}:{event.get('step')}"):
                    first.setdefault(key, at(event))
            for name, start, end in PHASES:
                if start in first and end in first:
                    phases[name].append(first[end] - first[start])
        found.append((number, span, {name: statistics.median(v) for name, v in phases.items() if v}))
    return found


@dataclass(frozen=True)
class Ran:
    """One apply under the load: the load's report, the apply's exit code, its wall time and the CPU it and its
    agents used, in seconds."""

    report: LoadReport
    code: int
    wall: float
    cpu: float


def one_run(units: int, way: str, breakdown_of: list[tuple[int, float, dict[str, float]]] | None = None) -> Ran:
    """The apply under the load; the runs' breakdown into breakdown_of when given."""
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        root = Path(tmp)
        stacks, router = fleet(root, units, *WAYS[way])
        try:
            start_stacks(stacks, CancelToken())
            load = Load(router + "/generate", **LOAD).start()
            try:
                began, used = time.monotonic(), children_cpu()
                done = subprocess.run([sys.executable, "-m", "deployer", "apply", "note.yaml", "--host",
                                       ",".join(f"pd-{n}" for n in range(units)), "--json"], cwd=root,
                                      env={**os.environ, "DEPLOYER_RUNS_DIR": str(root / "runs")},  # not the user's
                                      capture_output=True, text=True, timeout=1800)
                wall, cpu = time.monotonic() - began, children_cpu() - used
            finally:
                report = load.stop()
            if breakdown_of is not None and done.returncode == 0:
                breakdown_of.extend(breakdown(root / "runs"))
        finally:
            for stack in stacks:
                stack.stop()
    return Ran(report, done.returncode, wall, cpu)


def children_cpu() -> float:
    """User and system CPU of the children waited for so far: the apply, with its agents (which it waits for)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--ways", nargs="+", choices=[way[1] for way in WAYS], default=[way[1] for way in WAYS],
                        help="the ways compared, by letter (default: all)")
    parser.add_argument("--breakdown", action="store_true", help="where each batch's wall time went")
    parser.add_argument("--startup-s", type=float, help="the stand-in servers' warm-up (default: their own, 0.3 s)")
    args = parser.parse_args()
    if args.startup_s is not None:  # read by every server, the first start's (start_stacks) and each restart's
        os.environ["SGLANG_DEMO_STARTUP_S"] = str(args.startup_s)
    print(f"stand-in servers' warm-up: {os.environ.get('SGLANG_DEMO_STARTUP_S', '0.3 (their default)')} s")
    rows = []
    broken: list[tuple[int, str, list[tuple[int, float, dict[str, float]]]]] = []
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ways = [way for way in WAYS if way[1] in args.ways]
    for units in args.units:
        splits: dict[str, list[tuple[int, float, dict[str, float]]]] = {way: [] for way in ways}
        got: dict[str, list[Ran]] = {way: [] for way in ways}
        for _ in range(args.runs):  # the ways take turns: each run beside the others' under the same load
            for way in ways:
                got[way].append(one_run(units, way, splits[way] if args.breakdown else None))
        broken += [(units, way, splits[way]) for way in ways]
        for way, runs in got.items():
            sent = sum(r.report.sent for r in runs)
            failed = sum(r.report.failed for r in runs)
            p99 = statistics.median(r.report.p99_ms for r in runs if r.report.p99_ms is not None) if sent else None
            rows.append((units, way, sent, failed, p99, statistics.median(r.wall for r in runs),
                         statistics.median(r.cpu for r in runs), ",".join(str(r.code) for r in runs)))
        if ROLLING in got:
            for way, runs in ((way, runs) for way, runs in got.items() if way != ROLLING):
                ratios = [r.wall / alone.wall for r, alone in zip(runs, got[ROLLING], strict=True)]
                print(f"{units} units, {way} against {ROLLING}, run by run: "
                      + " ".join(f"{ratio:.2f}x" for ratio in ratios) + f" (median {statistics.median(ratios):.2f}x)")
    print(f"{'units':>5}  {'restart':<28} {'sent':>6} {'failed':>6} {'p99 ms':>8} {'wall s':>7} {'cpu s':>6}  "
          "apply exit")
    for units, way, sent, failed, p99, wall, cpu, codes in rows:
        print(f"{units:>5}  {way:<28} {sent:>6} {failed:>6} {f'{p99:.1f}' if p99 is not None else '-':>8} {wall:>7.1f} "
              f"{cpu:>6.1f}  {codes}")
    by_units: dict[int, dict[str, float]] = {}
    for units, way, *_, wall, _, _ in rows:
        by_units.setdefault(units, {})[way] = wall
    for units, walls in by_units.items():
        if ROLLING in walls:
            print(f"{units} units, median wall time against {ROLLING}: " + ", ".join(
                f"{way} {wall / walls[ROLLING]:.2f}x" for way, wall in walls.items()))
    for units, way, split in broken:
        if not split:
            continue
        print(f"\n{units} units, {way}: per batch (a run's batches; medians over the batch's units' leader hosts)")
        print(f"{'batch':>5} {'span s':>7}  " + " ".join(f"{name:>11}" for name, _, _ in PHASES))
        for number, span, phases in split:
            print(f"{number:>5} {span:>7.2f}  " + " ".join(
                f"{phases[name]:>11.2f}" if name in phases else f"{'-':>11}" for name, _, _ in PHASES))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
