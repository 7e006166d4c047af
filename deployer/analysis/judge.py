"""The verdict on a new build: each check's pass / fail / inconclusive and why, and the report over all checks.

Two ways to have a baseline:
- `canary_vs_baseline`: the patched unit and an unpatched sibling read at the same instants, so both saw the
  same hours, the same traffic mix and the same neighbours (Kayenta's way, and the better one);
- `before_after`: the unit itself, read before its restart and again after it (after the warm-up: the first
  requests of a new process pay compile and CUDA-graph costs, so the caller starts the after reads past it).

A latency check, on the observations of all windows pooled:
1. too few observations on either side (< min_samples) is *inconclusive*: hold, never pass;
2. the statistic (p99 by histogram_quantile, or the exact mean) of each side, and the canary's change;
3. the Mann-Whitney U test where it can run (>= 20 observations a side, not every one tied): the canary *fails*
   when its statistic is worse than allowed AND the test finds it worse at the check's confidence; worse than
   allowed without a significant difference is noise the test cannot tell from a change, and passes, as in
   Kayenta (which scores such a metric as not different); a significant difference within the allowed change
   passes too (a large sample finds tiny shifts), and so does one whose effect size (rank-biserial) is under the
   check's `min_effect` (Kayenta's CLES effect-size measure). Where the test cannot run, the statistic alone
   decides: the quantile comparison.
A critical counter fails on any increase in the canary's windows. A canary that restarted within its windows
(a crash?) is held: what would pass is inconclusive.

Everything here is pure: reads in, a typed report out, which the run log records as JSON (model_dump(mode="json")).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from deployer.analysis.checks import CriticalCounter, LatencyCheck
from deployer.analysis.exposition import ExpositionError, Scrape
from deployer.analysis.mannwhitney import MIN_PER_SIDE, MannWhitney, mann_whitney
from deployer.analysis.observed import BucketsDiffer, Observed, from_samples, from_windows
from deployer.analysis.window import Absent, CounterWindow, HistogramWindow, counter_windows, histogram_windows

Outcome = Literal["pass", "fail", "inconclusive"]
Mode = Literal["canary-baseline", "before-after"]


class WindowRecord(BaseModel):
    """One window of one side, as the run log keeps it and a chart draws it."""
    model_config = ConfigDict(frozen=True)

    start: float
    end: float
    count: float | None  # observations (a histogram's); None for a counter
    value: float | None  # the check's statistic over this window alone, or the counter's increase
    reset: bool


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    check: str
    metric: str
    outcome: Outcome
    why: str
    method: Literal["mann-whitney", "quantile", "counter", "none"]  # none: nothing judged (absent, too few)
    statistic: str  # p99, mean, increase
    baseline: float | None  # the statistic over all the baseline's windows
    canary: float | None
    change: float | None  # canary / baseline - 1 (a latency check with a non-zero baseline)
    allowed_change: float | None
    samples: str | None  # how the test's samples were formed
    test: MannWhitney | None
    baseline_windows: tuple[WindowRecord, ...]
    canary_windows: tuple[WindowRecord, ...]


class Report(BaseModel):
    model_config = ConfigDict(frozen=True)

    mode: Mode
    outcome: Outcome
    why: str
    verdicts: tuple[Verdict, ...]


def canary_vs_baseline(checks: Sequence[LatencyCheck | CriticalCounter], canary: Sequence[Scrape],
                       baseline: Sequence[Scrape]) -> Report:
    """Judge the canary against a sibling baseline read at the same instants: reads[i] of both sides together."""
    if len(canary) != len(baseline):
        raise ValueError(f"{len(canary)} canary reads but {len(baseline)} baseline reads: the windows must be the "
                         "same")
    return _report("canary-baseline", [judge(check, baseline, canary) for check in checks])


def before_after(checks: Sequence[LatencyCheck | CriticalCounter], before: Sequence[Scrape],
                 after: Sequence[Scrape]) -> Report:
    """Judge a unit after its restart (the canary) against itself before it (the baseline). Windows never span
    the restart: each side's windows lie between its own reads."""
    return _report("before-after", [judge(check, before, after) for check in checks])


