"""What every command that works on targets shares: its signals, its live view (the Watch it hands the use
case), the notices it says on the way, its report and the exit code that report ends with."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from deployer.cli.output import emit_json

if TYPE_CHECKING:
    from deployer.app.outcome import FleetOutcome, RunOutcome
    from deployer.app.watch import Cancel, Watch, Watched
    from deployer.ui.console import Lines


@contextmanager
def cancel_on_signals(token: Cancel, running: Callable[[], list[str]] = list) -> Iterator[None]:
    """First SIGINT/SIGTERM/SIGHUP: stop at the next safe point, saying which steps' commands finish first
    (`running`: the steps running now). A second one: stop now, except that a restore under way finishes first (a
    third stops that too)."""
    from deployer.ui.console import show_notice

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if token.cancelled:
            if token.forced():
                raise KeyboardInterrupt
            said = f"{name}: putting the target back first, then stopping (again to abandon that)"
        else:
            token.cancel(f"interrupted by {name}")
            what = token.finishing()
            # What runs now finishes first: a long command (a compile, a slow drain poll) would read as unheard.
            steps = running() if what is None else []
            # The command, not the step: a restart stops between its commands, its services as they are then.
            first = f": the command {', '.join(steps)} runs now finishes first, then it stops" if steps else ""
            said = f"{name}: stopping at the next safe point (again to force){first}" if what is None else \
                f"{name}: {what} goes on to its end first, then stops (again to force a stop halfway)"
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            show_notice(said)  # heard, not failed: the run's own end says how it went

    # SIGHUP too: a closed terminal or a dropped ssh session must not skip the restore.
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def pin_notice(event: dict[str, Any]) -> None:
    """Pinning a host key is an explicit choice: say so on every command, as a notice (it is no error); so is
    what a use case has to tell the operator on the way (a notice event: which run `last` chose)."""
    from deployer.ui.console import show_notice, show_warning
    if event.get("type") == "host_key_pinned":
        show_notice(f"pinned a new host key for {event['entry']}: {event['key_type']} {event['fingerprint']}")
    if event.get("type") in ("end_unanchored", "notice"):
        show_notice(str(event["message"]))
    if event.get("type") == "lock_not_stale":  # a lock broken while its run may still be going: done, and risky
        show_warning(str(event["message"]))


def watcher(as_json: bool) -> Watch:
    """The command line's watch on each run a use case starts: signals cancel it, and its live view follows it (a
    step view for one host, a row per host for a fleet; none for a unit restarted as one, whose steps interleave);
    with --json the view is quiet."""

    @contextmanager
    def watch(run: Watched) -> Iterator[None]:
        from deployer.ui.console import line_console, make_console
        from deployer.ui.live import FleetView, StepView

        if run.kind == "unit":
            with cancel_on_signals(run.cancel):
                yield
            return
        view = FleetView(make_console(), run.hosts, quiet=as_json) if run.kind == "fleet" else \
            StepView(line_console(), quiet=as_json)
        with cancel_on_signals(run.cancel, view.running if isinstance(view, StepView) else list):
            run.listeners.append(view)
            with view:
                yield
    return watch


def show_outcome(outcome: RunOutcome | FleetOutcome, as_json: bool) -> NoReturn:
    """A run's report (a fleet's: the per-host table), then exit with its code."""
    from deployer.app.outcome import FleetOutcome
    from deployer.ui.console import line_console, make_console, show_error

    if not isinstance(outcome, FleetOutcome):
        report(line_console(), outcome, as_json)
    elif as_json:
        emit_json(outcome.document())
    else:
        from deployer.ui.fleet import show_fleet  # rich: only a fleet's table needs it

        show_fleet(make_console(), outcome.state)
        if outcome.error and outcome.state.status != "paused":  # a pause is no error: show_fleet said why and what next
            show_error(outcome.error)
    sys.exit(outcome.exit_code)


def report(console: Lines, outcome: RunOutcome, as_json: bool) -> NoReturn:
    """One host's run: its result, its error and warnings (what it could not prove), then its exit code."""
    from deployer.ui.console import show_error, show_warning
    from deployer.ui.report import proof_warnings, show_result

    result = outcome.result
    if as_json:
        emit_json(result.document())
    else:
        show_result(console, result)
        if result.error:
            show_error(result.error)
        if result.warning:
            show_warning(result.warning)
        for unproven in proof_warnings(result.facts):
            show_warning(unproven)
    sys.exit(result.exit_code)
