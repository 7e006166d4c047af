"""The prefill scheduler: the queues a request walks through before its KV cache is released.

bootstrap queue -> waiting queue -> running batch (forward) -> inflight queue -> done

A request leaves the inflight queue only when its room's status is ``Success`` or ``Failed``;
anything else keeps it there. That rule is upstream's, and it is why a room whose status was
resurrected to ``Transferring`` after an abort shows up forever in
``sglang:num_prefill_inflight_queue_reqs``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sglang.srt.demo_knobs import Knobs
from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.nixl.conn import NixlKVManager


@dataclass(eq=False)
class PrefillReq:
    rid: str
    room: int
    input_len: int
    created: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    final_status: int | None = None
    abort_reason: str | None = None


class PrefillScheduler:
    def __init__(self, manager: NixlKVManager, knobs: Knobs) -> None:
        self.manager = manager
        self.knobs = knobs
        self.heartbeat = time.monotonic()
        self.finished = {KVPoll.Success: 0, KVPoll.Failed: 0}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._incoming: list[PrefillReq] = []
        self._bootstrap_queue: list[PrefillReq] = []
        self._waiting_queue: list[PrefillReq] = []
        self._running_batch: list[PrefillReq] = []
        self._inflight_queue: list[PrefillReq] = []
        self._by_rid: dict[str, PrefillReq] = {}
        self._thread = threading.Thread(target=self._loop, name="prefill-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def alive(self) -> bool:
        return self._thread.is_alive() and time.monotonic() - self.heartbeat < 5.0

    def submit(self, rid: str, room: int, input_len: int) -> PrefillReq:
        req = PrefillReq(rid=rid, room=room, input_len=input_len)
        self.manager.update_status(room, KVPoll.Bootstrapping)
        with self._lock:
            self._incoming.append(req)
            self._by_rid[rid] = req
        self._wake.set()
        return req

    def abort(self, req: PrefillReq, reason: str) -> None:
        # The scheduler notices the Failed status on its next pass; the manager is the single
        # place where a room's fate is recorded, as upstream.
        if req.abort_reason is None:
            req.abort_reason = reason
        self.manager.abort(req.room)
        self._wake.set()

    def abort_rid(self, rid: str, reason: str) -> int:
        with self._lock:
            req = self._by_rid.get(rid)
        if req is None:
            return 0
        self.abort(req, reason)
        return 1

    def abort_all(self, reason: str) -> int:
        with self._lock:
            reqs = list(self._by_rid.values())
        for req in reqs:
            self.abort(req, reason)
        return len(reqs)

    def queue_sizes(self) -> dict[str, int]:
        with self._lock:
            return {
                "bootstrap": len(self._bootstrap_queue) + len(self._incoming),
                "waiting": len(self._waiting_queue),
                "running": len(self._running_batch),
                "inflight": len(self._inflight_queue),
            }

    def _finish(self, req: PrefillReq, status: int) -> None:
        req.final_status = status
        self.finished[status] = self.finished.get(status, 0) + 1
        with self._lock:
            if self._by_rid.get(req.rid) is req:
                del self._by_rid[req.rid]
        req.done.set()

    def _loop(self) -> None:
        last_inflight_poll = 0.0
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            with self._lock:
                self._bootstrap_queue.extend(self._incoming)
                self._incoming.clear()
            self._process_bootstrap_queue()
            self._forward()
            now = time.monotonic()
            if now - last_inflight_poll >= self.knobs.inflight_poll_s:
                last_inflight_poll = now
                self._poll_inflight_queue()
            self._wake.wait(0.005)
            self._wake.clear()

    def _process_bootstrap_queue(self) -> None:
        now = time.monotonic()
        still: list[PrefillReq] = []
        ready: list[PrefillReq] = []
        failed: list[PrefillReq] = []
        with self._lock:
            queue = list(self._bootstrap_queue)
        for req in queue:
            if self.manager.check_status(req.room) == KVPoll.Failed:
                failed.append(req)
            elif self.manager.get_transfer_info(req.room) is not None:
                self.manager.update_status(req.room, KVPoll.WaitingForInput)
                ready.append(req)
            elif now - req.created > self.knobs.bootstrap_timeout_s:
                req.abort_reason = req.abort_reason or "bootstrap timeout: decode never registered"
                self.manager.abort(req.room)
                failed.append(req)
            else:
                still.append(req)
        with self._lock:
            self._bootstrap_queue = still
            self._waiting_queue.extend(ready)
        for req in failed:
            self._finish(req, KVPoll.Failed)

    def _forward(self) -> None:
        with self._lock:
            batch = self._waiting_queue
            self._waiting_queue = []
            self._running_batch = batch
        if not batch:
            return
        if self.knobs.forward_s > 0:
            time.sleep(self.knobs.forward_s)
        to_inflight: list[PrefillReq] = []
        for req in batch:
            if self.manager.check_status(req.room) == KVPoll.Failed:
                self._finish(req, KVPoll.Failed)
            else:
                self.manager.send_kv(req.room)
                to_inflight.append(req)
        with self._lock:
            self._running_batch = []
            self._inflight_queue.extend(to_inflight)

    def _poll_inflight_queue(self) -> None:
        with self._lock:
            queue = list(self._inflight_queue)
        undone: list[PrefillReq] = []
        concluded: list[tuple[PrefillReq, int]] = []
        for req in queue:
            status = self.manager.check_status(req.room)
            if status == KVPoll.Success or status == KVPoll.Failed:
                concluded.append((req, status))
            else:
                undone.append(req)
        with self._lock:
            self._inflight_queue = undone
        for req, status in concluded:
            self._finish(req, status)
