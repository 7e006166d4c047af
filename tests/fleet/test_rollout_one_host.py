"""A playbook whose rollout pauses, applied to one host: a plain run, with nothing to pause between, says that its
rollout.steps are not taken (they used to be ignored without a word), and applies; the fleet run of the same
playbook over several hosts pauses as its steps say (issue 37 item 3, as a new user's review found it)."""

from __future__ import annotations

from fixtures_repo import FIXED_A, ORIGINAL_A, Project
from test_fleet import BOUNDED
from test_rollout_resume_safety import PAUSE_AFTER_FIRST, a_py
from test_rollout_steps_reached import local_fleet

__all__ = ["local_fleet"]  # the fixture, used by name


def test_one_host_applied_with_a_pausing_rollout_says_its_steps_are_not_taken_and_applies(
        local_fleet: Project) -> None:
    local_fleet.playbook(steps=BOUNDED, rollout=PAUSE_AFTER_FIRST)
    done = local_fleet.deployer("apply", "fix.yaml", "--host", "h1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rollout.steps are not taken: h1 alone is a plain run" in done.stderr, done.stderr
    assert a_py(local_fleet, "h1") == FIXED_A and a_py(local_fleet, "h2") == ORIGINAL_A
    assert not list(local_fleet.runs.glob("*/fleet.json"))  # a plain run, no fleet run


def test_one_host_applied_with_a_rollout_that_never_pauses_says_nothing_of_it(local_fleet: Project) -> None:
    local_fleet.playbook(steps=BOUNDED, rollout={"batches": [1]})
    done = local_fleet.deployer("apply", "fix.yaml", "--host", "h1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rollout.steps" not in done.stderr, done.stderr
