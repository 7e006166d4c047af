"""What a rollback proves on the reverted build: the revert, not the fix.

The old build still has the bug the fix was for, so the fix's own bound (a gauge drained to 0) would fail it for
ever. After its revert commit a rollback runs the playbook's restart again (PIDs changed, health, this start's
log), its canary, and judges the fix's gauge against the run's baseline: no worse than before the fix. A check
that fails leaves the revert standing and the run rolled_back with the check named (ChecksFailed, exit 5): a
rollback again would not change the old build's behaviour. One rollback may skip checks or give the baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from deployer.errors import ConfigError, StepFailed, VerificationFailed
from deployer.runlog import Run
from deployer.steps.base import Effect, Step
from deployer.steps.optional import NOT_JUDGED, after_revert

ALL = "all"
Verdicts = dict[str, str]  # check name -> passed | failed | not judged | not run: why
DeployerFailure = StepFailed | VerificationFailed  # what a check's failure is; anything else is no verdict


@dataclass(frozen=True)
class NotRun:
    """A check a rollback does not run on the reverted build, and why: shown as not run, never as passed."""
    name: str
    why: str


@dataclass(frozen=True)
class RevertChecks:
    """The operator's say over one rollback's checks: some skipped, a baseline given."""
    skip: frozenset[str] = frozenset()  # check (step) names, or "all": every check after the restart
    baseline: Mapping[str, float] = field(default_factory=dict)  # metric -> value, over the run's recorded one

    def refuse_unknown(self, steps: Sequence[Step]) -> None:
        """A --skip-check that names no check of the playbook is a typo, not a skip."""
        checks = {s.name for s in steps if s.effect == Effect.verifies}
        unknown = sorted(self.skip - checks - {ALL})
        if unknown:
            restarts = {s.name for s in steps if s.effect == Effect.restarts} & set(unknown)
            why = f" ({', '.join(sorted(restarts))} restarts: a rollback always restarts onto the reverted build)" \
                if restarts else ""
            raise ConfigError(f"--skip-check {', '.join(unknown)}: not a check of this playbook{why}; its checks: "
                              f"{', '.join(sorted(checks)) or 'none'}")

    def choose(self, steps: Sequence[Step], recorded: Mapping[str, float]) -> list[Step | NotRun]:
        """The steps (the playbook's restarts and checks, in order) as this rollback runs them."""
        baseline = {**recorded, **self.baseline}
        chosen: list[Step | NotRun] = []
        for step in steps:
            if step.effect == Effect.verifies and (ALL in self.skip or step.name in self.skip):
                chosen.append(NotRun(step.name, "skipped for this rollback (--skip-check)"))
                continue
            after = after_revert(step, baseline)
            chosen.append(NotRun(step.name, after) if isinstance(after, str) else after)
        return chosen


def recorded_baseline(run: Run) -> dict[str, float]:
    """The metrics a run's baseline steps read before its fix: from its run_end, or (a cut run) from the last
    sample each baseline step took."""
    facts = (run.end or {}).get("facts") or {}
    if facts.get("baseline"):
        return {str(k): float(v) for k, v in facts["baseline"].items()}
    steps = {s.get("name") for s in run.start.get("steps") or [] if s.get("kind") == "baseline"}
    found: dict[str, float] = {}
    for sample in run.all("sample"):
        if sample.get("step") in steps and isinstance(sample.get("value"), int | float):
            found[str(sample.get("metric"))] = float(sample["value"])
    return found


def prove(checks: Sequence[Step | NotRun], run: Callable[[Step], object],
          not_run: Callable[[NotRun], object]) -> tuple[Verdicts, DeployerFailure | None]:
    """Run the checks in order and keep each verdict; the first that fails keeps the rest from running (a
    restart that failed leaves nothing to judge). A lost link or a stop is no verdict: it propagates."""
    verdicts: Verdicts = {}
    failure: DeployerFailure | None = None
    for check in checks:
        if isinstance(check, NotRun):
            not_run(check)
            verdicts[check.name] = f"not run: {check.why}"
        elif failure is not None:
            verdicts[check.name] = "not run: an earlier check failed"
        else:
            try:
                said = run(check)
            except (StepFailed, VerificationFailed) as exc:
                failure = exc
                verdicts[check.name] = "failed"
            else:
                judged = not (isinstance(said, str) and said.startswith(NOT_JUDGED))
                verdicts[check.name] = "passed" if judged else NOT_JUDGED
    return verdicts, failure


def failed_check(failure: DeployerFailure) -> str:
    """The check a failure came from, where a unit runs its checks outside prove() (a step's name; else the
    rollback's checks as a whole)."""
    return failure.step if isinstance(failure, StepFailed) else "rollback"


def failed_names(verdicts: Verdicts) -> list[str]:
    """The failed check, then those it kept from running."""
    return [name for name, verdict in verdicts.items() if verdict == "failed"] + \
        [name for name, verdict in verdicts.items() if verdict == "not run: an earlier check failed"]


def checks_failed_message(verdicts: Verdicts, failure: DeployerFailure, commit: str, host: str, left: str) -> str:
    """`left`: what the target has now (run/standing.py: the services down and the command that brings them back)."""
    failed = failed_names(verdicts)
    return (f"{failure}\nThe revert stands (commit {commit[:12]}); the reverted build failed its check "
            f"{failed[0]}{' (not run after it: ' + ', '.join(failed[1:]) + ')' if failed[1:] else ''}. The run "
            "ends rolled_back with that check named: a rollback again would not change the old build. "
            f"{left}\n`deployer check --host {host}` shows the services and the gauge now.")
