"""The serving latencies a demo server exports, as SGLang's tokenizer manager does (metrics/collector.py):
``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds`` and
``sglang:e2e_request_latency_seconds`` histograms with SGLang's default buckets (the first's may be given, as
SGLang's ``--bucket-time-to-first-token`` gives them), and the
``sglang:num_aborted_requests_total`` counter; each with its ``_created`` time, as prometheus_client writes it,
so a reader can tell a restarted server from one whose counts grew.

Every generation this server answers (a direct ``/generate``, the OpenAI routes, a PD request on either side)
is timed by a :class:`Request`: the wait before each token comes from it, so the knobs that shape the latencies
(``SGLANG_DEMO_TTFT_S``, ``SGLANG_DEMO_SLOWDOWN``) act in one place. A request that ends before its last token
counts as aborted, and only completed requests observe their end-to-end latency. In PD disaggregation the time to
first token is the prefill's: the prefill server waits it before its forward pass and observes its one token when
its KV is sent (as SGLang's prefill server ends a request after its first token), and the decode server's first
token waits only for that KV.
"""

from __future__ import annotations

import bisect
import math
import random
import threading
import time

from sglang.srt.demo_http import render_family
from sglang.srt.demo_knobs import Knobs

# SGLang's defaults (TokenizerMetricsCollector's bucket_time_to_first_token, ..._inter_token_latency,
# ..._e2e_request_latency)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
# The spread of the simulated time to first token: its log is normal with this sigma (a long slow tail).
TTFT_SIGMA = 0.5


class Histogram:
    def __init__(self, name: str, help_text: str, bounds: tuple[float, ...]) -> None:
        self.name, self.help_text, self.bounds = name, help_text, bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket; the last is above every bound
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1  # a bucket holds what is <= its bound
            self.sum += value

    def render(self, labels: dict[str, str], created: float) -> str:
        with self._lock:
            counts, total = list(self.counts), self.sum
        samples = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
            running += n
            samples.append((f"{self.name}_bucket", {**labels, "le": _le(bound)}, float(running)))
        samples += [(f"{self.name}_count", labels, float(running)), (f"{self.name}_sum", labels, total)]
        return render_family(self.name, "histogram", self.help_text, samples) + _created(self, labels, created)


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help_text = name, help_text  # name without _total, as prometheus_client keeps it
        self.value = 0
        self._lock = threading.Lock()

    def inc(self) -> None:
        with self._lock:
            self.value += 1

    def render(self, labels: dict[str, str], created: float) -> str:
        family = render_family(self.name, "counter", self.help_text,
                               [(f"{self.name}_total", labels, float(self.value))])
        return family + _created(self, labels, created)


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))


def _created(metric: Histogram | Counter, labels: dict[str, str], created: float) -> str:
    name = f"{metric.name}_created"
    return render_family(name, "gauge", metric.help_text, [(name, labels, created)])


class Latencies:
    """One server's latency histograms and aborted-request counter, made when it starts."""

    def __init__(self, knobs: Knobs, ttft_buckets: tuple[float, ...] = TTFT_BUCKETS) -> None:
        self.knobs = knobs
        self.created = time.time()
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              ttft_buckets)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds", E2E_BUCKETS)
        self.aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.")
        self._random = random.Random()

    def request(self, *, prefilled: bool = False) -> Request:
        """A generation starting now; `prefilled`: a PD decode's, whose prefill server waited its first token."""
        knobs = self.knobs
        first = 0.0 if knobs.ttft_s <= 0 or prefilled else \
            self._random.lognormvariate(math.log(knobs.ttft_s), TTFT_SIGMA)
        return Request(self, first * (1 + knobs.slowdown), knobs.token_s * (1 + knobs.slowdown))

    def render(self, labels: dict[str, str]) -> str:
        return "".join(metric.render(labels, self.created) for metric in (self.ttft, self.itl, self.e2e, self.aborted))


class Request:
    """One generation's pace (how long before each token) and timing (what the histograms observe)."""

    def __init__(self, latencies: Latencies, first_wait_s: float, token_wait_s: float) -> None:
        self.latencies = latencies
        self.first_wait_s, self.token_wait_s = first_wait_s, token_wait_s
        self.started = time.monotonic()
        self.last: float | None = None
        self.ended = False

    def wait_s(self) -> float:
        """How long before the next token: the time to first token stands in for prefill under load."""
        return self.token_wait_s + (self.first_wait_s if self.last is None else 0.0)

    def token(self) -> None:
        """A token went out now."""
        now = time.monotonic()
        if self.last is None:
            self.latencies.ttft.observe(now - self.started)
        else:
            self.latencies.itl.observe(now - self.last)
        self.last = now

    def answer_at_once(self, completed: bool) -> None:
        """A generation answered in one piece (not streamed): its time to first token is waited and observed, as
        SGLang observes it for such a request too; the demo model writes the rest at once."""
        time.sleep(self.first_wait_s)
        if completed:
            self.token()
        self.finish(completed)

    def finish(self, completed: bool) -> None:
        """The request ended: to its last token, or not (aborted); said once."""
        if self.ended:
            return
        self.ended = True
        if completed:
            self.latencies.e2e.observe(time.monotonic() - self.started)
        else:
            self.latencies.aborted.inc()
