"""Reads of /metrics made up for the analysis tests: Prometheus text as SGLang's tokenizer manager exports it
(python/sglang/srt/metrics/collector.py: the metric names, the default TTFT buckets, one series per model)."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from statistics import NormalDist

from deployer.analysis import Scrape, parse_scrape

TTFT = "sglang:time_to_first_token_seconds"
TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"
# SGLang's default bucket_time_to_first_token
TTFT_BOUNDS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
LABELS = 'model_name="demo-model",engine_type="unified"'


def histogram_text(name: str, bounds: Sequence[float], per_bucket: Sequence[float], total: float,
                   created: float = 1_700_000_000.0) -> str:
    """One histogram's exposition from its per-bucket counts (the last is the +Inf bucket's own)."""
    lines = [f"# HELP {name} Histogram of {name}.", f"# TYPE {name} histogram"]
    running = 0.0
    for bound, n in zip((*bounds, math.inf), per_bucket, strict=True):
        running += n
        le = "+Inf" if bound == math.inf else repr(float(bound))
        lines.append(f'{name}_bucket{{{LABELS},le="{le}"}} {running!r}')
    lines += [f"{name}_count{{{LABELS}}} {running!r}", f"{name}_sum{{{LABELS}}} {total!r}",
              f"# HELP {name}_created Histogram of {name}.", f"# TYPE {name}_created gauge",
              f"{name}_created{{{LABELS}}} {created!r}"]
    return "\n".join(lines) + "\n"


def counter_text(name: str, value: float) -> str:
    return f"# HELP {name} A counter.\n# TYPE {name} counter\n{name}{{{LABELS}}} {float(value)!r}\n"


class Server:
    """A server's TTFT histogram and transfer-failure counter as they grow; `read()` is a /metrics answer."""

    def __init__(self, started: float = 1_700_000_000.0) -> None:
        self.per_bucket = [0.0] * (len(TTFT_BOUNDS) + 1)
        self.total = 0.0
        self.failed = 0.0
        self.created = started

    def observe(self, latencies: Sequence[float]) -> None:
        for latency in latencies:
            self.per_bucket[_bucket(latency)] += 1
            self.total += latency

    def add_counts(self, per_bucket: Sequence[int], total: float) -> None:
        self.per_bucket = [a + b for a, b in zip(self.per_bucket, per_bucket, strict=True)]
        self.total += total

    def text(self) -> str:
        return (histogram_text(TTFT, TTFT_BOUNDS, self.per_bucket, self.total, self.created)
                + counter_text(TRANSFER_FAILED, self.failed))

    def read(self, at: float) -> Scrape:
        return parse_scrape(self.text(), at)


def _bucket(latency: float) -> int:
    return next((i for i, bound in enumerate(TTFT_BOUNDS) if latency <= bound), len(TTFT_BOUNDS))


class Lognormal:
    """Latencies whose log is normal: most requests near the median, a long slow tail, as TTFT under load is.
    `bucket_counts` draws n of them straight into the TTFT buckets: n uniform draws, sorted, cut at the
    distribution's own probabilities at the bucket bounds — exactly how n drawn latencies would fall, at a tenth
    of the cost (the detection test draws three million)."""

    def __init__(self, median: float, sigma: float, slower_by: float = 1.0) -> None:
        self.log = NormalDist(math.log(median * slower_by), sigma)
        self.cdf = [self.log.cdf(math.log(b)) for b in TTFT_BOUNDS]
        self.mean = math.exp(self.log.mean + sigma**2 / 2)

    def quantile(self, q: float) -> float:
        return math.exp(self.log.inv_cdf(q))

    def bucket_counts(self, rng: random.Random, n: int) -> tuple[list[int], float]:
        """Per-bucket counts of n latencies, and their sum (n times the mean: the sum is not judged)."""
        draws = sorted(rng.random() for _ in range(n))
        return _per_bucket([bisect.bisect_right(draws, p) for p in self.cdf], n), n * self.mean

    def expected_counts(self, n: int) -> tuple[list[int], float]:
        """n latencies spread as the distribution expects, no draw: traffic whose only part is to be there."""
        return _per_bucket([round(n * p) for p in self.cdf], n), n * self.mean


def _per_bucket(cumulative: Sequence[int], n: int) -> list[int]:
    return [c - below for c, below in zip([*cumulative, n], [0, *cumulative], strict=True)]
