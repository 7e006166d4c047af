"""A run's report: its outcome and facts, the runs list, one run's log, the deploys on a host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deployer import runlog
from deployer.errors import DeployerError
from deployer.text import visible
from deployer.ui.chart import show_chart
from deployer.ui.checks import checks_of
from deployer.ui.console import columns
from deployer.ui.live import detail_of

if TYPE_CHECKING:  # the rollback module is not loaded by a plain apply, nor rich by its plain report
    from collections.abc import Collection

    from rich.console import Console

    from deployer.run.engine import RunResult
    from deployer.run.rollback import Deploy
    from deployer.runlog import Run
    from deployer.ui.console import Lines


def show_result(console: Lines, result: RunResult) -> None:
    from deployer.run.shown import shown_state_of

    style = "green" if result.status == "successful" else "red"
    state = shown_state_of(result.run_dir.parent, result.run_id, result.phase)
    coloured = console.is_terminal  # the state's colour is markup, which shows only there
    console.print(f"run {result.run_id}: {f'[{style}]{state}[/{style}]' if coloured else state} "
                  f"(exit {result.exit_code})", markup=coloured)
    events = events_of(result)
    if result.git_after:
        # A run that rolled back made its commit, then the revert that stands after it: both, or it reads as applied.
        # A rollback's own commit is its revert: nothing reverted it.
        revert = result.facts.get("rollback_commit")
        after = f"; reverted by {revert}" if revert and revert != result.git_after else ""
        # A recover's log names the cut run's commit as its own after: whose it is, or it reads as the recover's.
        cut = next((e.get("recover_of") for e in events[:1] if e.get("type") == "run_start"), None)
        whose = f"run {cut}'s commit; " if isinstance(cut, str) and runlog.is_run_id(cut) else ""
        console.print(f"commit {result.git_after} ({whose}was {result.git_before}){after}", markup=False,
                      highlight=False)
    if result.facts.get("already_applied"):
        restarted = "services restarted" if result.facts.get("pids") else \
            "services not restarted (apply --restart restarts them)"
        console.print(f"nothing to do: HEAD {result.git_before} already has these bytes in "
                      f"{', '.join(result.facts.get('unchanged', []))}; {restarted}", markup=False, highlight=False)
    for line in fact_lines(result.facts, events):
        console.print(f"  {line}", markup=False, highlight=False)
    show_chart(console, events)
    console.print(f"run log: {result.run_dir}", markup=False, highlight=False)


def proof_warnings(facts: dict[str, Any]) -> list[str]:
    """What the run's passed checks could not prove: each drain whose baseline already met its bound."""
    if not facts.get("baseline_met"):
        return []  # nothing to load steps.metrics (and its load generator) for
    from deployer.steps.metrics import baseline_was, proves_nothing

    return [proves_nothing(baseline_was(metric, facts["drain"][metric]["baseline"]), bound)
            for metric, bound in facts.get("baseline_met", {}).items()]


def events_of(result: RunResult) -> list[dict[str, Any]]:
    """The run's events as its log holds them (the samples for the chart are there)."""
    try:
        return runlog.read_run(result.run_dir.parent, result.run_id).events
    except DeployerError:
        return []


def pid_text(facts: dict[str, Any], key: str = "pids") -> str:
    from deployer.steps.services.manager import pid_text as one_pid  # every manager: only a run that restarted

    return ", ".join(f"{name} {one_pid(p['old'])} -> {one_pid(p['new'])}" for name, p in facts.get(key, {}).items())


