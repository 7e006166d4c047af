"""Read the serving metrics: a baseline before the fix, and a drain that must hold after it.

An idle SGLang server republishes gauges only every ~30 s, so one reading proves nothing:
a condition must hold over several consecutive polls. A metric that is absent or cannot
be parsed is *inconclusive*, and inconclusive is never a pass.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from deployer.agent.protocol import HttpResult
from deployer.config.models import Host, Strict, Url
from deployer.errors import StepFailed
from deployer.steps.action import Action
from deployer.steps.base import Effect, Scope, Step, no_url
from deployer.steps.context import NOTHING, Context
from deployer.steps.optional import ChecksHost, LiveCheck, NotesPlan, ReadsLive, Rejudged
from deployer.steps.storm import StormParams, no_abort_all, storm, storm_actions
from deployer.transport.base import Transport

SCRAPE_TIMEOUT_S = 5.0
COMPARE: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge, "==": operator.eq}


class MetricParams(Strict):
    metric: str = Field(description="The Prometheus metric's name.")
    labels: dict[str, str] = Field(default_factory=dict, description="The labels a series must have to be read.")
    aggregate: Literal["sum", "max"] = Field(default="sum", description=(
        "How the series that match are combined: sum or max."))
    url: Url | None = Field(default=None, description=(
        "The metrics URL, as the target sees it (default: the host's metrics)."))
    interval_s: float = Field(default=1.0, gt=0, description="Seconds between polls.")
    stable_polls: int = Field(default=3, ge=1, description="Consecutive polls that must agree.")


@dataclass(frozen=True)
class Reading:
    """One read of a metric: its value, or why there is none."""
    value: float | None
    problem: str | None = None  # why there is no value: the reading is inconclusive
    absent: bool = False  # the page parsed and holds no such series (not: it could not be read)


def parse(text: str, params: MetricParams) -> Reading:
    # here: prometheus_client brings http.server and urllib with it, which runs without a metric step never need
    from prometheus_client.parser import text_string_to_metric_families

    try:
        values = [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                  if sample.name == params.metric
                  and all(sample.labels.get(k) == v for k, v in params.labels.items())]
    except (ValueError, TypeError, IndexError) as exc:
        return Reading(None, f"unparseable metrics: {exc}")
    if not values:
        wanted = params.metric + (f"{params.labels}" if params.labels else "")
        return Reading(None, f"metric {wanted} absent", absent=True)
    return Reading(sum(values) if params.aggregate == "sum" else max(values))


def reading(answer: HttpResult, params: MetricParams) -> Reading:
    if answer.status is None:
        return Reading(None, f"cannot reach {answer.url}: {answer.error}")
    if answer.status >= 400:
        return Reading(None, f"{answer.url} answered HTTP {answer.status}")
    return parse(answer.text, params)


def scrape(transport: Transport, url: str, params: MetricParams) -> Reading:
    """One reading of url, fetched by the agent on the target's own loopback."""
    return reading(transport.http(url, timeout=SCRAPE_TIMEOUT_S), params)


def metrics_url(ctx: Context, params: MetricParams, step: str) -> str:
    url = params.url or ctx.host.metrics
    if url is None:
        raise StepFailed(step, f"no metrics URL: set `metrics` on host {ctx.host_name} or `url` on the step")
    return url


def describe(params: MetricParams) -> str:
    labels = ",".join(f'{k}="{v}"' for k, v in params.labels.items())
    return f"{params.aggregate}({params.metric}{{{labels}}})"


@dataclass(frozen=True)
class Polled:
    """A poll of a metric until its condition held (or not), with every sample."""
    held: bool  # the condition held for stable_polls consecutive readings
    samples: list[Reading]

    @property
    def last(self) -> Reading:
        return self.samples[-1]


def scrape_action(ctx: Context, params: MetricParams, step: str, until: str) -> Action:
    return Action.http("scrape", f"read {describe(params)} every {params.interval_s:g}s until {until}",
                       metrics_url(ctx, params, step), repeats=True)


def poll(ctx: Context, action: Action, params: MetricParams, until: Callable[[float], bool],
         within_s: float, target: str | None) -> Polled:
    """Scrape (one round trip a poll) until `until` holds for stable_polls consecutive readings, or within_s runs out.
    Every sample is in the run log, with the target it is polled for (`<= 0`; None: none but a steady reading)
    and its time against within_s, as the live view shows it; the scrape itself once, with how often it ran."""
    started = time.monotonic()
    deadline = started + within_s
    samples: list[Reading] = []
    streak = 0
    with ctx.poll(SCRAPE_TIMEOUT_S) as rounds:
        while True:
            [answer] = rounds.round([(action, NOTHING)])
            samples.append(now := reading(answer, params))
            ctx.emit("sample", metric=params.metric, labels=params.labels, aggregate=params.aggregate,
                     url=action.target, value=now.value, problem=now.problem, target=target,
                     elapsed_s=round(time.monotonic() - started, 1), budget_s=within_s)
            streak = streak + 1 if now.value is not None and until(now.value) else 0
            if streak >= params.stable_polls or time.monotonic() + params.interval_s > deadline:
                return Polled(streak >= params.stable_polls, samples)
            ctx.cancel.wait(params.interval_s)


