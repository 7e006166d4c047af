"""The run's stop: set by a signal handler (or a failing run log), looked at by steps at their safe points."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from deployer.errors import DeployerError, Interrupted
from deployer.waiting import waited


class CancelToken:
    """Set by a signal handler (or a failing run log); steps look at it at their safe points."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = "interrupted"
        self.failure: DeployerError | None = None  # why, when it is a failure rather than the operator

        self._told: list[Callable[[], None]] = []  # see on_cancel
        self._undoing: list[Callable[[], object] | None] = []  # the undos under way (see undoing), innermost last
        self._held_back = False  # a forced stop already waited for an undo
        self._finishing: str | None = None  # see finishing_first

    def cancel(self, reason: str = "interrupted", failure: DeployerError | None = None) -> None:
        self.reason = reason
        self.failure = self.failure or failure
        self._event.set()
        for told in list(self._told):
            # A thread of its own: this may run inside a signal handler, which must not wait on a lock.
            threading.Thread(target=told, name="on-cancel", daemon=True).start()

    def on_cancel(self, told: Callable[[], None]) -> Callable[[], None]:
        """Tell `told` when the run is cancelled (now, if it is already); returns what stops telling it."""
        self._told.append(told)
        if self._event.is_set():
            threading.Thread(target=told, name="on-cancel", daemon=True).start()
        return lambda: self._told.remove(told) if told in self._told else None

    @contextmanager
    def undoing(self, kill: Callable[[], object] | None = None) -> Iterator[None]:
        """The target is being put back as it was (a restore): a forced stop waits for it once, since a restore
        stopped halfway leaves the target neither as it was nor as the run left it. `kill`: what such a stop
        still does (in a thread of its own), for what the undo waits on but is no part of it."""
        self._undoing.append(kill)
        try:
            yield
        finally:
            self._undoing.remove(kill)

    @contextmanager
    def finishing_first(self, what: str) -> Iterator[CancelToken]:
        """While in it, `what` (a rollback) goes on to its end whatever a first signal asks, since stopped halfway
        it would leave the target neither as the run found it nor as it left it: this token says so to that
        signal (a second still forces). Yields the token the work goes on with: a new one, which no first signal
        cancels."""
        self._finishing = what
        try:
            yield CancelToken()
        finally:
            self._finishing = None

    def finishing(self) -> str | None:
        """What goes on to its end first (finishing_first), if anything."""
        return self._finishing

    def forced(self) -> bool:
        """A forced stop (a signal after the first): True to stop now; False once while an undo runs, which
        finishes first (the next one stops it all the same)."""
        return not self._hold_back([self._undoing])

    def _hold_back(self, undos: list[list[Callable[[], object] | None]]) -> bool:
        under_way = [each for each in undos if each]
        if self._held_back or not under_way:
            return False
        self._held_back = True
        for kill in (each[-1] for each in under_way):
            if kill is not None:  # this may run inside a signal handler: a thread, as for cancel()
                threading.Thread(target=kill, name="forced-kill", daemon=True).start()
        return True

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise self.stopped()

    def stopped(self) -> DeployerError:
        """Why the run stops, once cancelled: the failure that cancelled it, or the operator's stop."""
        return self.failure or Interrupted(f"{self.reason}: stopped at a safe point")

    def wait(self, seconds: float) -> None:
        """Sleep that a cancel cuts short (and then raises)."""
        if waited(self._event.wait, seconds):
            self.check()
