"""A rollback's verdicts on the reverted build (run/revert_checks.prove): a check that could not judge it is said as
such, never passed, and stops nothing (the end-to-end case: test_rollout_pause's abort of an inconclusive unit)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from deployer.errors import StepFailed
from deployer.run.revert_checks import NotRun, failed_names, prove
from deployer.steps.optional import NOT_JUDGED


def test_a_check_that_could_not_judge_the_reverted_build_is_not_judged_and_the_later_checks_still_run() -> None:
    said = {"restart": "pids 1 -> 2", "analysis": f"{NOT_JUDGED}: step 'analysis' is inconclusive (held, never "
            "passed): p99 TTFT: inconclusive (3 of 20 observations)", "drain": "0 -> 0"}
    ran: list[str] = []

    def run(step: Any) -> str:
        ran.append(step.name)
        return said[step.name]

    checks: list[Any] = [SimpleNamespace(name=name) for name in said]
    verdicts, failure = prove([*checks, NotRun("canary", "skipped")], run, lambda _: None)
    assert failure is None and ran == ["restart", "analysis", "drain"]
    assert verdicts == {"restart": "passed", "analysis": NOT_JUDGED, "drain": "passed",
                        "canary": "not run: skipped"}
    assert failed_names(verdicts) == []


def test_a_failed_check_after_one_not_judged_still_fails_the_rollbacks_proof() -> None:
    def run(step: Any) -> str:
        if step.name == "drain":
            raise StepFailed("drain", "kv_inflight stayed at 3")
        return f"{NOT_JUDGED}: no traffic"

    checks: list[Any] = [SimpleNamespace(name=name) for name in ("analysis", "drain", "canary")]
    verdicts, failure = prove(checks, run, lambda _: None)
    assert isinstance(failure, StepFailed) and failure.step == "drain"
    assert verdicts == {"analysis": NOT_JUDGED, "drain": "failed", "canary": "not run: an earlier check failed"}
