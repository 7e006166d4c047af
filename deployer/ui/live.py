"""The live views: one host's steps, and a fleet's hosts, redrawn on a terminal, plain lines otherwise."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from deployer.text import visible
from deployer.ui.console import drawing, drawn
from deployer.ui.router import ROUTER_EVENTS, inflight_text, router_line

if TYPE_CHECKING:  # rich is imported only when a view goes live (on a terminal)
    from rich.live import Live
    from rich.table import Table

    from deployer.ui.console import Lines

STATUS_STYLE = {"ok": "green", "running": "yellow", "failed": "bold red", "canceled": "magenta"}


NOTICES = {
    "lock_acquired": lambda e: f"[lock] acquired {e['path']}",
    # Recover took a cut run's lock: said, or "acquired" reads as if nothing held it.
    "lock_adopted": lambda e: f"[lock] took over from run {_holder(e)}: {e['because']}",
    "restore": lambda e: (f"[restore] restored {', '.join(e['restored']) or 'nothing'}; "
                          f"removed {', '.join(e['removed']) or 'nothing'}; HEAD {str(e['head'])[:12]}"),
    "rollback": lambda e: (f"[rollback] commit {e['commit'][:12]} gives {', '.join(e['files'])} "
                           f"{'its' if len(e['files']) == 1 else 'their'} content at {e['restores'][:12]}"),
    # A restart that leaves a service up (recover, a rollback again): said, or "co_restart passed" hides it.
    "service_kept": lambda e: f"[{e['step']}] kept {e['service']} (pid {e['pid']}): {e['why']}",
}


def _holder(event: dict[str, Any]) -> str:
    """The run that held the lock, as the target's lock info names it (input: shown escaped)."""
    holder = event.get("holder")
    run_id = visible(str(holder.get("run_id") if isinstance(holder, dict) else holder), multiline=False)
    of = event.get("of_run")
    return run_id if of in (None, run_id) else f"{run_id} (a recover of run {visible(str(of), multiline=False)})"


V = TypeVar("V", bound="LiveView")


class LiveView:
    """A view that redraws itself on a terminal (rich Live) and prints plain lines otherwise."""

    live: Live | None = None

    def _go_live(self, console: Lines, quiet: bool, render: Callable[[], Any], per_second: int) -> None:
        # get_renderable: each refresh rebuilds the view, so a running step's clock ticks.
        if console.is_terminal and not quiet:
            from rich.console import Console
            from rich.live import Live

            assert isinstance(console, Console)  # line_console's on a terminal
            self.live = Live(console=console, refresh_per_second=per_second, transient=False, get_renderable=render)

    def __enter__(self: V) -> V:
        if self.live is not None:
            self.live.__enter__()
            drawing(self.live.console)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.__exit__(None, None, None)
            drawn(self.live.console)


SAY_AGAIN_S = 10.0  # an unchanged reading is said again this often, as a service's wait is (PHASE_REPEAT_S)


class Repeats:
    """Which of a poll's readings were said off a terminal: a line on each change and every SAY_AGAIN_S, not one a
    poll (a 60 s drain polled each second said the same `= 3` sixty times)."""

    def __init__(self) -> None:
        self.said: dict[object, tuple[object, float]] = {}  # what is polled: the reading said last, and when

    def due(self, polled: object, reading: object) -> bool:
        now = time.monotonic()
        last = self.said.get(polled)
        if last is not None and last[0] == reading and now - last[1] < SAY_AGAIN_S:
            return False
        self.said[polled] = (reading, now)
        return True


def detail_of(event: dict[str, Any]) -> str:
    """A step's one-line outcome: its summary, else the first line of its error (an empty one is no line)."""
    return str(event.get("summary") or next(iter(str(event.get("error") or "").splitlines()), ""))


# What ends a service's phase without a next phase: its stop or start done (co_restart moves on to another
# service), or its step's end. From then on its row shows how long that phase took, not how long ago it began.
PHASE_ENDS = ("service_stopped", "service_started")


@dataclass
class ServiceRow:
    """One service's wait as its newest `service_phase` event told it; its clock runs on from there until the
    phase ends."""

    event: dict[str, Any]
    seen: float  # monotonic time the event came
    ended: float | None = None  # monotonic time the phase ended

    def clock(self) -> float:
        elapsed = float(self.event.get("elapsed_s") or 0.0)
        if self.event.get("phase") == "healthy":
            return elapsed
        return elapsed + (time.monotonic() if self.ended is None else self.ended) - self.seen

    def end(self) -> None:
        if self.ended is None:
            self.ended = time.monotonic()


