"""What an analysis judges: one check per metric, as a playbook will name them.

A latency check compares a statistic of a histogram (a quantile, or the mean) between the baseline and the
canary: which way is better, how much worse the canary may be, and how many observations each side needs before
anything is said. A critical counter fails the canary on any increase: a KV transfer or bootstrap that failed is
a request a user lost, whatever the baseline did.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from deployer.config.models import Strict


class LatencyCheck(Strict):
    kind: Literal["histogram"] = Field(default="histogram", description=(
        "A latency histogram: its statistic compared with the baseline's."))
    name: str = Field(description="What the check is called in plan, the run log and the summary: `p99 TTFT`.")
    metric: str = Field(description="The histogram's family name: `sglang:time_to_first_token_seconds`.")
    labels: dict[str, str] = Field(default_factory=dict, description="The labels a series must have to count.")
    quantile: float | None = Field(default=0.99, ge=0, le=1, description=(
        "The quantile compared (0.99: p99); null compares the mean (`_sum / _count`, exact, not estimated)."))
    better: Literal["lower", "higher"] = Field(default="lower", description="Which way is better.")
    allowed_change: float = Field(default=0.10, ge=0, description=(
        "How much worse the canary's statistic may be, as a fraction of the baseline's: 0.10 allows +10%."))
    min_samples: int = Field(default=50, ge=1, description=(
        "Observations each side needs, over all its windows; fewer is inconclusive, never a pass."))
    confidence: float = Field(default=0.98, gt=0, lt=1, description=(
        "The Mann-Whitney test's confidence (Kayenta's default 0.98): a difference counts when p < 1 - this."))
    min_effect: float = Field(default=0.0, ge=0, lt=1, description=(
        "The least effect a fail needs besides the test: the rank-biserial correlation of the canary's observations "
        "with the baseline's, toward worse (2 * CLES - 1: 0.5 is a canary observation worse than a baseline one "
        "three times in four). "
        "0 (the default): any significant worsening beyond `allowed_change` fails. A before-and-after baseline "
        "on a busy machine drifts between its reads by a small effect the test still finds significant."))
    required: bool = Field(default=True, description="Whether a histogram absent from a read is inconclusive.")

    def toward_worse(self, rank_biserial: float) -> float:
        """The effect size signed so that > 0 is the canary worse (the rank-biserial is > 0 when it is larger)."""
        return rank_biserial if self.better == "lower" else -rank_biserial

    def statistic(self) -> str:
        if self.quantile is None:
            return "mean"
        return f"p{self.quantile * 100:g}"


class CriticalCounter(Strict):
    kind: Literal["critical"] = Field(default="critical", description=(
        "A critical counter: any increase in the canary fails it."))
    name: str = Field(description="What the check is called: `KV transfer failures`.")
    metric: str = Field(description="The counter's sample name: `sglang:num_transfer_failed_reqs_total`.")
    labels: dict[str, str] = Field(default_factory=dict, description="The labels a series must have to count.")
    required: bool = Field(default=True, description=(
        "Whether a counter absent from a read is inconclusive (false: a server that does not export it, say "
        "one not serving PD disaggregation, passes it)."))


Check = Annotated[LatencyCheck | CriticalCounter, Field(discriminator="kind")]


def sglang_checks(allowed_change: float = 0.10) -> list[LatencyCheck | CriticalCounter]:
    """SGLang's serving metrics (python/sglang/srt/metrics/collector.py) judged as issue 37 asks: p99 TTFT,
    inter-token latency and end-to-end latency at most `allowed_change` worse, and any aborted request, KV
    transfer or bootstrap failure a fail (the last two exported only in PD disaggregation, so not required).
    A client that gives up aborts its request too: traffic that times out on purpose needs this check dropped."""
    latency = [("p99 TTFT", "sglang:time_to_first_token_seconds"),
               ("p99 inter-token latency", "sglang:inter_token_latency_seconds"),
               ("p99 end-to-end latency", "sglang:e2e_request_latency_seconds")]
    return [*(LatencyCheck(name=name, metric=metric, allowed_change=allowed_change) for name, metric in latency),
            CriticalCounter(name="aborted requests", metric="sglang:num_aborted_requests_total", required=False),
            CriticalCounter(name="KV transfer failures", metric="sglang:num_transfer_failed_reqs_total",
                            required=False),
            CriticalCounter(name="KV bootstrap failures", metric="sglang:num_bootstrap_failed_reqs_total",
                            required=False)]
