"""The KV manager's per-room bookkeeping, shared by every transfer backend.

A *room* (``bootstrap_room``) names one request's KV transfer from a prefill server to a decode
server. Three kinds of thread write its status concurrently: the prefill scheduler (bootstrap
progress), the transfer workers (chunk progress) and the abort paths (client disconnects,
``/abort_request``, the decode side failing the room). The prefill scheduler only lets a room
leave its inflight queue once the status here is ``Success`` or ``Failed``, so whatever this
module keeps is what decides whether a request is ever released.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sglang.srt.disaggregation.base.conn import KVPoll

# A room in one of these states has concluded: the prefill scheduler has released (or is about
# to release) it, and nothing may move it back into a state that keeps it waiting.
TERMINAL_STATES = (KVPoll.Failed, KVPoll.Success)


@dataclass(frozen=True)
class TransferInfo:
    """Where a room's KV cache must go; registered by the decode side during bootstrap."""

    room: int
    decode_id: str
    registered_at: float


class CommonKVManager:
    def __init__(self) -> None:
        self.request_status: dict[int, int] = {}
        self.transfer_infos: dict[int, TransferInfo] = {}
        # One condition guards both maps so an abort (fail + forget the destination) is atomic
        # with respect to readers, and so long-polling decode requests wake on every change.
        self._cond = threading.Condition()

    def update_status(self, bootstrap_room: int, status: int) -> None:
        with self._cond:
            current = self.request_status.get(bootstrap_room)
            if current is None:
                self.request_status[bootstrap_room] = status
            elif current in TERMINAL_STATES and status not in TERMINAL_STATES:
                # Terminal states are sticky. Failed sorts lowest, so the max() merge below
                # would let a transfer worker's late Transferring write (for a chunk that was
                # already on the wire when the abort landed) resurrect an aborted room; with
                # its transfer info gone no chunk would ever conclude it again, and the
                # prefill scheduler would keep it in its inflight queue forever.
                return
            elif status == KVPoll.Failed:
                # Failed sorts lowest, so the max() merge below would never record it.
                self.request_status[bootstrap_room] = KVPoll.Failed
            else:
                # Writers race (scheduler vs. transfer workers); merging with max() keeps a
                # slow writer from moving a room backwards.
                self.request_status[bootstrap_room] = max(current, status)
            self._cond.notify_all()

    def fail_if_not_concluded(self, bootstrap_room: int) -> bool:
        """Fail the room unless it already reached Success or Failed; True if it did.

        Check and write happen under one lock, so a concurrent Success cannot be overwritten.
        """
        with self._cond:
            if self.request_status.get(bootstrap_room, KVPoll.Failed) in TERMINAL_STATES:
                return False
            self.update_status(bootstrap_room, KVPoll.Failed)
            return True

    def check_status(self, bootstrap_room: int) -> int | None:
        with self._cond:
            return self.request_status.get(bootstrap_room)

    def wait_status(self, bootstrap_room: int, timeout: float) -> int | None:
        """Block until the room concludes (Success/Failed) or ``timeout`` passes.

        Lets the decode side long-poll instead of hammering the bootstrap server.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                status = self.request_status.get(bootstrap_room)
                if status in (KVPoll.Success, KVPoll.Failed):
                    return status
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return status
                self._cond.wait(remaining)

    def add_transfer_info(self, info: TransferInfo) -> None:
        with self._cond:
            self.transfer_infos[info.room] = info
            self._cond.notify_all()

    def get_transfer_info(self, bootstrap_room: int) -> TransferInfo | None:
        with self._cond:
            return self.transfer_infos.get(bootstrap_room)

    def pop_transfer_info(self, bootstrap_room: int) -> TransferInfo | None:
        with self._cond:
            return self.transfer_infos.pop(bootstrap_room, None)

    def abort(self, bootstrap_room: int) -> None:
        """Fail the room and forget its destination, so no further chunk is sent."""
        with self._cond:
            self.update_status(bootstrap_room, KVPoll.Failed)
            self.transfer_infos.pop(bootstrap_room, None)

    def status_counts(self) -> dict[int, int]:
        """How many rooms sit in each state; for /server_info and debugging."""
        counts: dict[int, int] = {}
        with self._cond:
            for status in self.request_status.values():
                counts[status] = counts.get(status, 0) + 1
        return counts
