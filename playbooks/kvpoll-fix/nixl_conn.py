"""The transfer side of the KV manager: worker threads that ship a room's KV cache in chunks.

Rooms are sharded over the workers (``room % num_workers``) so the chunks of one room are sent
in order by one thread while different rooms proceed in parallel, as upstream does. A chunk
"send" is a sleep: what matters here is the timing of the status writes around it, not data.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager, TransferInfo


@dataclass(frozen=True)
class TransferChunk:
    room: int
    index: int
    is_last: bool


class NixlKVManager(CommonKVManager):
    def __init__(
        self, *, num_workers: int, num_chunks: int, chunk_s: float, race_delay_s: float
    ) -> None:
        super().__init__()
        if num_workers < 1 or num_chunks < 1:
            raise ValueError("need at least one transfer worker and one chunk")
        self.num_chunks = num_chunks
        self.chunk_s = chunk_s
        self.race_delay_s = race_delay_s
        self.chunks_sent = 0
        self.chunks_skipped = 0
        self._queues: list[queue.SimpleQueue[TransferChunk | None]] = [
            queue.SimpleQueue() for _ in range(num_workers)
        ]
        self._threads = [
            threading.Thread(
                target=self._transfer_worker, args=(q,), name=f"kv-transfer-{i}", daemon=True
            )
            for i, q in enumerate(self._queues)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for q in self._queues:
            q.put(None)

    def workers_alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    def send_kv(self, bootstrap_room: int) -> None:
        """Queue every chunk of the room on the worker that owns it."""
        q = self._queues[bootstrap_room % len(self._queues)]
        for index in range(self.num_chunks):
            q.put(TransferChunk(bootstrap_room, index, index == self.num_chunks - 1))

    def _send_chunk(self, info: TransferInfo, chunk: TransferChunk) -> None:
        # Real chunk times vary with size and link load. The jitter also keeps a storm's waves of
        # same-age requests from phase-locking with the chunk boundaries, which would otherwise
        # decide deterministically whether their aborts hit a chunk in flight.
        time.sleep(self.chunk_s * random.uniform(0.5, 1.5))

    def _transfer_worker(self, q: queue.SimpleQueue[TransferChunk | None]) -> None:
        while True:
            chunk = q.get()
            if chunk is None:
                return
            info = self.get_transfer_info(chunk.room)
            if info is None:
                # The destination is gone (the room was aborted): there is nowhere to send
                # this chunk, so drop it.
                self.chunks_skipped += 1
                # Defence in depth for the terminal-sticky fix: this chunk will never be sent,
                # so a room that is still non-terminal here (an abort raced a chunk already on
                # the wire and its stale Transferring write won) would never be concluded by
                # anything else. Fail it so that the prefill scheduler releases it.
                self.fail_if_not_concluded(chunk.room)
                continue
            self._send_chunk(info, chunk)
            self.chunks_sent += 1
            if chunk.is_last:
                self.update_status(chunk.room, KVPoll.Success)
                self.pop_transfer_info(chunk.room)
            else:
                # Completion notifications of a non-last chunk arrive a little after the data
                # (RDMA completion queues are polled); SGLANG_DEMO_RACE_DELAY_S models that gap.
                if self.race_delay_s > 0:
                    time.sleep(self.race_delay_s)
                self.update_status(chunk.room, KVPoll.Transferring)
