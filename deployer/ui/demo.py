"""The demo's reports: the gauge before and after, the samples, what to run next; what --stop stopped."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from deployer.command import quote
from deployer.ui.chart import num, show_chart
from deployer.ui.checks import checks_of
from deployer.ui.report import events_of, pid_text

if TYPE_CHECKING:  # the demo is not loaded by any other command
    from deployer.demo.run import DemoOutcome, FleetDemoOutcome


def show_demo(console: Console, outcome: DemoOutcome) -> None:
    from deployer.demo.run import GAUGE
    from deployer.run.shown import shown_state_of

    result, stack = outcome.result, outcome.stack
    facts = result.facts
    events = events_of(result)
    runs = stack.workdir / "runs"
    reverted = facts.get("rollback_commit")
    console.rule("demo report")
    gauge = [check.line() for check in checks_of(events) if check.metric == GAUGE]
    rows = [
        *((("gauge" if i == 0 else "", line) for i, line in enumerate(gauge or ["-"]))),
        ("pids", pid_text(facts) or "-"),
        *([("", f"after the rollback: {pid_text(facts, 'rollback_pids')}")] if facts.get("rollback_pids") else []),
        ("commit", f"{result.git_after or '-'} (was {result.git_before or '-'})"
                   + (f"; reverted by {reverted}" if reverted else "")),
        ("run", f"{result.run_id}: {shown_state_of(runs, result.run_id, result.phase)}"),  # as apply says it
        ("run log", f"deployer runs show {result.run_id} --runs-dir {runs}"),
        ("rollback", rollback_row(result.run_id, stack.workdir, outcome.kept,
                                  f"the run rolled itself back: {reverted[:12]} reverts its commit" if reverted
                                  else None if result.git_after else "the run made no commit: nothing to roll back")),
    ]
    for key, value in rows:
        console.print(f"  {key:<9} {value}", markup=False, highlight=False)
    show_chart(console, events)
    if outcome.kept:
        console.print("  the stack is still running (--keep):", markup=False)
        for name in ("router", "prefill", "decode"):
            console.print(f"    {name:<8} {stack.url(name, '')}  (metrics {stack.url(name, '/metrics')})",
                          markup=False, highlight=False)
        console.print(f"  stop it with: deployer demo --stop --workdir {stack.workdir}", markup=False,
                      highlight=False)
    else:
        console.print("  every process the demo started has been stopped", markup=False)
    show_files(console, stack.workdir)


def show_fleet_demo(console: Console, outcome: FleetDemoOutcome) -> None:
    """After the fleet table: each unit's gauge before and after, its samples, and what to run next."""
    from deployer.demo.run import FLEET, GAUGE

    runs, fleet_id = outcome.runs, outcome.state.fleet_id
    console.rule("demo report")
    events = outcome.unit_events()
    for unit, gauge in outcome.gauges().items():
        prefill, decode = FLEET[unit]
        console.print(f"  {unit:<6} {GAUGE}: {num(gauge['before'])} before the fix -> {num(gauge['after'])} after "
                      f"(prefill on {prefill}, decode on {decode})", markup=False, highlight=False)
        show_chart(console, events[unit])
    committed = any(run.git_after for run in outcome.state.hosts.values())
    load = outcome.load
    console.print(f"  load   {load.sent} requests through the router during the rollout: {load.ok} ok, "
                  f"{load.failed} failed (p50 {num(load.p50_ms)} ms, p99 {num(load.p99_ms)} ms)",
                  markup=False, highlight=False)
    if outcome.proof is not None:
        console.print(f"  proof  {outcome.proof.describe()}", markup=False, highlight=False)
    for key, value in (("run log", f"deployer runs show {fleet_id} --runs-dir {runs}"),
                       ("rollback", rollback_row(fleet_id, outcome.workdir, outcome.kept, None if committed
                                                 else "no host made a commit: nothing to roll back"))):
        console.print(f"  {key:<9} {value}", markup=False, highlight=False)
    if outcome.kept:
        console.print(f"  the stacks are still running (--keep), behind router {outcome.router_url}:", markup=False,
                      highlight=False)
        for unit, (prefill, _) in FLEET.items():
            console.print(f"    {unit:<8} metrics {outcome.stacks[prefill].url('prefill', '/metrics')}",
                          markup=False, highlight=False)
        console.print(f"  stop them with: deployer demo --stop --workdir {outcome.workdir}", markup=False,
                      highlight=False)
    else:
        console.print("  every process the demo started has been stopped", markup=False)
    show_files(console, outcome.workdir)


def show_files(console: Console, workdir: Path) -> None:
    """Where the demo left its files (its repos, inventory and run logs) and what removes them."""
    from deployer.demo.run import size_of

    console.print(f"  files    {workdir} ({size_of(workdir) / 1e6:.1f} MB: the demo's repo, inventory and run log); "
                  f"{quote(['deployer', 'demo', '--stop', '--workdir', str(workdir)])} removes them", markup=False,
                  highlight=False)


def rollback_row(run_id: str, workdir: Path, kept: bool, why_not: str | None) -> str:
    """The rollback command, only where it works as printed: a commit of the run left to undo, and the stack it
    restarts still running (--keep). The export lets the commands deployer suggests on the way (`deployer
    rollback RUN`, `deployer recover RUN`) find this demo's hosts and runs too."""
    if why_not is not None:
        return f"- ({why_not})"
    if not kept:
        return "- (the demo stopped its stack, and a rollback would start it again: to try one, run the demo again " \
               "with --keep)"
    return (quote(["export", f"DEPLOYER_INVENTORY={workdir / 'hosts.yaml'}", f"DEPLOYER_RUNS_DIR={workdir / 'runs'}"])
            + "; " + quote(["deployer", "rollback", run_id]))


def show_stopped(console: Console, stopped: dict[Path, dict[str, int]], workdir: Path | None,
                 removed: list[Path]) -> None:
    if not stopped and not removed:
        where = f"in {workdir}" if workdir else "in the temp dir"
        console.print(f"nothing was kept {where} (only a `deployer demo --keep` is stopped), nor the files of a "
                      "stopped demo: stopped nothing, removed nothing", markup=False, highlight=False)
    for workdir, pids in stopped.items():
        shown = ", ".join(f"{name} {pid}" for name, pid in pids.items()) or "nothing was running"
        console.print(f"{workdir}: stopped {shown}", markup=False, highlight=False)
    for directory in removed:
        console.print(f"{directory}: removed the demo's files", markup=False, highlight=False)
