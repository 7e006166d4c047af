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
        self._undoing = 0  # see undoing
        self._held_back = False  # a forced stop already waited for an undo

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
    def undoing(self) -> Iterator[None]:
        """The target is being put back as it was (a restore): a forced stop waits for it once, since a restore
        stopped halfway leaves the target neither as it was nor as the run left it."""
        self._undoing += 1
        try:
            yield
        finally:
            self._undoing -= 1

    def forced(self) -> bool:
        """A forced stop (a signal after the first): True to stop now; False once while an undo runs, which
        finishes first (the next one stops it all the same)."""
        if self._undoing and not self._held_back:
            self._held_back = True
            return False
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
