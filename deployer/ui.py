"""Everything a person sees: the live step view, the plan, run reports. The only rich importer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console as Console  # re-exported: the CLI types consoles without rich
from rich.live import Live
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from deployer import runlog
from deployer.errors import DeployerError
from deployer.steps.action import Kind
from deployer.steps.services import pid_text as one_pid
from deployer.text import visible

if TYPE_CHECKING:  # the demo, fleet and rollback modules are not loaded by a plain apply
    from deployer.check import CheckReport, GroupReport
    from deployer.demo.run import DemoOutcome, FleetDemoOutcome
    from deployer.fleet.runner import FleetState
    from deployer.run.engine import RunResult
    from deployer.run.plan import PlanReport
    from deployer.run.rollback import Deploy
    from deployer.runlog import Run

STATUS_STYLE = {"ok": "green", "running": "yellow", "failed": "bold red", "canceled": "magenta"}


NOTICES = {
    "lock_acquired": lambda e: f"[lock] acquired {e['path']}",
    "restore": lambda e: (f"[restore] restored {', '.join(e['restored']) or 'nothing'}; "
                          f"removed {', '.join(e['removed']) or 'nothing'}; HEAD {str(e['head'])[:12]}"),
    "rollback": lambda e: (f"[rollback] commit {e['commit'][:12]} gives {', '.join(e['files'])} their content "
                           f"at {e['restores'][:12]}"),
}


V = TypeVar("V", bound="LiveView")


class LiveView:
    """A view that redraws itself on a terminal (rich Live) and prints plain lines otherwise."""

    live: Live | None = None

    def _go_live(self, console: Console, quiet: bool, render: Callable[[], Any], per_second: int) -> None:
        # get_renderable: each refresh rebuilds the view, so a running step's clock ticks.
        if console.is_terminal and not quiet:
            self.live = Live(console=console, refresh_per_second=per_second, transient=False, get_renderable=render)

    def __enter__(self: V) -> V:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.__exit__(None, None, None)


def detail_of(event: dict[str, Any]) -> str:
    """A step's one-line outcome: its summary, else the first line of its error (an empty one is no line)."""
    return str(event.get("summary") or next(iter(str(event.get("error") or "").splitlines()), ""))


class StepView(LiveView):
    """Listens to engine events: a live table on a terminal, one plain line per event otherwise."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.rows: dict[str, list[Any]] = {}
        self._go_live(console, quiet, self._table, 8)

    def _table(self) -> Table:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for name in ("step", "status", "time", "detail"):
            table.add_column(name)
        for step, (status, started, duration, detail) in self.rows.items():
            shown = duration if duration is not None else time.monotonic() - started
            table.add_row(step, Text(status, style=STATUS_STYLE.get(status, "")), f"{shown:5.1f}s",
                          Text(detail, overflow="fold"))
        return table

    def __call__(self, event: dict[str, Any]) -> None:
        if self.quiet:
            return
        kind, step = event.get("type"), event.get("step")
        if kind == "step_start" and step:
            self.rows[step] = ["running", time.monotonic(), None, ""]
            self._line(f"[{step}] started")
        elif kind == "step_end" and step and step in self.rows:
            row = self.rows[step]
            row[0], row[2] = event["status"], event.get("duration_s", 0.0)
            row[3] = detail_of(event)
            self._line(f"[{step}] {event['status']} {row[2]:.2f}s {row[3]}")
        elif kind == "sample" and step and step in self.rows:
            self.rows[step][3] = f"{event.get('metric')} = {event.get('value')}"
            self._line(f"[{step}] sample {event.get('metric')} = {event.get('value')}")
        elif kind in NOTICES:
            self._line(NOTICES[kind](event))
        if self.live is not None:
            self.live.refresh()

    def _line(self, text: str) -> None:
        if self.live is None:
            self.console.print(text, markup=False, highlight=False)


class SafeConsole(Console):
    """A console that never lets the text it prints drive the terminal.

    The one choke point for everything on screen: target output, log lines and error messages reach
    the terminal only as segments, and each segment's text has its control characters made visible
    (`\\x1b`) here, after layout and before rich adds its own styles and cursor moves (control segments,
    which rich makes itself, pass as they are). Markup is another matter: text that is not ours is
    printed with markup=False or through rich.markup.escape."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(visible(segment.text), segment.style, segment.control)
            for segment in buffer)


