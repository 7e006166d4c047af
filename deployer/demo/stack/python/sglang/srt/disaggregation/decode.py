"""The decode side: request stages for the gauges, and the client of the prefill bootstrap server.

Each decode request registers its KV destination with the prefill server that owns its room
(prealloc queue), waits for the transfer to conclude (transfer queue), then generates tokens
(running). When the request is aborted before the transfer concluded, the decode side tells the
prefill side to fail the room; that is one of the two abort paths that race the transfer workers.
"""

from __future__ import annotations

import http.client
import json
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.disaggregation.base.conn import KVPoll

STAGES = ("queue", "prealloc", "transfer", "running")


@dataclass(eq=False)
class DecodeReq:
    rid: str
    room: int
    max_new_tokens: int
    stage: str = "queue"
    aborted: threading.Event = field(default_factory=threading.Event)
    abort_reason: str | None = None


class DecodeRequests:
    """The live decode requests, by stage, for the gauges and for /abort_request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reqs: set[DecodeReq] = set()

    def add(self, req: DecodeReq) -> None:
        with self._lock:
            self._reqs.add(req)

    def remove(self, req: DecodeReq) -> None:
        with self._lock:
            self._reqs.discard(req)

    def set_stage(self, req: DecodeReq, stage: str) -> None:
        with self._lock:
            req.stage = stage

    def abort(self, req: DecodeReq, reason: str) -> None:
        if req.abort_reason is None:
            req.abort_reason = reason
        req.aborted.set()

    def abort_rid(self, rid: str, reason: str) -> int:
        with self._lock:
            matches = [req for req in self._reqs if req.rid == rid]
        for req in matches:
            self.abort(req, reason)
        return len(matches)

    def abort_all(self, reason: str) -> int:
        with self._lock:
            reqs = list(self._reqs)
        for req in reqs:
            self.abort(req, reason)
        return len(reqs)

    def stage_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STAGES, 0)
        with self._lock:
            for req in self._reqs:
                counts[req.stage] = counts.get(req.stage, 0) + 1
        return counts


class BootstrapClient:
    """Talks to the prefill server's bootstrap port over one keep-alive connection."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self._conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def close(self) -> None:
        self._conn.close()

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        self._conn.request(
            "POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"}
        )
        return self._read_response()

    def _read_response(self) -> dict[str, Any]:
        resp = self._conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise OSError(f"bootstrap server answered {resp.status}: {raw[:200]!r}")
        value = json.loads(raw) if raw else {}
        return value if isinstance(value, dict) else {}

    def register(self, room: int, rid: str, decode_id: str) -> None:
        self._post("/kv/register", {"room": room, "rid": rid, "decode_id": decode_id})

    def wait_transfer(
        self, room: int, should_stop: Callable[[], bool], long_poll_s: float = 0.5
    ) -> int | None:
        """Wait until the room concludes; None when ``should_stop`` turned true first.

        The request is long-polled, and while its answer is pending this thread watches both the
        bootstrap socket and ``should_stop`` (client gone, explicit abort), so an abort is acted
        on within a few milliseconds instead of after the long poll.
        """
        while True:
            self._conn.request(
                "POST",
                "/kv/poll",
                body=json.dumps({"room": room, "timeout": long_poll_s}),
                headers={"Content-Type": "application/json"},
            )
            sock = self._conn.sock
            while True:
                if should_stop():
                    # A response is still pending on this connection: it cannot be reused.
                    self._conn.close()
                    return None
                if sock is None:
                    break
                readable, _, _ = select.select([sock], [], [], 0.01)
                if readable:
                    break
            status = self._read_response().get("status")
            if status == KVPoll.Success or status == KVPoll.Failed:
                return int(status)

    def fail(self, room: int, reason: str) -> None:
        """Ask the prefill side to fail the room; on a fresh connection, the old one may be mid-poll."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(
                "POST",
                "/kv/abort",
                body=json.dumps({"room": room, "reason": reason}),
                headers={"Content-Type": "application/json"},
            )
            conn.getresponse().read()
        finally:
            conn.close()
