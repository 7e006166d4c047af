"""Judge the new build on its serving metrics (issue 37 item 1): latency histograms and critical counters, read in
windows, compared with a baseline by deployer/analysis.

Two baselines:
- `baseline: {metrics: URL}`: an unpatched sibling's metrics, read at the same instants as this host's, one round
  trip a read (both GETs in one batch), so both sides saw the same traffic over the same windows (Kayenta's way);
- `baseline: before`: this host itself before its restart. The reads must happen before the restart, so they are
  a step of their own, `analysis_baseline`, placed before `co_restart` (as `baseline` is before `drain`): it
  keeps its reads in the run's facts, and `analysis` after the restart reads its own and judges.

A fail is a failed check (on_failure decides); an inconclusive analysis (too few requests, a metric absent, a
canary that restarted) is never a pass: it raises AnalysisInconclusive, which keeps the commit for a person to
decide, whatever on_failure says (exit 7).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from deployer.agent.protocol import HttpResult
from deployer.analysis import (
    CriticalCounter,
    ExpositionError,
    LatencyCheck,
    Scrape,
    Verdict,
    before_after,
    canary_vs_baseline,
    parse_scrape,
    sglang_checks,
)
from deployer.config.models import Host, Strict, Url
from deployer.errors import AnalysisInconclusive, StepFailed
from deployer.steps.action import Action
from deployer.steps.base import Effect, Scope, Step, no_url
from deployer.steps.context import NOTHING, Context
from deployer.steps.optional import NOT_JUDGED, ChecksHost, Needs, Ordered, Rejudged, UnderTraffic

SCRAPE_TIMEOUT_S = 5.0
Checks = list[LatencyCheck | CriticalCounter]


class ReadParams(Strict):
    url: Url | None = Field(default=None, description=(
        "This host's metrics URL, as the target sees it (default: the host's metrics)."))
    interval_s: float = Field(default=60.0, gt=0, description="Seconds a window lasts: the time between reads.")
    windows: int = Field(default=5, ge=1, description="Windows read (one read more than windows).")


class BaselineReadParams(ReadParams):
    pass


class Sibling(Strict):
    metrics: Url = Field(description="An unpatched sibling's metrics URL, as the target sees it.")


class AnalysisParams(ReadParams):
    checks: Checks = Field(default_factory=sglang_checks, description=(
        "What is judged: `histogram` checks (a quantile or the mean at most `allowed_change` worse) and `critical` "
        "counters (any increase fails). Default: SGLang's p99 TTFT, inter-token and end-to-end latency at most "
        "+10%, and aborted requests, KV transfer and bootstrap failures."))
    baseline: Literal["before"] | Sibling = Field(default="before", description=(
        "`before`: this host before its restart, read by an `analysis_baseline` step placed before the restart; "
        "`{metrics: URL}`: an unpatched sibling read at the same instants."))
    initial_delay_s: float = Field(default=0.0, ge=0, description=(
        "Seconds to wait before the first read: a new process's first requests pay its warm-up."))


def metrics_url(ctx: Context, params: ReadParams, step: str) -> str:
    url = params.url or ctx.host.metrics
    if url is None:
        raise StepFailed(step, f"no metrics URL: set `metrics` on host {ctx.host_name} or `url` on the step")
    return url


def scrape_action(key: str, what: str, url: str, params: ReadParams) -> Action:
    return Action.http(key, f"read {what} {params.windows + 1} times, every {params.interval_s:g}s", url,
                       repeats=True)


def read(ctx: Context, step: str, actions: Sequence[Action], params: ReadParams) -> list[list[tuple[float, str]]]:
    """windows + 1 rounds of the actions, one round trip each, every interval_s from the first (the windows stay
    interval_s long whatever a read costs): for each action, its (time, text) reads. A read without an answer is
    no window: inconclusive."""
    sides: list[list[tuple[float, str]]] = [[] for _ in actions]
    started = time.monotonic()
    with ctx.poll(SCRAPE_TIMEOUT_S) as rounds:
        for i in range(params.windows + 1):
            ctx.cancel.wait(max(0.0, started + i * params.interval_s - time.monotonic()))
            at = time.time()
            for side, answer in zip(sides, rounds.round([(a, NOTHING) for a in actions]), strict=True):
                side.append((at, answered(step, answer)))
    return sides


def inconclusive(step: str, why: str) -> AnalysisInconclusive:
    return AnalysisInconclusive(f"step '{step}' is inconclusive (held, never passed): {why}")


def answered(step: str, answer: HttpResult) -> str:
    if answer.status is None:
        raise inconclusive(step, f"cannot reach {answer.url}: {answer.error}")
    if answer.status >= 400:
        raise inconclusive(step, f"{answer.url} answered HTTP {answer.status}")
    return answer.text


def parsed(step: str, reads: Sequence[tuple[float, str]]) -> list[Scrape]:
    try:
        return [parse_scrape(text, at) for at, text in reads]
    except ExpositionError as exc:
        raise inconclusive(step, f"{exc}") from None


class AnalysisBaseline(Step, ChecksHost, Ordered):
    """Read this host's metrics before its restart, in windows, as the baseline of an `analysis` step with
    `baseline: before` (placed before the restart; it judges nothing)."""

    kind = "analysis_baseline"
    before = ("co_restart",)
    scope = Scope.metrics_host
    Params = BaselineReadParams
    params: BaselineReadParams

    def check_host(self, host_name: str, host: Host) -> str | None:
        return no_url(self.params.url, host.metrics, host_name, "metrics", "metrics")

    def plan(self, ctx: Context) -> list[Action]:
        return [scrape_action("before", "the metrics before the restart", metrics_url(ctx, self.params, self.name),
                              self.params)]

    def run(self, ctx: Context) -> str:
        [reads] = read(ctx, self.name, self.plan(ctx), self.params)
        parsed(self.name, reads)  # unreadable metrics fail here, before the restart
        ctx.facts.analysis_before = reads
        return f"{self.params.windows} windows of {self.params.interval_s:g}s read before the restart"


class Analysis(Step, ChecksHost, Needs, Rejudged, UnderTraffic):
    """Judge the new build against a baseline on its serving metrics: each check's pass, fail or inconclusive,
    and why; a fail is a failed check, inconclusive is never a pass (exit 7: the commit is kept for a person). In a
    unit behind a router it runs once the unit is back in it, under the traffic the router sends it."""

    kind = "analysis"
    scope = Scope.metrics_host
    effect = Effect.verifies
    Params = AnalysisParams
    params: AnalysisParams

    def check_host(self, host_name: str, host: Host) -> str | None:
        return no_url(self.params.url, host.metrics, host_name, "metrics", "metrics")

    def plan(self, ctx: Context) -> list[Action]:
        judged = Action(f"judge {self.baseline_said()} on {self.params.windows} windows: " +
                        "; ".join(planned(check) for check in self.params.checks))
        wait = [Action(f"wait {self.params.initial_delay_s:g}s for the new build to warm up")] \
            if self.params.initial_delay_s else []
        return [*wait, *self.reads(ctx), judged]

    def reads(self, ctx: Context) -> list[Action]:
        """This host's read, and the sibling's at the same instants (in the same round trip) when it is one."""
        own = scrape_action("canary", "this host's metrics", metrics_url(ctx, self.params, self.name), self.params)
        if isinstance(self.params.baseline, Sibling):
            return [own, scrape_action("baseline", "the sibling's metrics at the same instants",
                                       self.params.baseline.metrics, self.params)]
        return [own]

    def baseline_said(self) -> str:
        if isinstance(self.params.baseline, Sibling):
            return "this host against its sibling"
        return "this host after its restart against before it (analysis_baseline's reads)"

    def needs(self) -> dict[str, str]:
        """`baseline: before` without reads before the restart would fail after the commit and the restart."""
        if self.params.baseline != "before":
            return {}
        return {AnalysisBaseline.kind: "`baseline: before` judges against its reads before the restart (or name "
                                       "an unpatched sibling: `baseline: {metrics: URL}`)"}

    def after_revert(self, baseline: Mapping[str, float]) -> Step | str:
        """A rollback judges the reverted build against the sibling again; never against the reads before the
        fix's restart, which were of that same build (and which a rollback run of its own does not have)."""
        if isinstance(self.params.baseline, Sibling):
            return RevertedAnalysis(self.params, self.name, self.where)
        return "its baseline is the reverted build itself, read before the fix's restart"

    def run(self, ctx: Context) -> str:
        before = ctx.facts.analysis_before
        if self.params.baseline == "before" and not before:
            raise StepFailed(self.name, "no reads before the restart: `baseline: before` needs an "
                             "`analysis_baseline` step before the restart")
        ctx.cancel.wait(self.params.initial_delay_s)
        canary, *sibling = [parsed(self.name, reads) for reads in read(ctx, self.name, self.reads(ctx), self.params)]
        report = canary_vs_baseline(self.params.checks, canary, sibling[0]) if sibling else \
            before_after(self.params.checks, parsed(self.name, before), canary)
        ctx.emit("analysis", **report.model_dump(mode="json"))
        verdicts = "; ".join(shown(c, v) for c, v in zip(self.params.checks, report.verdicts, strict=True))
        if report.outcome == "fail":
            raise StepFailed(self.name, verdicts)
        if report.outcome == "inconclusive":
            raise inconclusive(self.name, verdicts)
        return verdicts