def make_console(stderr: bool = False) -> Console:
    # emoji off: rich would turn a ":fire:" in a commit subject into an emoji even with markup off.
    return SafeConsole(stderr=stderr, highlight=False, soft_wrap=True, emoji=False)


def show_plan(console: Console, report: PlanReport) -> None:
    console.print(f"[bold]plan[/bold] for host {escape(f'{report.host_name}: {report.repo} at {report.head[:12]}')}")
    if report.lock is not None:
        console.print(f"[yellow]deploy lock[/yellow] {escape(report.lock.describe())}")
    if report.dirty:
        console.print(f"[red]uncommitted changes on the target:[/red] {escape(', '.join(report.dirty))} "
                      "(apply refuses unless --allow-dirty)")
    for plan in report.files:
        console.rule(Text(f"{plan.dest}{'' if plan.exists else ' (new file)'}"))
        if console.is_terminal:
            from rich.syntax import Syntax  # pygments: only a plan shows diffs

            console.print(Syntax(plan.diff, "diff", theme="ansi_dark", background_color="default"))
        else:
            console.print(plan.diff, markup=False, highlight=False, end="")
    console.rule("projected git diff --stat")
    for line in report.stat.lines():
        console.print(line, markup=False, highlight=False)
    if report.bounds is None:
        console.print("bounds: none set (the playbook has no diff_bounds step)")
    elif report.bounds:
        console.print(f"[red]bounds: FAIL[/red] — {escape('; '.join(report.bounds))}")
    else:
        console.print("[green]bounds: ok[/green]")
    if report.judged.get("compile"):
        console.print(f"[red]compile: FAIL[/red] — {escape('; '.join(report.judged['compile']))}")
    elif "compile" in report.judged:
        console.print("[green]compile: ok[/green] (the shipped Python compiles here)")
    console.rule("steps")
    for number, (name, actions) in enumerate(report.steps, 1):
        console.print(f"{number}. [bold]{escape(name)}[/bold]")
        for action in actions:
            console.print(f"     {action.render()}", markup=False, highlight=False)
    console.print("dry run: nothing was changed on the target")


def plan_json(report: PlanReport) -> dict[str, Any]:
    return {"host": report.host_name, "repo": report.repo, "head": report.head,
            "files": [{"dest": f.dest, "insertions": f.stat.insertions, "deletions": f.stat.deletions,
                       "new": not f.exists, "diff": f.diff} for f in report.files],
            "stat": report.stat.summary(), "bounds": report.bounds, "compile": report.judged.get("compile"),
            "dirty": report.dirty,
            "lock": report.lock.info if report.lock else None,
            "steps": [{"name": n, "actions": [a.describe() for a in acts],
                       "commands": [a.command() for a in acts if a.kind == Kind.run]} for n, acts in report.steps]}


def result_json(result: RunResult) -> dict[str, Any]:
    from deployer.run.shown import shown_state_of

    return {"run_id": result.run_id, "state": shown_state_of(result.run_dir.parent, result.run_id, result.phase),
            "status": result.status, "exit_code": result.exit_code,
            "error": result.error, "warning": result.warning,
            "git": {"before": result.git_before, "after": result.git_after},
            "run_dir": str(result.run_dir), "facts": result.facts}