# The phases whose names in the run log are not words a person says.
PHASE_WORDS = {"waiting_tree": "waiting for its process tree", "waiting_gpu": "waiting for its GPUs"}


def phase_text(event: dict[str, Any], elapsed: float) -> str:
    """`prefill loading: pid 4242, health 503, 12.0s of 600s`: a service's wait in one line."""
    parts = [f"pid {event['pid']}" if event.get("pid") is not None else "",
             f"health {event['health']}" if event.get("health") else "",
             f"{elapsed:.1f}s" + (f" of {event['budget_s']:g}s" if event.get("budget_s") else "")]
    phase = str(event["phase"])
    return f"{event['service']} {PHASE_WORDS.get(phase, phase)}: {', '.join(p for p in parts if p)}"


def sample_text(event: dict[str, Any]) -> str:
    """`sglang:num_requests_running = 3, target <= 0, 4.2s of 60s`: a metric poll in one line."""
    value = event.get("value")
    parts = [f"{event.get('metric')} = " + (f"{float(value):g}" if value is not None else
                                             f"? ({event.get('problem') or 'no reading'})"),
             f"target {event['target']}" if event.get("target") else "",
             f"{float(event['elapsed_s']):.1f}s of {float(event['budget_s']):g}s"
             if event.get("elapsed_s") is not None and event.get("budget_s") is not None else ""]
    return ", ".join(p for p in parts if p)