def judge(check: LatencyCheck | CriticalCounter, baseline: Sequence[Scrape], canary: Sequence[Scrape]) -> Verdict:
    """One check over each side's consecutive reads (at least two a side: one window)."""
    if len(baseline) < 2 or len(canary) < 2:
        raise ValueError("each side needs at least two reads: a window lies between two")
    if isinstance(check, CriticalCounter):
        return _critical(check, baseline, canary)
    try:
        base_windows = histogram_windows(baseline, check.metric, check.labels)
        canary_windows = histogram_windows(canary, check.metric, check.labels)
    except (Absent, ExpositionError) as exc:
        return _nothing(check, check.statistic(), f"{exc}", check.required)
    records = (_records(base_windows, check), _records(canary_windows, check))
    try:
        base, new = from_windows(base_windows), from_windows(canary_windows)
    except BucketsDiffer as exc:
        return _nothing(check, check.statistic(), f"baseline or canary: {exc}", True, records)
    if base.bounds != new.bounds:
        return _nothing(check, check.statistic(), "the baseline and the canary export different buckets: "
                        "their quantiles cannot be compared", True, records)
    verdict = compare(check, base, new, records)
    return _held_if_restarted(verdict, canary_windows)


def judge_samples(check: LatencyCheck, baseline: Sequence[float], canary: Sequence[float]) -> Verdict:
    """One latency check on raw samples (a source that timed each request), no windows."""
    return compare(check, from_samples(baseline), from_samples(canary), ((), ()))


def compare(check: LatencyCheck, base: Observed, new: Observed,
            records: tuple[tuple[WindowRecord, ...], tuple[WindowRecord, ...]]) -> Verdict:
    """The latency verdict on two sides' pooled observations (steps 1-3 of the module's doc)."""
    name = check.statistic()

    def verdict(outcome: Outcome, why: str, method: Literal["mann-whitney", "quantile", "none"],
                test: MannWhitney | None = None, values: tuple[float | None, float | None] = (None, None),
                change: float | None = None) -> Verdict:
        return Verdict(check=check.name, metric=check.metric, outcome=outcome, why=why, method=method,
                       statistic=name, baseline=values[0], canary=values[1], change=change,
                       allowed_change=check.allowed_change, samples=base.how if method != "none" else None,
                       test=test, baseline_windows=records[0], canary_windows=records[1])

    fewest = min(base.count, new.count)
    if fewest < check.min_samples:
        return verdict("inconclusive", f"too few observations: baseline {base.count:g}, canary {new.count:g}, "
                       f"{check.min_samples} needed a side (hold: never a pass)", "none")
    was, now = _statistic(check, base), _statistic(check, new)
    if was is None or now is None:  # no observation: excluded by min_samples >= 1
        raise AssertionError("a side with observations has no statistic")
    worse_by = now - was if check.better == "lower" else was - now
    beyond_allowed = worse_by > check.allowed_change * abs(was)
    change = now / was - 1 if was else None
    allowed = f"allowed {'+' if check.better == 'lower' else '-'}{check.allowed_change:.0%}"
    shown = f"{name} {was:.4g} -> {now:.4g} ({'' if change is None else f'{change:+.1%}, '}{allowed})"
    values = (was, now)
    test = mann_whitney(base.groups, new.groups) if fewest >= MIN_PER_SIDE else None
    if test is None:
        reason = (f"fewer than {MIN_PER_SIDE} observations a side" if fewest < MIN_PER_SIDE
                  else "every observation of both sides ties (one bucket): nothing to rank")
        if beyond_allowed:
            return verdict("fail", f"{shown}: worse than allowed (quantile comparison: {reason})", "quantile",
                           values=values, change=change)
        return verdict("pass", f"{shown}: within the allowed change (quantile comparison: {reason})", "quantile",
                       values=values, change=change)
    alpha = 1 - check.confidence
    canary_worse = test.z > 0 if check.better == "lower" else test.z < 0
    stated = (f"Mann-Whitney U p={test.p:.2g} at confidence {check.confidence:g}, rank-biserial "
              f"{test.rank_biserial:+.3f}")
    small = check.toward_worse(test.rank_biserial) < check.min_effect
    if beyond_allowed and canary_worse and test.p < alpha and not small:
        return verdict("fail", f"{shown}: worse than allowed, and the canary is significantly worse ({stated})",
                       "mann-whitney", test, values, change)
    if beyond_allowed and canary_worse and test.p < alpha:
        return verdict("pass", f"{shown}: worse than allowed and significantly worse, but by an effect under the "
                       f"least the check fails ({stated}, min_effect {check.min_effect:g}): a drift, not a "
                       "regression", "mann-whitney", test, values, change)
    if beyond_allowed:
        return verdict("pass", f"{shown}: worse than allowed, but the test finds no significant worsening "
                       f"({stated}): noise, as Kayenta scores it", "mann-whitney", test, values, change)
    return verdict("pass", f"{shown}: within the allowed change ({stated})", "mann-whitney", test, values, change)