def show_result(console: Console, result: RunResult) -> None:
    from deployer.run.shown import shown_state_of

    style = "green" if result.status == "successful" else "red"
    state = shown_state_of(result.run_dir.parent, result.run_id, result.phase)
    console.print(f"run {result.run_id}: [{style}]{state}[/{style}] (exit {result.exit_code})")
    if result.git_after:
        console.print(f"commit {result.git_after} (was {result.git_before})", markup=False, highlight=False)
    for line in fact_lines(result.facts):
        console.print(f"  {line}", markup=False, highlight=False)
    show_chart(console, events_of(result))
    console.print(f"run log: {result.run_dir}", markup=False, highlight=False)


def events_of(result: RunResult) -> list[dict[str, Any]]:
    """The run's events as its log holds them (the samples for the chart are there)."""
    try:
        return runlog.read_run(result.run_dir.parent, result.run_id).events
    except DeployerError:
        return []


def pid_text(facts: dict[str, Any], key: str = "pids") -> str:
    return ", ".join(f"{name} {one_pid(p['old'])} -> {one_pid(p['new'])}" for name, p in facts.get(key, {}).items())


def fact_lines(facts: dict[str, Any]) -> list[str]:
    """The run's facts as short lines for people (the JSON summary keeps them as data)."""
    lines = []
    if facts.get("diffstat"):
        lines.append(f"diff: {facts['diffstat']}")
    for metric, value in facts.get("baseline", {}).items():
        lines.append(f"baseline: {metric} = {_num(value)}")
    for metric, drain in facts.get("drain", {}).items():
        lines.append(f"drain: {metric} {_num(drain.get('baseline'))} -> {_num(drain.get('final'))}")
    for storm in facts.get("storms", []):
        lines.append(f"storm: sent {storm['sent']}, completed {storm['completed']}, aborted {storm['aborted']}, "
                     f"errors {storm['errors']}")
    if facts.get("pids"):
        lines.append(f"pids: {pid_text(facts)}")
    if facts.get("restored"):
        lines.append(f"restored to pre-run bytes: {', '.join(facts['restored'])}")
    if facts.get("rollback_commit"):
        lines.append(f"rollback commit: {facts['rollback_commit']}")
    if facts.get("rollback_pids"):
        lines.append(f"pids after the rollback: {pid_text(facts, 'rollback_pids')}")
    return lines


def show_error(message: str) -> None:
    make_console(stderr=True).print(f"error: {message}", markup=False, highlight=False, style="red")


def say(text: str) -> None:
    """One plain line on stdout, through the same console as every other line (so escaped like them)."""
    make_console().print(text, markup=False, highlight=False)


def show_warning(message: str) -> None:
    """What a run that ended as its record says could not make sure of (on stderr, so --json stays clean)."""
    make_console(stderr=True).print(f"warning: {message}", markup=False, highlight=False, style="yellow")


def show_notice(message: str) -> None:
    """Something the operator should know that is not a failure (on stderr, so --json stays clean)."""
    make_console(stderr=True).print(f"notice: {message}", markup=False, highlight=False, style="yellow")


