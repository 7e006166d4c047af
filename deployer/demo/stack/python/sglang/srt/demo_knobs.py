"""Environment knobs of the demo stack (read once, at server start).

The bug bites when an abort lands while a transfer worker is sending a *non-last* chunk of a
room, and the worker's late ``Transferring`` write then reaches the KV manager after every abort
of that room (the prefill side's own disconnect handling *and* the decode side's "fail this
room") but before the prefill scheduler next polls its inflight queue. These knobs set the
widths of those windows, so tests can make the race near-certain and a demo shows it in seconds.

The defaults make one transfer (~0.4 s) outlast a 0.2 s client timeout, so nearly every room
that reaches a transfer worker during a storm is aborted mid-chunk: a storm of 100-200 requests
at concurrency 16-32 with a 0.2 s timeout leaves ~10-40 rooms stuck on the buggy build (measured
on 2 cores), and none on the fixed one. Requests with a generous timeout still complete (~0.5 s).

=============================== ======= ==============================================================
variable                        default meaning
=============================== ======= ==============================================================
SGLANG_DEMO_KV_CHUNKS           4       chunks per KV transfer (>= 2, so there is a non-last chunk)
SGLANG_DEMO_KV_CHUNK_S          0.06    mean seconds to send one chunk (each chunk takes 0.5x-1.5x)
SGLANG_DEMO_KV_WORKERS          4       transfer worker threads (>= 2); rooms are sharded over them
SGLANG_DEMO_RACE_DELAY_S        0.06    race-widening pause between finishing a non-last chunk and
                                        writing ``Transferring`` (completion-queue latency); the
                                        longer it is, the likelier every abort lands before the write
SGLANG_DEMO_INFLIGHT_POLL_S     0.3     how often the prefill scheduler polls its inflight queue
                                        (stands in for the forward passes of a busy prefill GPU); a
                                        poll between an abort and the stale write releases the room
SGLANG_DEMO_FORWARD_S           0.01    simulated prefill forward time per batch
SGLANG_DEMO_TOKEN_S             0.005   simulated decode time per output token
SGLANG_DEMO_STARTUP_S           0.3     warm-up after binding, during which /health answers 503
SGLANG_DEMO_BOOTSTRAP_TIMEOUT_S 30      a prefill room whose decode side never registers fails
                                        after this long
SGLANG_DEMO_STOP_HANG_S         0       after SIGTERM the server goes on serving this long before it
                                        stops (upstream drains in-flight requests with no deadline)
SGLANG_DEMO_SCHEDULER_OWN_GROUP 0       1: the scheduler child leaves the server's process group
SGLANG_DEMO_GENERATE_FAIL       (none)  a direct ``/generate`` fails as broken PD serving does: ``error``
                                        answers HTTP 200 with ``finish_reason: {"type": "error"}``
                                        (smg#2382), ``500`` answers HTTP 500 (sglang#33789)
SGLANG_DEMO_RANK_CRASH_S        (none)  a rank > 0 of a multi-node server exits with status 1 this long
                                        after it starts, before it joins the rendezvous
SGLANG_DEMO_TTFT_S              0       the median of a simulated wait before a generation's first token
                                        (prefill under load; log-normal, a long slow tail), so the time
                                        to first token spreads over SGLang's buckets (0.25 looks like a
                                        loaded server); 0: none
SGLANG_DEMO_SLOWDOWN            0       a latency regression: every generation's waits (the one above and
                                        each token's) are this fraction longer (0.2: 20% slower); the
                                        build's own ``demo_build.SLOWDOWN`` adds to it
=============================== ======= ==============================================================

``/abort_request {"abort_all": true}`` re-fails every request the prefill scheduler still holds,
stuck ones included (as upstream does), so it clears the symptom until the next storm.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from sglang.srt import demo_build


def _read(name: str, default: float, *, minimum: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise SystemExit(f"{name}={raw!r}: must be a finite number >= {minimum}")
    return value


def _choice(name: str, allowed: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip()
    if raw not in allowed:
        raise SystemExit(f"{name}={raw!r}: must be one of {', '.join(repr(a) for a in allowed)}")
    return raw


@dataclass(frozen=True)
class Knobs:
    kv_chunks: int = 4
    kv_chunk_s: float = 0.06
    kv_workers: int = 4
    race_delay_s: float = 0.06
    inflight_poll_s: float = 0.3
    forward_s: float = 0.01
    token_s: float = 0.005
    startup_s: float = 0.3
    bootstrap_timeout_s: float = 30.0
    stop_hang_s: float = 0.0
    scheduler_own_group: bool = False
    generate_fail: str = ""  # "", "error" or "500"
    rank_crash_s: float | None = None
    ttft_s: float = 0.0
    slowdown: float = 0.0

    @classmethod
    def from_env(cls) -> Knobs:
        d = cls()
        return cls(
            kv_chunks=int(_read("SGLANG_DEMO_KV_CHUNKS", d.kv_chunks, minimum=2)),
            kv_chunk_s=_read("SGLANG_DEMO_KV_CHUNK_S", d.kv_chunk_s, minimum=0.0),
            kv_workers=int(_read("SGLANG_DEMO_KV_WORKERS", d.kv_workers, minimum=2)),
            race_delay_s=_read("SGLANG_DEMO_RACE_DELAY_S", d.race_delay_s, minimum=0.0),
            inflight_poll_s=_read("SGLANG_DEMO_INFLIGHT_POLL_S", d.inflight_poll_s, minimum=0.0),
            forward_s=_read("SGLANG_DEMO_FORWARD_S", d.forward_s, minimum=0.0),
            token_s=_read("SGLANG_DEMO_TOKEN_S", d.token_s, minimum=0.0),
            startup_s=_read("SGLANG_DEMO_STARTUP_S", d.startup_s, minimum=0.0),
            bootstrap_timeout_s=_read(
                "SGLANG_DEMO_BOOTSTRAP_TIMEOUT_S", d.bootstrap_timeout_s, minimum=0.1
            ),
            stop_hang_s=_read("SGLANG_DEMO_STOP_HANG_S", d.stop_hang_s, minimum=0.0),
            scheduler_own_group=bool(_read("SGLANG_DEMO_SCHEDULER_OWN_GROUP", 0, minimum=0)),
            generate_fail=_choice("SGLANG_DEMO_GENERATE_FAIL", ("", "error", "500")),
            rank_crash_s=None if not os.environ.get("SGLANG_DEMO_RANK_CRASH_S")
            else _read("SGLANG_DEMO_RANK_CRASH_S", 0.0, minimum=0.0),
            ttft_s=_read("SGLANG_DEMO_TTFT_S", d.ttft_s, minimum=0.0),
            slowdown=_read("SGLANG_DEMO_SLOWDOWN", d.slowdown, minimum=0.0) + demo_build.SLOWDOWN,
        )