class StepView(LiveView):
    """Listens to engine events: a live table on a terminal, one plain line per event otherwise."""

    def __init__(self, console: Lines, *, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.rows: dict[str, list[Any]] = {}
        self.services: dict[tuple[str, str], ServiceRow] = {}  # (step, service): its newest phase
        self.drains: dict[str, dict[str, Any]] = {}  # worker: its newest in-flight count, while it drains
        self.repeats = Repeats()
        self._go_live(console, quiet, self._table, 8)

    def _table(self) -> Table:
        from rich.table import Table
        from rich.text import Text

        # No header over no rows: a run that ends before its first step (a rollback with nothing to restart)
        # would leave it alone above the report.
        table = Table(box=None, pad_edge=False, show_header=bool(self.rows or self.drains), header_style="bold")
        for name in ("step", "status", "time", "detail"):
            table.add_column(name)
        for step, (status, started, duration, detail) in self.rows.items():
            shown = duration if duration is not None else time.monotonic() - started
            table.add_row(step, Text(status, style=STATUS_STYLE.get(status, "")), f"{shown:5.1f}s",
                          Text(detail, overflow="fold"))
            for (of_step, _), row in self.services.items():
                if of_step == step and status == "running":  # a step's waits, under it while it runs
                    table.add_row("", "", "", Text(phase_text(row.event, row.clock()), overflow="fold"))
        for event in self.drains.values():  # the unit's drain, before its restart step starts
            table.add_row(f"router {event['router']}", "", "", Text(inflight_text(event), overflow="fold"))
        return table

    def running(self) -> list[str]:
        """The steps running now, in their order."""
        return [step for step, row in self.rows.items() if row[0] == "running"]

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
            for (of_step, _), service in self.services.items():
                if of_step == step:
                    service.end()
            self._line(f"[{step}] {event['status']} {row[2]:.2f}s {row[3]}")
        elif kind == "sample" and step and step in self.rows:
            self.rows[step][3] = sample_text(event)
            if self.repeats.due((step, event.get("metric")), event.get("value")):
                self._line(f"[{step}] sample {sample_text(event)}")
        elif kind == "service_phase" and step:
            self.services[step, str(event["service"])] = ServiceRow(event, time.monotonic())
            self._line(f"[{step}] {phase_text(event, float(event.get('elapsed_s') or 0.0))}")
        elif kind in PHASE_ENDS and step and (step, str(event.get("service"))) in self.services:
            self.services[step, str(event.get("service"))].end()
        elif kind in NOTICES:
            self._line(NOTICES[kind](event))
        elif kind in ROUTER_EVENTS:
            self._router(event)
        if self.live is not None:
            self.live.refresh()

    def _router(self, event: dict[str, Any]) -> None:
        worker = str(event.get("worker"))
        if event["type"] == "worker_inflight" and event.get("value") != 0:
            self.drains[worker] = event
        else:
            self.drains.pop(worker, None)
        line = router_line(event)
        if line and (event["type"] != "worker_inflight"
                     or self.repeats.due((event.get("router"), worker), event.get("value"))):
            self._line(line)

    def _line(self, text: str) -> None:
        if self.live is None:
            self.console.print(text, markup=False, highlight=False)



# -- fleets: one row per host, readable at 64 hosts ----------------------------------------------------

FLEET_ROWS = 16  # the live view lists at most this many running or failed hosts under its summary line
HOST_STYLE = {**STATUS_STYLE, "successful": "green", "waiting": "dim", "untouched": "dim",
              "rolling back": "yellow"}


@dataclass
class HostRow:
    """One host's line in the fleet's live view."""
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

    def __init__(self, console: Lines, hosts: list[str], *, quiet: bool = False) -> None:
        self.console, self.quiet = console, quiet
        self.rows = {host: HostRow() for host in hosts}
        self.note = ""
        self.batches: list[list[str]] | None = None  # the fleet run's, once fleet_start (or a resume) says them
        self.repeats = Repeats()
        self._lock = threading.Lock()
        self._go_live(console, quiet, self._render, 4)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for row in self.rows.values():
            counts[row.status] = counts.get(row.status, 0) + 1
        shown = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        return f"fleet: {len(self.rows)} hosts: {shown}{'; ' + self.note if self.note else ''}"

    def _render(self) -> Table:
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            busy = [(h, r) for h, r in self.rows.items() if r.status not in ("waiting", "successful", "untouched")]
            # No header over no rows: the view's last frame stays above the fleet's table.
            table = Table(box=None, pad_edge=False, show_header=bool(busy), header_style="bold",
                          title=self.summary(), title_justify="left")
            for name in ("host", "status", "step", "time", "detail"):
                table.add_column(name)
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

    def before(self, number: int) -> str:
        """Where a pause stands, as people count batches (from 1); a pause after the last batch holds hosts only."""
        if self.batches is not None and number >= len(self.batches):
            return "after the last batch"
        return f"before batch {number + 1}"

    def _apply(self, kind: object, host: object, event: dict[str, Any]) -> str | None:
        row = self.rows.get(str(host)) if host is not None else None
        if kind in ("fleet_start", "fleet_resumed") and event.get("batches") is not None:
            self.batches = event["batches"]
        if kind == "batch_start":
            self.note = f"batch {event['batch'] + 1}"
            return f"[fleet] batch {event['batch'] + 1}: {', '.join(event['hosts'])}"
        if kind == "fleet_stopped":
            self.note = f"stopped: {event['failed']} failed"
            return (f"[fleet] {event['failed']} host(s) failed: no further batch starts; never touched: "
                    f"{', '.join(event['untouched']) or 'none'}")
        if kind == "fleet_rollback":
            return f"[fleet] rolling back {', '.join(event['hosts']) or 'no host'}"
        if kind in ("fleet_paused", "fleet_resumed"):  # a rollout's pause: for a while, or until a person resumes
            where = self.before(int(event["batch"]))
            self.note = "paused" if kind == "fleet_paused" else where
            for held in event.get("held") or []:  # an inconclusive analysis: kept for a person, not failed
                if held in self.rows:
                    self.rows[held].status = "held"
            if kind == "fleet_paused" and event.get("duration_s") is None:
                # Until a person resumes: why, and the commands that end it, are said once, under the fleet's table.
                return f"[fleet] paused {where}, until resumed or aborted"
            how_long = f" for {event['duration_s']:g}s" if event.get("duration_s") is not None else ""
            return f"[fleet] {kind.removeprefix('fleet_')}{how_long} {where}: {event['reason']}"
        if row is None:
            return None
        if kind in ROUTER_EVENTS:
            if kind != "worker_inflight":
                return f"[{host}] {router_line(event)}"
            row.detail = inflight_text(event)
            due = self.repeats.due((host, event.get("router"), event.get("worker")), event.get("value"))
            return f"[{host}] {router_line(event)}" if due else None
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
            row.step, row.detail = str(event["step"]), ""  # the step before's outcome is not this one's
        elif kind == "step_end" and event.get("step"):
            row.detail = detail_of(event)
            step = str(event["step"])
            if step.startswith("rollback:"):  # a check run again on the reverted build, not a rollback of its own
                step = f"{step.removeprefix('rollback:')} of the reverted build"
            if event["status"] == "skipped":  # its detail says why: 'not run: ...'
                return f"[{host}] {step}: {row.detail}"
            return f"[{host}] {step} {event['status']} {event.get('duration_s', 0.0):.2f}s {row.detail}"
        return None