class RevertedAnalysis(Analysis):
    """The analysis as a rollback runs it on the reverted build: a fail is a failed check, as for any check, but an
    inconclusive one (no traffic, as while a rollout is paused) holds nothing — the revert is what the operator
    chose — so it is said and not judged, never passed, instead of stopping the rollback (which, run again, would
    find no more traffic)."""

    def run(self, ctx: Context) -> str:
        try:
            return super().run(ctx)
        except AnalysisInconclusive as exc:
            return f"{NOT_JUDGED}: {exc}"


def planned(check: LatencyCheck | CriticalCounter) -> str:
    """What a check judges, in plan's words."""
    labels = ",".join(f'{k}="{v}"' for k, v in check.labels.items())
    metric = f"{check.metric}{{{labels}}}" if labels else check.metric
    if isinstance(check, CriticalCounter):
        return f"{check.name}: any increase of {metric} fails"
    sign = "+" if check.better == "lower" else "-"
    effect = f", an effect of at least {check.min_effect:g} toward worse to fail" if check.min_effect else ""
    return (f"{check.name}: {check.statistic()} of {metric} at most {sign}{check.allowed_change:.0%}, "
            f"{check.min_samples} observations a side, confidence {check.confidence:g}{effect}")


def shown(check: LatencyCheck | CriticalCounter, verdict: Verdict) -> str:
    """One check's verdict on a line: `p99 TTFT 0.68 -> 1.8 (+164.7%, allowed +10%): fail (Mann-Whitney U
    p=6e-17)`; a counter's increase on each side; a check with nothing to judge, why."""
    if verdict.method == "none" or verdict.baseline is None or verdict.canary is None:
        return f"{verdict.check}: {verdict.outcome} ({verdict.why})"
    restarted = " (the canary restarted: held)" if any(w.reset for w in verdict.canary_windows) else ""
    if isinstance(check, CriticalCounter):
        return (f"{verdict.check} +{verdict.baseline:g} -> +{verdict.canary:g} (any increase fails): "
                f"{verdict.outcome}{restarted}")
    how = "quantile comparison" if verdict.test is None else f"Mann-Whitney U p={verdict.test.p:.2g}"
    if verdict.test is not None and check.min_effect:
        how += (f", effect {check.toward_worse(verdict.test.rank_biserial):+.2f} toward worse, "
                f"{check.min_effect:g} needed to fail")
    change = "" if verdict.change is None else f"{verdict.change:+.1%}, "
    sign = "+" if check.better == "lower" else "-"
    return (f"{verdict.check} {verdict.baseline:.3g} -> {verdict.canary:.3g} ({change}allowed "
            f"{sign}{check.allowed_change:.0%}): {verdict.outcome} ({how}){restarted}")