def columns(console: Console, header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Plain padded columns: ids stay whole and copyable, and grep and cut work on the output."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)] + [row[-1]]
        console.print("  ".join(cells).rstrip(), markup=False, highlight=False, soft_wrap=True)


def show_runs(console: Console, runs: list[Run]) -> None:
    from deployer.run.shown import shown_state

    rows = []
    for run in runs:
        start = run.start
        kind = f"rollback of {start['rollback_of']}" if start.get("rollback_of") else str(start.get("kind", "apply"))
        rows.append((run.run_id, shown_state(run), _field(start.get("host")), _field(run.git.get("after"))[:12],
                     kind, _field(start.get("playbook_name"))))
    columns(console, ("run", "state", "host", "commit", "kind", "playbook"), rows)


def _field(value: object) -> str:
    """A recorded value for people: a missing one is `-`, never Python's None."""
    return "-" if value is None or value == "" else str(value)


def show_run(console: Console, run: Run) -> None:
    from deployer.run.shown import shown_state

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
    if start.get("rollback_of"):
        console.print(f"rollback of run {start['rollback_of']}", markup=False, highlight=False)
    for link in run.all("rolled_back_by"):
        console.print(f"rolled back by run {_field(link.get('by'))} ({link.get('status', '?')})", markup=False,
                      highlight=False)
    git = run.git
    console.print(f"git: before {_field(git.get('before'))}  after {_field(git.get('after'))}", markup=False,
                  highlight=False)
    for event in run.events:
        if event.get("type") == "step_end":
            detail = detail_of(event)
            console.print(f"  {_field(event.get('step')):<16} {_field(event.get('status')):<9} "
                          f"{event.get('duration_s') or 0:>7.2f}s "
                          f"{detail}", markup=False, highlight=False)
    show_chart(console, run.events)
    if end.get("error"):
        console.print(end["error"], markup=False, highlight=False, style="red")


def show_deploys(console: Console, deploys: list[Deploy]) -> None:
    rows = [(d.commit[:12], d.date[:16].replace("T", " "), d.run_id, d.rollback_of or "-", d.subject)
            for d in deploys]
    columns(console, ("commit", "date", "run", "rollback of", "subject"), rows)


def show_demo(console: Console, outcome: DemoOutcome) -> None:
    from deployer.demo.run import GAUGE

    result, stack = outcome.result, outcome.stack
    facts = result.facts
    drain = facts.get("drain", {}).get(GAUGE, {})
    before = facts.get("baseline", {}).get(GAUGE)
    after = drain.get("final")
    inventory, runs = stack.workdir / "hosts.yaml", stack.workdir / "runs"
    console.rule("demo report")
    rows = [
        ("gauge", f"{GAUGE}: {_num(before)} before the fix -> {_num(after)} after"),
        ("pids", pid_text(facts) or "-"),
        ("commit", f"{result.git_after or '-'} (was {result.git_before or '-'})"),
        ("run", f"{result.run_id}: {result.status}"),
        ("run log", f"deployer runs show {result.run_id} --runs-dir {runs}"),
        ("rollback", f"deployer rollback {result.run_id} -i {inventory} --runs-dir {runs}" if result.git_after
         else "- (the run made no commit: nothing to roll back)"),
    ]
    for key, value in rows:
        console.print(f"  {key:<9} {value}", markup=False, highlight=False)
    show_chart(console, events_of(result))
    if outcome.kept:
        console.print("  the stack is still running (--keep):", markup=False)
        for name in ("router", "prefill", "decode"):
            console.print(f"    {name:<8} {stack.url(name, '')}  (metrics {stack.url(name, '/metrics')})",
                          markup=False, highlight=False)
        console.print(f"  stop it with: deployer demo --stop --workdir {stack.workdir}", markup=False,
                      highlight=False)
    else:
        console.print("  every process the demo started has been stopped", markup=False)


def show_fleet_demo(console: Console, outcome: FleetDemoOutcome) -> None:
    """After the fleet table: each unit's gauge before and after, its samples, and what to run next."""
    from deployer.demo.run import FLEET, GAUGE

    inventory, runs, fleet_id = outcome.workdir / "hosts.yaml", outcome.runs, outcome.state.fleet_id
    console.rule("demo report")
    events = outcome.unit_events()
    for unit, gauge in outcome.gauges().items():
        prefill, decode = FLEET[unit]
        console.print(f"  {unit:<6} {GAUGE}: {_num(gauge['before'])} before the fix -> {_num(gauge['after'])} after "
                      f"(prefill+router on {prefill}, decode on {decode})", markup=False, highlight=False)
        show_chart(console, events[unit])
    committed = any(run.git_after for run in outcome.state.hosts.values())
    for key, value in (("run log", f"deployer runs show {fleet_id} --runs-dir {runs}"),
                       ("rollback", f"deployer rollback {fleet_id} -i {inventory} --runs-dir {runs}" if committed
                        else "- (no host made a commit: nothing to roll back)")):
        console.print(f"  {key:<9} {value}", markup=False, highlight=False)
    if outcome.kept:
        console.print("  the stacks are still running (--keep):", markup=False)
        for unit, (prefill, _) in FLEET.items():
            console.print(f"    {unit:<8} router {outcome.stacks[prefill].url('router', '')}  "
                          f"(metrics {outcome.stacks[prefill].url('prefill', '/metrics')})",
                          markup=False, highlight=False)
        console.print(f"  stop them with: deployer demo --stop --workdir {outcome.workdir}", markup=False,
                      highlight=False)
    else:
        console.print("  every process the demo started has been stopped", markup=False)


def _num(value: object) -> str:
    return "?" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def show_stopped(console: Console, stopped: dict[Path, dict[str, int]], workdir: Path | None) -> None:
    if not stopped:
        where = f"in {workdir}" if workdir else "in the temp dir"
        console.print(f"nothing was kept {where} (only a `deployer demo --keep` is stopped): stopped nothing",
                      markup=False, highlight=False)
    for workdir, pids in stopped.items():
        shown = ", ".join(f"{name} {pid}" for name, pid in pids.items()) or "nothing was running"
        console.print(f"{workdir}: stopped {shown}", markup=False, highlight=False)


# -- the metric chart: one bar per poll, the threshold marked ----------------------------------------

BARS = "▁▂▃▄▅▆▇█"
CHART_WIDTH = 60  # polls shown per series; a longer drain shows its last polls


@dataclass(frozen=True)
class Series:
    step: str
    metric: str
    values: list[float | None]
    op: str | None = None  # the drain's condition, e.g. "<=" ...
    to: float | None = None  # ... this bound

    def met(self, value: float | None) -> bool:
        if value is None or self.op is None or self.to is None:
            return False
        return {"<=": value <= self.to, ">=": value >= self.to, "==": value == self.to}[self.op]


def metric_series(events: list[dict[str, Any]]) -> list[Series]:
    """The baseline and drain samples of a run, in poll order, with each drain's bound."""
    start = next((e for e in events if e.get("type") == "run_start"), {})
    bounds = {s.get("name"): s.get("params", {}) for s in start.get("steps", []) if s.get("kind") == "drain"}
    found: dict[tuple[str, str], list[float | None]] = {}
    for event in events:
        if event.get("type") == "sample" and event.get("step"):
            found.setdefault((str(event["step"]), str(event.get("metric"))), []).append(event.get("value"))
    series = []
    for (step, metric), values in found.items():
        params = bounds.get(step.removeprefix("rollback:"), {})
        series.append(Series(step, metric, values, params.get("op", "<=") if params else None, params.get("to")))
    return series


def sparkline(values: list[float | None], top: float) -> str:
    return "".join("?" if v is None else BARS[0 if top <= 0 else max(0, min(len(BARS) - 1, round(v / top * 7)))]
                   for v in values)


def show_chart(console: Console, events: list[dict[str, Any]]) -> None:
    """Each series as bars scaled to the largest sample; under a drain, ✓ marks the polls within its bound."""
    series = metric_series(events)
    if not series:
        return
    top = max((v for s in series for v in s.values if v is not None), default=0.0)
    console.print(f"  samples (one bar per poll, full bar = {_num(top)}):", markup=False, highlight=False)
    width = max(len(s.step) for s in series)
    bars = max(min(len(s.values), CHART_WIDTH) for s in series)
    for s in series:
        values = s.values[-CHART_WIDTH:]
        label = f"    {s.step:<{width}}  "
        line = Text(label)
        for value in values:
            style = "" if s.op is None else "green" if s.met(value) else "red"
            line.append(sparkline([value], top), style=style if console.is_terminal else "")
        line.append(" " * (bars - len(values)))
        shown = " ".join("?" if v is None else _num(v) for v in values[-8:])
        line.append(f"  {s.metric}: {'... ' if len(values) > 8 else ''}{shown}")
        console.print(line, highlight=False)
        if s.op is not None and s.to is not None:
            marks = "".join("✓" if s.met(v) else "·" for v in values)
            console.print(f"{' ' * len(label)}{marks}  ✓ = {s.op} {_num(s.to)}", markup=False, highlight=False)


def show_check(console: Console, report: CheckReport) -> None:
    marks = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}
    rows = [(report.host, c.name, marks[c.status], c.detail) for c in report.checks]
    columns(console, ("host", "check", "status", "detail"), rows)
    first = report.first_problem
    if first is None:
        console.print(f"{report.host}: ready to deploy", markup=False, highlight=False)
    else:
        console.print(f"{report.host}: not ready: {first.name}: {first.detail} (exit {first.exit_code})",
                      markup=False, highlight=False)
        if first.message:
            show_error(first.message)


