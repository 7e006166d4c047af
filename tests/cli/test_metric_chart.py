"""The samples chart under a run's report: each poll marked as the drain step itself judged it (steps.metrics'
Drain and RevertedDrain), never by a comparison of the chart's own."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.steps.metrics import DrainParams
from deployer.ui.chart import show_chart
from deployer.ui.console import PlainConsole


def rollback_events(op: str, to: float, baseline: float, values: list[float]) -> list[dict[str, Any]]:
    """A rollback's run log: the fix's drain (to its bound) run on the reverted build, whose baseline was given."""
    params = DrainParams(metric="g", to=to, op=op).model_dump()  # as run_start records a step's params
    return [{"type": "run_start", "steps": [{"kind": "drain", "name": "drain", "params": params}]},
            *({"type": "sample", "step": "rollback:drain", "metric": "g", "value": v} for v in values),
            {"type": "run_end", "facts": {"rollback_drain": {"g": {"baseline": baseline, "final": values[-1]}}}}]


def chart(events: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> list[str]:
    show_chart(PlainConsole(), events)
    return capsys.readouterr().out.splitlines()


def test_a_rollback_chart_marks_polls_against_the_bound_its_drain_held_the_reverted_build_to(
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = chart(rollback_events("<=", 0, 3, [5, 3, 2]), capsys)
    assert lines[-1].split() == ["·✓✓", "✓", "=", "<=", "3", "(no", "worse", "than", "3,", "its",
                                 "baseline", "before", "the", "fix)"], lines


def test_an_equality_drain_on_a_rollback_is_marked_as_no_further_from_its_value_than_the_baseline_was(
        capsys: pytest.CaptureFixture[str]) -> None:
    # the fix wanted g == 10 and the old build read 7: 8 and 12 are no further from 10 than that, 4 is
    lines = chart(rollback_events("==", 10, 7, [4, 8, 12]), capsys)
    assert lines[-1].split()[0] == "·✓✓", lines
    assert lines[-1].endswith("✓ = within 3 of 10 (no worse than 7, its baseline before the fix)"), lines


def test_a_rollback_drain_stopped_before_its_end_is_charted_without_the_fixs_bound(
        capsys: pytest.CaptureFixture[str]) -> None:
    # A second Ctrl-C in the rollback's drain: no run_end facts, so no recorded baseline. The chart marked its
    # polls against the fix's `<= 0` while the drain held the reverted build to `<= 28`.
    events = rollback_events("<=", 0, 28, [5, 3])[:-1]
    lines = chart(events, capsys)
    assert not any("✓ =" in line for line in lines), lines
    assert any("rollback:drain" in line and "g: 5 3" in line for line in lines), lines