def show(samples: list[Reading], last: int = 8) -> str:
    return ", ".join("absent" if r.value is None else f"{r.value:g}" for r in samples[-last:])


def proves_nothing(reading: str, bound: str) -> str:
    """Why a drain whose baseline already met its bound proves nothing (the symptom was never shown)."""
    return (f"{reading}, which already meets the drain's {bound}: the drain cannot tell the fix from no fix (show "
            "the symptom first: `storm: true` on the baseline)")


def baseline_was(metric: str, value: float) -> str:
    return f"the baseline of {metric} was {value:g}"


class MetricStep(Step, ChecksHost, ReadsLive):
    params: MetricParams

    def check_host(self, host_name: str, host: Host) -> str | None:
        return no_url(self.params.url, host.metrics, host_name, "metrics", "metrics")

    def live_checks(self, ctx: Context) -> list[LiveCheck]:
        url = self.params.url or ctx.host.metrics
        if url is None:
            return []  # check_host already names the missing URL
        now = scrape(ctx.transport, url, self.params)
        return [LiveCheck(f"metric ({self.name})", now.value is not None,
                          f"{self.params.metric} = {now.value:g}" if now.value is not None
                          else f"inconclusive: {now.problem}")]


class BaselineParams(MetricParams):
    storm: StormParams | None = Field(default=None, description=(
        "A storm sent first, to show the symptom: true (the storm's defaults) or the storm step's parameters."))
    within_s: float = Field(default=20.0, gt=0, description="Seconds the reading has to settle.")

    @field_validator("storm", mode="before")
    @classmethod
    def _storm_flag(cls, value: object) -> object:
        # A bool|StormParams union would report both branches for one mistake in the mapping.
        if isinstance(value, bool):
            return {} if value else None
        return value


class Baseline(MetricStep):
    """Record the metric before the fix (after a storm, to show the symptom); it gates nothing."""

    kind = "baseline"
    scope = Scope.metrics_host
    Params = BaselineParams
    params: BaselineParams

    def check_host(self, host_name: str, host: Host) -> str | None:
        storm = self.params.storm
        missing = None if storm is None else no_url(
            storm.url, host.endpoint, host_name, "storm", "endpoint", "`storm: {url: ...}`") or \
            no_abort_all(storm, host)
        return missing or super().check_host(host_name, host)

    def scrape(self, ctx: Context) -> Action:
        return scrape_action(ctx, self.params, self.name, f"{self.params.stable_polls} polls agree "
                             f"(at most {self.params.within_s:g}s)")

    def plan(self, ctx: Context) -> list[Action]:
        storm_params = self.params.storm
        return [*([] if storm_params is None else storm_actions(ctx, storm_params)), self.scrape(ctx)]

    def run(self, ctx: Context) -> str:
        if (storm_params := self.params.storm) is not None:
            storm(ctx, storm_params)
        previous: list[float] = []

        def steady(value: float) -> bool:
            previous.append(value)
            return len(previous) < 2 or previous[-2] == value

        polled = poll(ctx, self.scrape(ctx), self.params, steady, self.params.within_s, None)
        last, samples = polled.last, polled.samples
        if last.value is None:
            raise StepFailed(self.name, f"inconclusive: {last.problem}")
        ctx.facts.baseline = {**ctx.facts.baseline, self.params.metric: last.value}
        return f"{describe(self.params)} = {last.value:g} (samples: {show(samples)})"


class DrainParams(MetricParams):
    to: float = Field(description="The bound the metric must meet.")
    op: Literal["<=", ">=", "=="] = Field(default="<=", description="How the metric is compared with to.")
    within_s: float = Field(default=60.0, gt=0, description="Seconds the metric has to meet the bound.")


