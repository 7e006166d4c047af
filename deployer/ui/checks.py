"""What each check of a run measured, read from its log: the figure, the build it was measured on, how it ended.

The run's facts keep one figure per metric, and a rollback runs the fix's drain again on the same run, so a
summary made from them can show the reverted build's 0 as the fix's proof. The log keeps every check apart: its
step's name (a rollback's are `rollback:<step>`), its samples, its storm, its end, and the restarts and commits
that say which build served it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployer.ui.chart import num

METRIC_CHECKS = ("baseline", "drain")
SHOWN_END = {"ok": "passed", "failed": "failed", "canceled": "canceled"}


@dataclass
class Check:
    """One check of a run, or one storm: what it measured and on which build (None: the run never reached it)."""

    step: str
    kind: str  # baseline, drain, storm
    build: str | None = None
    metric: str | None = None
    value: float | None = None  # the last real sample
    status: str | None = None  # its step_end's; None: it never ended
    loaded: bool = True  # a storm reached the services since their restart in this run
    storm: dict[str, Any] | None = None
    met: str | None = None  # a drain whose baseline already met its bound: which (its pass proves nothing)

    def line(self) -> str:
        if self.build is None:
            return f"{self.step}: not run"
        if self.storm is not None:
            name = "storm" if self.step == "storm" else f"storm of {self.step}"
            s = self.storm
            return (f"{name}: sent {s.get('sent')}, completed {s.get('completed')}, aborted {s.get('aborted')}, "
                    f"errors {s.get('errors')} on {self.build}")
        value = "? (no reading)" if self.value is None else num(self.value)
        load = "" if self.loaded or self.kind != "drain" else ", no load since its restart"
        end = SHOWN_END.get(str(self.status), "did not finish")
        said = "" if self.kind == "baseline" and end == "passed" else f": {end}"  # a baseline gates nothing
        if self.met is not None:
            said += f", proving nothing: {self.met}"
        return f"{self.step}: {self.metric} = {value} on {self.build}{load}{said}"


def checks_of(events: list[dict[str, Any]]) -> list[Check]:
    """The run's baselines, storms and drains in the order they ran, each followed by the planned drains it never
    reached once they were due: an apply's own once it changed what the target serves (its commit, its restart),
    a rollback's once it reverted. An unchanged run, a refused one or one stopped before its commit owed none."""
    start = next((e for e in events if e.get("type") == "run_start"), {})
    git = next((e for e in events if e.get("type") == "run_end"), {}).get("git") or {}
    planned = {str(s.get("name")): s for s in start.get("steps") or [] if isinstance(s, dict)}

    def metric_of(step: str) -> Any:
        return ((planned.get(step.removeprefix("rollback:")) or {}).get("params") or {}).get("metric")

    build = built("the build before the fix", git.get("before"))
    reverted: str | None = None
    loaded = True
    due = False  # the apply's drains: owed once the run committed or restarted
    found: list[Check] = []
    metric_checks: dict[str, Check] = {}
    def serving(step: str) -> str:
        """What the services run once this run's restart in `step` started them, or its recover kept them."""
        return built("the reverted build", reverted) if step.startswith("rollback:") else \
            built("the fix's build", git.get("after")) if git.get("after") else \
            built("the build at HEAD", git.get("before"))

    for event in events:
        kind, step = event.get("type"), str(event.get("step") or "")
        if kind == "rollback":
            reverted = event.get("commit")
        elif kind == "commit":
            due = True
        elif kind == "restart":  # from here the services run the code this run's restart started
            build = serving(step)
            loaded = False
            due = due or not step.startswith("rollback:")
        elif kind == "service_kept":  # a recover's: left serving the cut run's commit (or its revert), its load seen
            build = serving(step)
        elif kind == "storm":
            found.append(Check(step, "storm", build, storm=event))
            loaded = True
        elif kind == "step_start" and event.get("kind") in METRIC_CHECKS:
            metric_checks[step] = Check(step, str(event["kind"]), build, metric_of(step), loaded=loaded)
            found.append(metric_checks[step])
        elif kind == "sample" and step in metric_checks and event.get("value") is not None:
            metric_checks[step].metric, metric_checks[step].value = event.get("metric"), event["value"]
        elif kind == "baseline_met" and step in metric_checks:
            metric_checks[step].met = f"its baseline {num(event.get('baseline'))} already met {event.get('bound')}"
        elif kind == "step_end" and step in metric_checks:
            metric_checks[step].status = event.get("status")
    drains = [name for name, s in planned.items() if s.get("kind") == "drain"]
    expected = (drains if due and start.get("kind") in (None, "apply") else []) + \
        ([f"rollback:{name}" for name in drains] if reverted else [])
    missing = [Check(name, "drain", metric=metric_of(name)) for name in expected if name not in metric_checks]
    return sorted(found + missing, key=lambda check: check.step.startswith("rollback:"))  # the fix's, then the revert's


def built(what: str, commit: object) -> str:
    return f"{what} ({str(commit)[:12]})" if commit else what
