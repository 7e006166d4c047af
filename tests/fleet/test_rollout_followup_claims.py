"""`deployer rollback FLEET_ID` and `deployer recover FLEET_ID` act on a fleet run only while nothing else does: beside
a resume going on they are refused at once (exit 3, naming the resume), since the resume would roll the fix out
further while they undo it and each would write its own fleet.json; a paused fleet run is not rolled back (it would
stay resumable, and a resume would ship the fix again): `rollout abort` is named instead (issue 37 item 3, as a new
user's review found it). Three `transport: local` hosts, each its own repo, the deployer CLI run as a person runs it."""

from __future__ import annotations

from fixtures_repo import FIXED_A, ORIGINAL_A, Project
from test_fleet import as_json
from test_rollout_resume_safety import a_py, fleet_json, paused_after_first, resume, resuming
from test_rollout_steps_reached import HOSTS as NAMES
from test_rollout_steps_reached import local_fleet

__all__ = ["local_fleet"]  # the fixture, used by name


def test_rollback_and_recover_of_a_fleet_run_a_resume_is_going_on_with_are_refused_and_change_nothing(
        local_fleet: Project) -> None:
    fleet_id = paused_after_first(local_fleet)
    with resuming(local_fleet, fleet_id) as first:
        before = fleet_json(local_fleet, fleet_id)
        for command in ("rollback", "recover"):
            refused = local_fleet.deployer(command, fleet_id, "--json")
            error = as_json(refused)["error"]
            assert refused.returncode == 3, (command, error)
            assert f"rollout resume (pid {first.pid}) is running on it" in error, (command, error)
        assert fleet_json(local_fleet, fleet_id) == before  # neither wrote its view of the run
        assert a_py(local_fleet, "h1") == FIXED_A  # the first batch's fix is not rolled back
    assert all(a_py(local_fleet, h) == FIXED_A for h in NAMES)
    # Once the resume has ended its claim is gone: the rollback goes on.
    undone = local_fleet.deployer("rollback", fleet_id, "--json")
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert all(a_py(local_fleet, h) == ORIGINAL_A for h in NAMES)


def test_a_paused_fleet_run_is_not_rolled_back_but_aborted_and_stays_resumable_meanwhile(
        local_fleet: Project) -> None:
    fleet_id = paused_after_first(local_fleet)
    refused = local_fleet.deployer("rollback", fleet_id)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"is paused: end it with `deployer rollout abort {fleet_id}`" in refused.stderr, refused.stderr
    assert a_py(local_fleet, "h1") == FIXED_A and fleet_json(local_fleet, fleet_id)["status"] == "paused"
    aborted = resume(local_fleet, "abort", fleet_id, "--json")
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert all(a_py(local_fleet, h) == ORIGINAL_A for h in NAMES)
    assert fleet_json(local_fleet, fleet_id)["status"] == "aborted"