class Drain(MetricStep, Rejudged, NotesPlan):
    """The symptom must be gone: the metric meets the bound over consecutive polls in time."""

    kind = "drain"
    scope = Scope.metrics_host
    effect = Effect.verifies
    Params = DrainParams
    params: DrainParams

    def scrape(self, ctx: Context) -> Action:
        return scrape_action(ctx, self.params, self.name, f"{self.bound()} for "
                             f"{self.params.stable_polls} polls (at most {self.params.within_s:g}s)")

    def plan(self, ctx: Context) -> list[Action]:
        return [self.scrape(ctx)]

    def holds(self, value: float) -> bool:
        return COMPARE[self.params.op](value, self.params.to)

    def bound(self) -> str:
        return f"{self.params.op} {self.params.to:g}"

    def after_revert(self, baseline: Mapping[str, float]) -> Step | str:
        before = baseline.get(self.params.metric)
        if before is None:
            return (f"no baseline of {self.params.metric} was recorded before the fix: nothing to judge the "
                    "reverted build against (add a `baseline` step to the playbook, or give one with --baseline)")
        return RevertedDrain(self, before)

    def run(self, ctx: Context) -> str:
        polled = poll(ctx, self.scrape(ctx), self.params, self.holds, self.params.within_s, self.bound())
        last, samples = polled.last, polled.samples
        final = next((r.value for r in reversed(samples) if r.value is not None), None)
        before = self.baseline(ctx)
        self.record(ctx, {"baseline": before, "final": final})
        if last.value is None:
            raise StepFailed(self.name, f"inconclusive: {last.problem} (last samples: {show(samples)})")
        if not polled.held:
            raise StepFailed(self.name, f"{describe(self.params)} did not reach {self.bound()} for "
                             f"{self.params.stable_polls} polls within {self.params.within_s:g}s (last samples: "
                             f"{show(samples)})")
        shown = "?" if before is None else f"{before:g}"
        return f"{describe(self.params)}: {shown} -> {last.value:g} (samples: {show(samples)})" + \
            self.unproven(ctx, before)

    def baseline(self, ctx: Context) -> float | None:
        return ctx.facts.baseline.get(self.params.metric)

    def record(self, ctx: Context, figures: dict[str, float | None]) -> None:
        ctx.facts.drain = {**ctx.facts.drain, self.params.metric: figures}  # a playbook may drain several gauges

    def unproven(self, ctx: Context, before: float | None) -> str:
        """A pass whose baseline already met the bound proves nothing: the symptom never showed, so this drain could
        not have failed without the fix either. Kept in the facts and the log; how the step's detail ends."""
        if before is None or not self.holds(before):
            return ""
        ctx.facts.baseline_met = {**ctx.facts.baseline_met, self.params.metric: self.bound()}
        ctx.emit("baseline_met", metric=self.params.metric, baseline=before, bound=self.bound())
        return f", proving nothing: its baseline already met {self.bound()}"

    def plan_note(self, ctx: Context, steps: Sequence[Step]) -> str | None:
        """Whether its baseline may already meet its bound: read now when the baseline reads the metric as it is
        (no storm first); said as what apply will judge when a storm comes first."""
        baseline = next((s for s in steps if isinstance(s, Baseline) and s.params.metric == self.params.metric),
                        None)
        if baseline is None:
            return None
        if baseline.params.storm is not None:
            return (f"{baseline.name} reads {self.params.metric} after its storm: if it already meets {self.bound()} "
                    "then, this drain proves nothing, and apply says so")
        url = baseline.params.url or ctx.host.metrics
        now = None if url is None else scrape(ctx.transport, url, baseline.params).value
        return None if now is None or not self.holds(now) else proves_nothing(
            f"{self.params.metric} reads {now:g} now, and {baseline.name} reads it without a storm first",
            self.bound())


class RevertedDrain(Drain):
    """The fix's drain as a rollback runs it on the reverted build: no worse than the run's baseline before the
    fix. The old build still has the bug, so the fix's own bound would fail it for ever (and under traffic it
    wedges again within seconds): the rollback proves the revert, not the fix."""

    def __init__(self, drain: Drain, before: float) -> None:
        super().__init__(drain.params, drain.name, drain.where)
        self.was = before

    def holds(self, value: float) -> bool:
        if self.params.op == "==":  # no further from the fix's value than the baseline was
            return abs(value - self.params.to) <= abs(self.was - self.params.to)
        return super().holds(value) or COMPARE[self.params.op](value, self.was)

    def bound(self) -> str:
        if self.params.op == "==":
            return f"within {abs(self.was - self.params.to):g} of {self.params.to:g} (no worse than " \
                   f"{self.was:g}, its baseline before the fix)"
        loosest = max if self.params.op == "<=" else min
        return f"{self.params.op} {loosest(self.was, self.params.to):g} (no worse than {self.was:g}, " \
               "its baseline before the fix)"

    def run(self, ctx: Context) -> str:
        return f"reverted build, no worse than before the fix: {super().run(ctx)}"

    def baseline(self, ctx: Context) -> float | None:
        return self.was

    def record(self, ctx: Context, figures: dict[str, float | None]) -> None:
        # The fix's own drain stays in the record: this is the reverted build's
        ctx.facts.rollback_drain = {**ctx.facts.rollback_drain, self.params.metric: figures}

    def unproven(self, ctx: Context, before: float | None) -> str:
        return ""  # its bound is its baseline: no worse than before the fix is what it proves
