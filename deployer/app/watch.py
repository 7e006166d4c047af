"""How a caller watches the runs a use case starts: each run, as it starts, is handed to the caller's Watch with
its hosts, its cancel token and the listeners its events go to, and runs inside the context the Watch returns.
The command line draws its live view there and turns signals into the token's cancel; a Python caller may
pass no Watch (the run is then only cancelled through the token, as its own code decides)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from deployer.steps.cancel import CancelToken
    from deployer.steps.context import Listener

# host: one host's run (a step view); fleet: many hosts' runs (a row each); unit: a unit's hosts restarted as
# one, each its own run, whose steps interleave (no view follows them)
Kind = Literal["host", "fleet", "unit"]


@dataclass(frozen=True)
class Watched:
    """A run about to start: the hosts it works on, the token that cancels it, and the list of listeners its
    events go to (a watcher may add its own)."""

    kind: Kind
    hosts: list[str]
    cancel: CancelToken
    listeners: list[Listener]


Watch = Callable[[Watched], AbstractContextManager[object]]


class Cancel(Protocol):
    """What a watcher does with a run's token (a CancelToken): cancel it at the next safe point, and know when
    it is cancelled already and a stop is forced (a second signal), or a rollback goes on to its end first."""

    @property
    def cancelled(self) -> bool: ...

    def cancel(self, reason: str = ...) -> None: ...

    def forced(self) -> bool: ...

    def finishing(self) -> str | None: ...


def watching(watch: Watch | None, watched: Watched) -> AbstractContextManager[object]:
    return watch(watched) if watch is not None else contextlib.nullcontext()