def show_check_group(console: Console, group: GroupReport) -> None:
    """One row per host: ready, or its first problem and the exit code that problem has."""
    rows = []
    for report in group.reports:
        first = report.first_problem
        if first is None:
            warned = [f"{c.name}: {c.detail}" for c in report.checks if c.status == "warn"]
            rows.append((report.host, "ready", "0", "; ".join(f"warn: {w}" for w in warned) or "-"))
        else:
            more = sum(c.status == "fail" for c in report.checks) - 1
            rows.append((report.host, "FAIL", str(first.exit_code),
                         f"{first.name}: {first.detail}{f' (+{more} more)' if more else ''}"))
    columns(console, ("host", "status", "exit", "detail"), rows)
    ready = sum(r.first_problem is None for r in group.reports)
    found = group.first_problem
    tail = "" if found is None else f"; first problem: {found[0]}: {found[1].name} (exit {found[1].exit_code})"
    console.print(f"{ready} of {len(group.reports)} hosts ready to deploy{tail}", markup=False, highlight=False)


# -- fleets: one row per host, readable at 64 hosts ----------------------------------------------------

FLEET_ROWS = 16  # the live view lists at most this many running or failed hosts under its summary line
HOST_STYLE = {**STATUS_STYLE, "successful": "green", "waiting": "dim", "untouched": "dim",
              "rolling back": "yellow"}


