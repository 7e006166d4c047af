"""The metric charts: one bar per poll, the threshold marked; an analysis's windows, baseline above new build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from deployer.steps.metrics import Drain
    from deployer.ui.console import Lines

BARS = "▁▂▃▄▅▆▇█"
CHART_WIDTH = 60  # polls shown per series; a longer drain shows its last polls


@dataclass(frozen=True)
class Series:
    """A metric's samples from one step, and the drain that judged them (None: a baseline, a rollback's drain
    stopped before it recorded the baseline it judged against, or a drain whose params this version cannot
    read)."""
    step: str
    metric: str
    values: list[float | None]
    drain: Drain | None = None

    def met(self, value: float | None) -> bool:
        return value is not None and self.drain is not None and self.drain.holds(value)


def judged_by(step: str, params: dict[str, Any], baseline: float | None) -> Drain | None:
    """The drain a step's samples were held to, as the step itself judged them (steps.metrics): the fix's own, or
    on a rollback the reverted build's, no worse than the run's baseline before the fix."""
    from deployer.steps.metrics import Drain, DrainParams, RevertedDrain  # and the load generator: drains only

    try:
        drain = Drain(DrainParams.model_validate(params), step)
    except ValidationError:
        return None
    return drain if baseline is None else RevertedDrain(drain, baseline)


def metric_series(events: list[dict[str, Any]]) -> list[Series]:
    """The baseline and drain samples of a run, in poll order, with each drain's bound."""
    start = next((e for e in events if e.get("type") == "run_start"), {})
    bounds = {s.get("name"): s.get("params", {}) for s in start.get("steps", []) if s.get("kind") == "drain"}
    found: dict[tuple[str, str], list[float | None]] = {}
    for event in events:
        if event.get("type") == "sample" and event.get("step"):
            found.setdefault((str(event["step"]), str(event.get("metric"))), []).append(event.get("value"))
    end = next((e for e in events if e.get("type") == "run_end"), {})
    reverted = (end.get("facts") or {}).get("rollback_drain") or {}
    series = []
    for (step, metric), values in found.items():
        params = bounds.get(step.removeprefix("rollback:"))
        before = (reverted.get(metric) or {}).get("baseline") if step.startswith("rollback:") else None
        if step.startswith("rollback:") and before is None:
            params = None  # a rollback's drain stopped before it recorded its baseline: never the fix's own bound
        series.append(Series(step, metric, values, None if params is None else judged_by(step, params, before)))
    return series


def sparkline(values: list[float | None], top: float) -> str:
    return "".join("?" if v is None else BARS[0 if top <= 0 else max(0, min(len(BARS) - 1, round(v / top * 7)))]
                   for v in values)


def show_chart(console: Lines, events: list[dict[str, Any]]) -> None:
    """Each series as bars scaled to the largest sample; under a drain, ✓ marks the polls within its bound."""
    show_analyses(console, events)
    series = metric_series(events)
    if not series:
        return
    from rich.text import Text  # only a run with samples has bars to show
    top = max((v for s in series for v in s.values if v is not None), default=0.0)
    console.print(f"  samples (one bar per poll, full bar = {num(top)}):", markup=False, highlight=False)
    width = max(len(s.step) for s in series)
    bars = max(min(len(s.values), CHART_WIDTH) for s in series)
    for s in series:
        values = s.values[-CHART_WIDTH:]
        label = f"    {s.step:<{width}}  "
        line = Text(label)
        for value in values:
            style = "" if s.drain is None else "green" if s.met(value) else "red"
            line.append(sparkline([value], top), style=style if console.is_terminal else "")
        line.append(" " * (bars - len(values)))
        shown = " ".join("?" if v is None else num(v) for v in values[-8:])
        line.append(f"  {s.metric}: {'... ' if len(values) > 8 else ''}{shown}")
        console.print(line, highlight=False)
        if s.drain is not None:
            marks = "".join("✓" if s.met(v) else "·" for v in values)
            console.print(f"{' ' * len(label)}{marks}  ✓ = {s.drain.bound()}", markup=False, highlight=False)


SIDES = {"before-after": ("before", "after"), "canary-baseline": ("baseline", "canary")}


def show_analyses(console: Lines, events: list[dict[str, Any]]) -> None:
    """Each analysis's latency checks, a bar per window of each side (the check's statistic over that window
    alone, scaled to the check's largest), the baseline above the new build; a counter's verdict line says it."""
    for event in events:
        if event.get("type") != "analysis":
            continue
        sides = SIDES.get(str(event.get("mode")), ("baseline", "canary"))
        console.print(f"  {event.get('step')}: {event.get('outcome')} (one bar per window: {sides[0]}, then "
                      f"{sides[1]})", markup=False, highlight=False)
        latency = [v for v in event.get("verdicts", []) if v.get("method") != "counter" and
                   (v.get("baseline_windows") or v.get("canary_windows"))]
        width = max((len(str(v.get("check"))) for v in latency), default=0)
        for verdict in latency:
            rows = [[w.get("value") for w in verdict.get(key) or []] for key in ("baseline_windows", "canary_windows")]
            top = max((x for row in rows for x in row if x is not None), default=0.0)
            said = (str(verdict.get("check")), ""), ("", f"  {verdict.get('outcome')}")
            for side, row, (name, outcome) in zip(sides, rows, said, strict=True):
                shown = " ".join("?" if x is None else f"{x:.3g}" for x in row[-8:])
                console.print(f"    {name:<{width}}  {side:<8} {sparkline(row, top)}  {shown}{outcome}", markup=False,
                              highlight=False)


def num(value: object) -> str:
    return "?" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
