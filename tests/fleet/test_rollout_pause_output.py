"""What a person reads of a rollout paused for them (plain output, no --json): a pause said once, as a notice, not
an error; hosts an inconclusive analysis holds shown `held`, then `approved`; a pause after the last batch said so;
and no line that reads as a rollback where the commit was kept."""

from __future__ import annotations

import re
import subprocess

from fixtures_repo import Project
from test_fleet import UNIT_STEPS, fleet, pd_unit, second_sshd, serving  # noqa: F401  (fixtures)
from test_rollout_pause import PAUSED, TTFT, metrics  # noqa: F401  (metrics: a fixture)
from test_rollout_steps_reached import local_fleet  # noqa: F401  (a fixture)


def table(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """host -> its state column in the fleet's table."""
    return {cells[0]: cells[2] for line in result.stdout.splitlines()
            if (cells := line.split()) and len(cells) > 2 and cells[0] in ("h1", "h2", "h3", "h4")
            and cells[1].isdigit()}


def test_an_inconclusive_hold_is_said_once_as_a_pause_with_its_hosts_held_then_approved(
        local_fleet: Project, metrics: str) -> None:  # noqa: F811
    analysis = {"analysis": {"url": metrics, "baseline": {"metrics": metrics}, "interval_s": 0.2, "windows": 2,
                             "checks": [{"kind": "histogram", "name": "p99 TTFT", "metric": TTFT,
                                         "min_samples": 5}]}}
    local_fleet.playbook(steps=["upload", {"commit": {"message": "m"}}, analysis],
                         rollout={"batches": [1, "100%"], "on_inconclusive": "pause"}, on_failure="rollback_fleet")
    first = local_fleet.deployer("apply", "fix.yaml", "--host", "all")
    assert first.returncode == PAUSED, first.stdout + first.stderr
    said = first.stdout + first.stderr
    assert "rollback:" not in said and "reverted build" not in said, said  # no rollback ran: the commit is kept
    assert "error:" not in first.stderr, first.stderr
    assert len(re.findall(r"paused before batch 2", said)) == 2, said  # the live line, and the notice with why
    assert "[fleet] paused before batch 2, until resumed or aborted" in first.stdout, first.stdout
    assert table(first) == {"h1": "held", "h2": "untouched", "h3": "untouched"}, first.stdout
    fleet_id = re.findall(r"deployer rollout resume (\S+)", first.stdout)[0]

    second = local_fleet.deployer("rollout", "resume", fleet_id)
    assert second.returncode == PAUSED, second.stdout + second.stderr
    assert "[fleet] resumed before batch 2: " in second.stdout, second.stdout
    assert "[fleet] paused after the last batch, until resumed or aborted" in second.stdout, second.stdout
    assert table(second) == {"h1": "approved", "h2": "held", "h3": "held"}, second.stdout

    last = local_fleet.deployer("rollout", "resume", fleet_id)
    assert last.returncode == 0, last.stdout + last.stderr
    assert "[fleet] resumed after the last batch: " in last.stdout and "batch 3" not in last.stdout, last.stdout
    assert table(last) == {"h1": "approved", "h2": "approved", "h3": "approved"}, last.stdout


def test_an_inconclusive_unit_held_under_a_rollback_on_failure_prints_no_rollback_step(
        pd_unit: Project, metrics: str) -> None:  # noqa: F811
    """A unit's hold keeps its commit though on_failure says rollback_fleet: nothing says a rollback left its
    analysis out (it printed `[h1] rollback:analysis skipped`, as if a rollback ran)."""
    analysis = {"analysis": {"url": metrics, "baseline": {"metrics": metrics}, "interval_s": 0.2, "windows": 2,
                             "checks": [{"kind": "histogram", "name": "p99 TTFT", "metric": TTFT,
                                         "min_samples": 5}]}}
    pd_unit.playbook(steps=[*UNIT_STEPS, analysis], rollout={"batches": [1, "100%"], "on_inconclusive": "pause"},
                     on_failure="rollback_fleet")
    serving(pd_unit)
    result = pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1,h2")
    assert result.returncode == PAUSED, result.stdout + result.stderr
    assert "rollback:" not in result.stdout and "reverted build" not in result.stdout, result.stdout
    assert table(result) == {"h1": "held", "h3": "held", "h2": "untouched"}, result.stdout
