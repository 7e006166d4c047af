"""An apply whose every file already holds its bytes at HEAD has nothing to do: it ends `unchanged`, exits 0, says
so in one line and in --json (`changed: false`), and restarts nothing unless asked (issue 34, item 1)."""

from __future__ import annotations

import json

import pytest
import yaml
from fixtures_repo import FIXED_A, Project
from fixtures_services import Stack

LOCAL = pytest.mark.parametrize("target", ["local"], indirect=True)


def test_applying_a_fix_already_applied_changes_nothing_ends_unchanged_and_exits_0(target: Project) -> None:
    first = target.applied()
    head = target.head()

    again = target.deployer("apply", "fix.yaml", "--host", "box")
    assert again.returncode == 0, again.stdout + again.stderr
    run_id = target.newest_run()
    assert run_id != first and target.head() == head and target.file("pkg/a.py") == FIXED_A
    assert f"run {run_id}: unchanged (exit 0)" in again.stdout, again.stdout
    assert (f"nothing to do: HEAD {head} already has these bytes in pkg/a.py; services not restarted "
            "(apply --restart restarts them)") in again.stdout, again.stdout
    assert "zero changes" not in again.stdout + again.stderr
    assert not [e for e in target.events(run_id) if e["type"] == "step_start"]  # not a step ran

    report = json.loads(target.deployer("apply", "fix.yaml", "--host", "box", "--json").stdout)
    assert (report["state"], report["changed"], report["exit_code"], report["status"]) == \
        ("unchanged", False, 0, "successful")
    assert report["git"] == {"before": head, "after": None}
    listed = target.deployer("runs", "list", "--state", "unchanged")
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [run_id, report["run_id"]], listed.stdout
    assert target.deployer("runs", "verify", run_id).returncode == 0


def test_a_fix_whose_bytes_are_in_the_work_tree_but_not_at_head_is_not_already_applied(target: Project) -> None:
    (target.repo / "pkg" / "a.py").write_text(FIXED_A)  # the bytes there, uncommitted: the commit is still to make
    target.playbook()
    done = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty", "--json")
    report = json.loads(done.stdout)
    assert report["state"] != "unchanged" and report["changed"] is True, report


@LOCAL
def test_an_unchanged_apply_restarts_the_services_only_when_asked_with_restart(target: Project, stack: Stack) -> None:
    stack.start_services()
    target.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42"}}, {"co_restart": {}}])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    pids = stack.pids()

    quiet = json.loads(target.deployer("apply", "fix.yaml", "--host", "box", "--json").stdout)
    assert (quiet["state"], quiet["changed"], quiet["exit_code"]) == ("unchanged", False, 0), quiet
    assert stack.pids() == pids

    restarted = target.deployer("apply", "fix.yaml", "--host", "box", "--restart")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert f"run {target.newest_run()}: unchanged (exit 0)" in restarted.stdout
    assert "services restarted" in restarted.stdout and "not restarted" not in restarted.stdout
    assert set(stack.pids()) == set(pids) and not set(stack.pids().values()) & set(pids.values())


@LOCAL
def test_a_fleet_run_counts_the_hosts_already_applied_as_unchanged(target: Project) -> None:
    # The target named twice: `other` holds the fix once `box` committed it.
    target.inventory.write_text(yaml.safe_dump({"hosts": {"box": target.host, "other": target.host}}))
    target.playbook()
    fleet = target.deployer("apply", "fix.yaml", "--host", "box,other", "--parallel", "1", "--json")
    assert fleet.returncode == 0, fleet.stdout + fleet.stderr
    hosts = json.loads(fleet.stdout)["hosts"]
    assert {name: host["state"] for name, host in hosts.items()} == {"box": "succeeded", "other": "unchanged"}
    shown = target.deployer("apply", "fix.yaml", "--host", "box,other", "--parallel", "1")
    assert shown.returncode == 0 and "unchanged: box, other (already applied)" in shown.stdout, shown.stdout


B_PATCH = "--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1,2 @@\n-VALUE = 1\n+VALUE = 2\n+OTHER = 3\n"
PATCHED_B = "VALUE = 2\nOTHER = 3\n"


def test_a_patch_already_applied_at_head_changes_nothing_and_ends_unchanged(target: Project) -> None:
    """`git apply --check` fails on files that already hold the patch; its reverse applies: nothing to do."""
    target.write("fix/b.diff", B_PATCH)
    target.playbook(patch="fix/b.diff", steps=["upload", {"diff_bounds": {"files": 1}}, {"commit": {"message": "b"}}])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    head = target.head()

    planned = json.loads(target.deployer("plan", "fix.yaml", "--host", "box", "--json").stdout)
    assert planned["already_applied"] is True, planned
    again = target.deployer("apply", "fix.yaml", "--host", "box", "--json")
    report = json.loads(again.stdout)
    assert (report["state"], report["changed"], report["exit_code"]) == ("unchanged", False, 0), report
    assert again.returncode == 0 and target.head() == head and target.file("pkg/b.py") == PATCHED_B
    assert "does not apply" not in again.stdout + again.stderr


def test_a_patch_that_neither_applies_nor_is_applied_is_still_refused_naming_the_forward_apply(
        target: Project) -> None:
    target.write("fix/b.diff", B_PATCH.replace("-VALUE = 1", "-VALUE = 9"))
    target.playbook(patch="fix/b.diff", steps=["upload"])
    refused = target.deployer("apply", "fix.yaml", "--host", "box")
    assert refused.returncode == 1 and "fix/b.diff does not apply to the target's current files" in refused.stderr


def test_a_patch_applied_by_hand_but_not_committed_is_committed_not_unchanged(target: Project) -> None:
    (target.repo / "pkg" / "b.py").write_text(PATCHED_B)
    target.write("fix/b.diff", B_PATCH)
    target.playbook(patch="fix/b.diff", steps=["upload", {"commit": {"message": "b"}}])
    head = target.head()
    done = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty", "--json")
    report = json.loads(done.stdout)
    assert (report["state"], report["changed"]) == ("succeeded", True), report
    assert target.head() != head and target.file("pkg/b.py") == PATCHED_B