@dataclass
class HostRow:
    status: str = "waiting"
    step: str = ""
    started: float | None = None
    elapsed: float | None = None
    detail: str = ""

    def clock(self) -> float:
        if self.elapsed is not None:
            return self.elapsed
        return 0.0 if self.started is None else time.monotonic() - self.started


class FleetView(LiveView):
    """Listens to every host's events: a summary line plus the running and failed hosts on a terminal,
    one plain line per host change otherwise. Engines call it from their threads."""

    def __init__(self, console: Console, hosts: list[str], *, quiet: bool = False) -> None:
        self.console, self.quiet = console, quiet
        self.rows = {host: HostRow() for host in hosts}
        self.note = ""
        self._lock = threading.Lock()
        self._go_live(console, quiet, self._render, 4)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for row in self.rows.values():
            counts[row.status] = counts.get(row.status, 0) + 1
        shown = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        return f"fleet: {len(self.rows)} hosts: {shown}{'; ' + self.note if self.note else ''}"

    def _render(self) -> Table:
        with self._lock:
            table = Table(box=None, pad_edge=False, show_header=True, header_style="bold", title=self.summary(),
                          title_justify="left")
            for name in ("host", "status", "step", "time", "detail"):
                table.add_column(name)
            busy = [(h, r) for h, r in self.rows.items() if r.status not in ("waiting", "successful", "untouched")]
            for host, row in busy[:FLEET_ROWS]:
                table.add_row(host, Text(row.status, style=HOST_STYLE.get(row.status, "")), row.step,
                              f"{row.clock():5.1f}s", Text(row.detail, overflow="ellipsis", no_wrap=True))
            if len(busy) > FLEET_ROWS:
                table.add_row(f"... {len(busy) - FLEET_ROWS} more", "", "", "", "")
            return table

    def __call__(self, event: dict[str, Any]) -> None:
        if self.quiet:
            return
        kind, host = event.get("type"), event.get("host")
        with self._lock:
            line = self._apply(kind, host, event)
        if line and self.live is None:
            self.console.print(line, markup=False, highlight=False)
        if self.live is not None:
            self.live.refresh()

    def _apply(self, kind: object, host: object, event: dict[str, Any]) -> str | None:
        row = self.rows.get(str(host)) if host is not None else None
        if kind == "batch_start":
            self.note = f"batch {event['batch'] + 1}"
            return f"[fleet] batch {event['batch'] + 1}: {', '.join(event['hosts'])}"
        if kind == "fleet_stopped":
            self.note = f"stopped: {event['failed']} failed"
            return (f"[fleet] {event['failed']} host(s) failed: no further batch starts; never touched: "
                    f"{', '.join(event['untouched']) or 'none'}")
        if kind == "fleet_rollback":
            return f"[fleet] rolling back {', '.join(event['hosts']) or 'no host'}"
        if row is None:
            return None
        if kind == "host_status":
            row.status = str(event["status"])
            if row.status in ("running", "rolling back"):
                row.started, row.elapsed, row.step = time.monotonic(), None, ""
            else:
                row.elapsed = event.get("elapsed_s", row.clock())
                row.detail = (event.get("error") or "").splitlines()[0] if event.get("error") else row.detail
            ran = f" run {event['run_id']}" if event.get("run_id") else ""
            return f"[{host}] {row.status}{ran}"
        if kind == "step_start" and event.get("step"):
            row.step = str(event["step"])
        elif kind == "step_end" and event.get("step"):
            row.detail = detail_of(event)
            return f"[{host}] {event['step']} {event['status']} {event.get('duration_s', 0.0):.2f}s {row.detail}"
        return None


