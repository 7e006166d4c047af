"""Environment knobs of the demo stack (read once, at server start).

The bug only bites when an abort lands while a transfer worker is sending a *non-last* chunk of
a room and the late ``Transferring`` write reaches the KV manager before the prefill scheduler
next polls its inflight queue. These knobs set the widths of those windows, so tests can make
the race near-certain and a demo can show it in a few seconds. The defaults reproduce the bug
with a storm of ~100-200 streaming requests, concurrency 16-32 and a 0.2 s client timeout.

=============================== ======= ==============================================================
variable                        default meaning
=============================== ======= ==============================================================
SGLANG_DEMO_KV_CHUNKS           4       chunks per KV transfer (>= 2, so there is a non-last chunk)
SGLANG_DEMO_KV_CHUNK_S          0.02    seconds a transfer worker spends sending one chunk
SGLANG_DEMO_KV_WORKERS          4       transfer worker threads (>= 2); rooms are sharded over them
SGLANG_DEMO_RACE_DELAY_S        0.01    race-widening pause between finishing a non-last chunk and
                                        writing ``Transferring`` (completion-queue latency)
SGLANG_DEMO_INFLIGHT_POLL_S     0.05    how often the prefill scheduler polls its inflight queue; a
                                        resurrecting write that lands before the next poll hides the
                                        abort from the scheduler for good
SGLANG_DEMO_FORWARD_S           0.01    simulated prefill forward time per batch
SGLANG_DEMO_TOKEN_S             0.005   simulated decode time per output token
SGLANG_DEMO_STARTUP_S           0.3     warm-up after binding, during which /health answers 503
SGLANG_DEMO_BOOTSTRAP_TIMEOUT_S 30      a prefill room whose decode side never registers fails
                                        after this long
=============================== ======= ==============================================================
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Knobs:
    kv_chunks: int = 4
    kv_chunk_s: float = 0.02
    kv_workers: int = 4
    race_delay_s: float = 0.01
    inflight_poll_s: float = 0.05
    forward_s: float = 0.01
    token_s: float = 0.005
    startup_s: float = 0.3
    bootstrap_timeout_s: float = 30.0

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
        )
