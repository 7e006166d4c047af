"""`demo --fleet`'s last proof, through the router: during the rollout each unit's own storm and drain run while it
is out of the router, so its storm reaches the other unit and its drain reads a gauge nothing went through. Once
every unit is back, the playbook's own storm goes through the router once, each unit's gauge is sampled while it
runs (a peak above 0: the storm reached that unit) and must then drain as the playbook's drain says.

The gauges are the demo servers' answers, input: a reading that does not parse counts as unreadable.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from deployer.steps.cancel import CancelToken
from deployer.steps.loadgen import run_storm
from deployer.steps.metrics import DrainParams, MetricParams, parse
from deployer.steps.storm import StormParams

SAMPLE_S = 0.1  # how often the gauges are read during the storm


class UnitProof(BaseModel):
    peak: float | None  # the gauge's highest reading during the storm (None: never readable)
    after: float | None  # its last reading after it


class RouterProof(BaseModel):
    storm: dict[str, int]  # sent, completed, aborted, errors
    units: dict[str, UnitProof]
    seconds: float
    error: str | None  # None: every unit's gauge drained

    def summary(self) -> dict[str, Any]:
        return self.model_dump()

    def describe(self) -> str:
        """One line: the storm, and each unit's gauge during -> after it."""
        def num(value: float | None) -> str:
            return "?" if value is None else f"{value:g}"
        s = self.storm
        return (f"after the rollout, the playbook's storm through the router: {s['sent']} sent, {s['completed']} "
                f"completed, {s['aborted']} aborted, {s['errors']} errors; in-flight queue during -> after: "
                + ", ".join(f"{unit} {num(u.peak)} -> {num(u.after)}" for unit, u in self.units.items()))


def playbook_checks(playbook: Path) -> tuple[StormParams, DrainParams]:
    """The playbook's post-restart storm and drain: the proof repeats them through the router."""
    steps = [step for step in yaml.safe_load(playbook.read_text())["steps"] if isinstance(step, dict)]
    storm = next(step["storm"] for step in steps if "storm" in step)
    drain = next(step["drain"] for step in steps if "drain" in step)
    return StormParams.model_validate(storm), DrainParams.model_validate(drain)


def reading(url: str, metric: str) -> float | None:
    """The gauge summed over its series, from this machine (the demo's stack); None when not readable."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return None
    return parse(text, MetricParams(metric=metric)).value


def highest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def prove(router: str, metrics: dict[str, str], playbook: Path, cancel: CancelToken) -> RouterProof:
    """The playbook's storm through `router` (its /generate), then each unit's gauge (unit -> its /metrics URL)
    polled until the drain's target, bounded by its within_s."""
    storm, drain = playbook_checks(playbook)
    units = {unit: UnitProof(peak=None, after=None) for unit in metrics}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for unit, url in metrics.items():
                units[unit].peak = highest(units[unit].peak, reading(url, drain.metric))
            done.wait(SAMPLE_S)

    started = time.monotonic()
    sampler = threading.Thread(target=sample, name="demo-proof", daemon=True)
    sampler.start()
    try:
        result = run_storm(f"{router}/generate", requests=storm.requests, concurrency=storm.concurrency,
                           client_timeout_s=storm.client_timeout_s, max_duration_s=storm.max_duration_s)
    finally:
        done.set()
        sampler.join(timeout=10)
    deadline = time.monotonic() + drain.within_s
    while True:
        for unit, url in metrics.items():
            units[unit].after = reading(url, drain.metric)
        left = {unit: proof.after for unit, proof in units.items() if proof.after is None or proof.after > drain.to}
        if not left or time.monotonic() > deadline or cancel.cancelled:
            break
        cancel.wait(drain.interval_s)
    error = None if not left else "; ".join(
        f"unit {unit}: {drain.metric} {'unreadable' if value is None else f'{value:g}'} after the storm through "
        f"the router, not {drain.to:g} within {drain.within_s:g}s" for unit, value in left.items())
    counts = {"sent": result.sent, "completed": result.completed, "aborted": result.aborted, "errors": result.errors}
    return RouterProof(storm=counts, units=units, seconds=round(time.monotonic() - started, 3), error=error)