def fleet_json(state: FleetState) -> dict[str, Any]:
    return {**asdict(state), "untouched": state.untouched()}


def show_fleet(console: Console, state: FleetState) -> None:
    """The per-host table at the end of a fleet run."""
    rows = []
    for name, run in state.hosts.items():
        rolled = f"{run.rollback_status} {run.rollback_run_id or ''}".strip() if run.rollback_status else "-"
        error = (run.error or "").splitlines()[0] if run.error else ""
        rows.append((name, str(run.batch + 1), run.state, run.run_id or "-", str(run.git_after or "-")[:12],
                     "-" if run.elapsed_s is None else f"{run.elapsed_s:.1f}s", rolled, error))
    columns(console, ("host", "batch", "state", "run", "commit", "time", "rollback", "error"), rows)
    style = "green" if state.status == "successful" else "red"
    console.print(f"fleet run {state.fleet_id} ({state.kind}): [{style}]{state.status}[/{style}] "
                  f"(exit {state.exit_code})")
    untouched = state.untouched()
    if untouched:
        console.print(f"never touched: {', '.join(untouched)}", markup=False, highlight=False)
    if state.rolled_back_by:
        console.print(f"rolled back by fleet run {', '.join(state.rolled_back_by)}", markup=False)


def show_fleets(console: Console, fleets: list[FleetState]) -> None:
    rows = [(f.fleet_id, f.status, f.kind + (f" of {f.of_fleet}" if f.of_fleet else ""), f.playbook,
             " ".join(f"{h}:{r.state}{'/rolled-back' if r.rollback_status == 'successful' else ''}"
                      for h, r in f.hosts.items())) for f in fleets]
    columns(console, ("fleet run", "status", "kind", "playbook", "hosts"), rows)
