"""The byte pipe the agent client speaks over: the interface every transport's pipe implements
(deployer/transport/pipes.py), and the read size and stderr wait both sides share.

Here, under the client, so the agent room needs nothing from the transports above it."""

from __future__ import annotations

from typing import Protocol

CHUNK = 65536
# How long a pipe whose output ended waits for the rest of its stderr (the reader of each stream runs on
# its own): the tail read then says why the far end died, not half of it.
STDERR_SETTLE_S = 2.0


class Pipe(Protocol):
    """A byte pipe to the agent's stdin and from its stdout."""

    def read(self, size: int) -> bytes:
        """Up to size bytes as soon as any arrive; b"" at end of stream."""

    def write(self, data: bytes) -> None: ...

    def close(self, kill: bool = False) -> None:
        """Close our sending side (the agent sees EOF and exits), then release the pipe. kill: what runs there
        is no agent known to exit on that EOF: its process group (what the pipe's start made) is killed first."""

    def stderr_tail(self, *, ended: bool = False) -> str:
        """The last of what the agent wrote on stderr (why it died, when it did). ended: its end was seen some
        other way (its stdin refused a write): wait (bounded) for the stream to end, so the tail is all it said."""