def fact_lines(facts: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    """The run's facts as short lines for people (the JSON summary keeps them as data); its checks as its log
    tells them, each with the build it ran on."""
    lines = []
    if facts.get("diffstat"):
        lines.append(f"diff: {facts['diffstat']}")
    lines += [check.line() for check in checks_of(events)]
    if facts.get("pids"):
        lines.append(f"pids: {pid_text(facts)}")
    if facts.get("restored"):
        lines.append(f"restored to pre-run bytes: {', '.join(facts['restored'])}")
    if facts.get("rollback_commit"):
        lines.append(f"rollback commit: {facts['rollback_commit']}")
    if facts.get("rollback_pids"):
        lines.append(f"pids after the rollback: {pid_text(facts, 'rollback_pids')}")
    if facts.get("rollback_checks"):
        lines.append("checks of the reverted build: " + "; ".join(
            f"{name} {verdict}" for name, verdict in facts["rollback_checks"].items()))
    return lines



def show_runs(console: Console, runs: list[Run], cut: Collection[str] = ()) -> None:
    """A row per run; a run in `cut` (never ended, its process gone) says so beside its state, and the line
    below the table says what ends it."""
    from deployer.run.shown import shown_state

    rows = []
    for run in runs:
        start = run.start
        kind = _kind(start)
        state = shown_state(run) + (" (cut)" if run.run_id in cut else "")
        rows.append((run.run_id, state, _field(start.get("host")),
                     " ".join(commit[:12] for commit in run.commits) or "-",
                     kind, _field(start.get("playbook_name"))))
    columns(console, ("run", "state", "host", "commit", "kind", "playbook"), rows)
    if cut:
        console.print("(cut): the run never ended and its process on this machine is gone; `deployer recover RUN` "
                      "finishes it or puts the target back", markup=False, highlight=False)


def _of(start: dict[str, Any]) -> tuple[str, str] | None:
    """A rollback's or a recover's kind and the run it undoes or finishes, as its log names it (a log is input:
    only a run id counts)."""
    for kind in ("rollback", "recover"):
        of = start.get(f"{kind}_of")
        if isinstance(of, str) and runlog.is_run_id(of):
            return kind, of
    return None


def _kind(start: dict[str, Any]) -> str:
    """A run's kind as `runs list` shows it: `rollback of R`, `recover of R`, `apply`."""
    of = _of(start)
    return f"{of[0]} of {of[1]}" if of else visible(str(start.get("kind", "apply")), multiline=False)


def _field(value: object) -> str:
    """A recorded value for people: a missing one is `-`, never Python's None."""
    return "-" if value is None or value == "" else str(value)


def show_run(console: Console, run: Run, target: list[str] | None = None) -> None:
    """The run as its log says, and target: what its target says now of its files (app/runs.py pod_now)."""
    from deployer.run import mounts, pods
    from deployer.run.shown import shown_state, shown_state_of

    start, end = run.start, run.end or {}
    state = shown_state(run)
    console.print(f"run {run.run_id}  state {state}  host {_field(start.get('host'))}  "
                  f"operator {_field(start.get('operator'))}  deployer {_field(start.get('version'))}",
                  markup=False, highlight=False)
    console.print(f"playbook {_field(start.get('playbook'))} (sha256 {_field(start.get('playbook_sha256'))[:16]})",
                  markup=False, highlight=False)
    if not end:
        console.print(f"no run_end: the run is still going, or it was cut while {state} "
                      f"(deployer recover {run.run_id})", markup=False, highlight=False)
    if of := _of(start):
        console.print(f"{of[0]} of run {of[1]}", markup=False, highlight=False)
    # The linked runs' states in the words this run's own has (their log's `status` is --json's field).
    for link in run.all("recovered_by"):
        by = _field(link.get("by"))
        unproven = f"; unproven: {link['unproven']}" if link.get("unproven") else ""
        console.print(f"recovered by run {by} ({shown_state_of(run.dir.parent, by, '?')}): this run ended "
                      f"{_field(link.get('outcome'))}{unproven}", markup=False, highlight=False)
    for link in run.all("rolled_back_by"):
        by = _field(link.get("by"))
        checks = "; its checks of the reverted build failed" if link.get("status") != "successful" and \
            link.get("phase") == "rolled_back" else ""
        console.print(f"rolled back by run {by} ({shown_state_of(run.dir.parent, by, str(link.get('phase') or '?'))}"
                      f"{checks})", markup=False, highlight=False)
    git = run.git
    console.print(f"git: before {_field(git.get('before'))}  after {_field(git.get('after'))}", markup=False,
                  highlight=False)
    for line in mounts.shown(run):  # a run into a container: where its files lived, and a recreate seen since
        console.print(line, markup=False, highlight=False)
    left = pods.recorded(run)  # a run into a pod: where its files lived, and the pod now
    for line in [*(left.shown() if left is not None else []), *(target or [])]:
        console.print(line, markup=False, highlight=False)
    ended = [event for event in run.events if event.get("type") == "step_end"]
    width = max((len(_field(event.get("step"))) for event in ended), default=0)  # `rollback:co_restart` and longer
    for event in ended:
        console.print(f"  {_field(event.get('step')):<{width}} {_field(event.get('status')):<9} "
                      f"{event.get('duration_s') or 0:>7.2f}s {detail_of(event)}", markup=False, highlight=False)
    show_chart(console, run.events)
    if end.get("error"):
        console.print(end["error"], markup=False, highlight=False, style="red")


def show_deploys(console: Console, deploys: list[Deploy]) -> None:
    rows = [(d.commit[:12], d.date[:16].replace("T", " "), d.run_id, d.rollback_of or "-", d.subject)
            for d in deploys]
    columns(console, ("commit", "date", "run", "rollback of", "subject"), rows)