def _statistic(check: LatencyCheck, side: Observed) -> float | None:
    return side.mean if check.quantile is None else side.quantile(check.quantile)


def _records(windows: Sequence[HistogramWindow], check: LatencyCheck) -> tuple[WindowRecord, ...]:
    return tuple(WindowRecord(start=w.start, end=w.end, count=w.count, value=_statistic(check, from_windows([w])),
                              reset=w.reset) for w in windows)


def _critical(check: CriticalCounter, baseline: Sequence[Scrape], canary: Sequence[Scrape]) -> Verdict:
    try:
        base_windows = counter_windows(baseline, check.metric, check.labels)
        canary_windows = counter_windows(canary, check.metric, check.labels)
    except Absent as exc:
        return _nothing(check, "increase", f"{exc}", check.required)
    records = tuple(tuple(WindowRecord(start=w.start, end=w.end, count=None, value=w.increase, reset=w.reset)
                          for w in side) for side in (base_windows, canary_windows))
    grew, was = (sum(w.increase for w in side) for side in (canary_windows, base_windows))
    outcome: Outcome = "fail" if grew > 0 else "pass"
    why = (f"{check.metric} rose by {grew:g} in the canary (baseline: {was:g}): any increase fails"
           if grew > 0 else f"{check.metric} did not rise in the canary (baseline: {was:g})")
    verdict = Verdict(check=check.name, metric=check.metric, outcome=outcome, why=why, method="counter",
                      statistic="increase", baseline=was, canary=grew, change=None, allowed_change=None,
                      samples=None, test=None, baseline_windows=records[0], canary_windows=records[1])
    return _held_if_restarted(verdict, canary_windows)


def _nothing(check: LatencyCheck | CriticalCounter, statistic: str, problem: str, required: bool,
             records: tuple[tuple[WindowRecord, ...], tuple[WindowRecord, ...]] = ((), ())) -> Verdict:
    """A check with nothing to judge: inconclusive, or a pass when its metric is absent and not required."""
    outcome: Outcome = "inconclusive" if required else "pass"
    why = problem if required else f"{problem}: not required, so not judged"
    allowed = check.allowed_change if isinstance(check, LatencyCheck) else None
    return Verdict(check=check.name, metric=check.metric, outcome=outcome, why=why, method="none",
                   statistic=statistic, baseline=None, canary=None, change=None, allowed_change=allowed,
                   samples=None, test=None, baseline_windows=records[0], canary_windows=records[1])


def _held_if_restarted(verdict: Verdict, canary_windows: Sequence[HistogramWindow | CounterWindow]) -> Verdict:
    restarted = [i for i, w in enumerate(canary_windows) if w.reset]
    if not restarted:
        return verdict
    note = (f"; the canary restarted within window {', '.join(str(i + 1) for i in restarted)} (counted from "
            "zero there)")
    outcome: Outcome = "inconclusive" if verdict.outcome == "pass" else verdict.outcome
    held = " (a crash? held)" if outcome != verdict.outcome else ""
    return verdict.model_copy(update={"outcome": outcome, "why": verdict.why + note + held})


def _report(mode: Mode, verdicts: list[Verdict]) -> Report:
    def by(outcome: Outcome) -> list[str]:
        return [v.check for v in verdicts if v.outcome == outcome]

    if failed := by("fail"):
        outcome: Outcome = "fail"
        why = f"failed: {', '.join(failed)}"
    elif held := by("inconclusive"):
        outcome, why = "inconclusive", f"inconclusive: {', '.join(held)}"
    else:
        outcome, why = "pass", f"every check passed ({len(verdicts)})"
    return Report(mode=mode, outcome=outcome, why=why, verdicts=tuple(verdicts))
