"""A fix already applied on a unit's hosts (issue 34, item 1): over the real sshd, unit pd-1 (prefill on h1, decode on
h3, test_fleet's fixture).

Every host already holds it: the unit changes nothing, every host's run ends `unchanged` (exit 0, `changed: false`
in the fleet's --json) and nothing restarts unless asked with --restart.

Only some hosts hold it: the others commit, and the unit restarts as one, its already-applied hosts included. A
unit's co_restart is one restart across its hosts (decode stopped before prefill, prefill healthy before decode
starts) because the services hold state about each other (a decode's connections to its prefill's bootstrap), so
restarting only the hosts that changed would break what the unit exists to keep whole. The already-applied host
makes no commit, ends `unchanged` (`changed: false`: its files were not touched) and says its services restarted
with the unit."""

from __future__ import annotations

from typing import Any

import test_fleet
import yaml
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git
from test_fleet import UNIT_STEPS, as_json, repo, serving

fleet = test_fleet.fleet
second_sshd = test_fleet.second_sshd
pd_unit = test_fleet.pd_unit
UNIT = ("h1", "h3")


def heads(project: Project) -> dict[str, str]:
    return {h: git(repo(project, h), "rev-parse", "HEAD").strip() for h in UNIT}


def pids(project: Project, report: dict[str, Any]) -> dict[str, int]:
    """Each unit host's service pid as the run's restart left it (its run log's restart event)."""
    return {h: next(iter(next(e for e in project.events(report["hosts"][h]["run_id"])
                              if e["type"] == "restart")["pids"].values()))["new"] for h in UNIT}


def kinds(project: Project, report: dict[str, Any], host: str) -> list[str]:
    return [e["type"] for e in project.events(report["hosts"][host]["run_id"])]


def restarted_as_one(prefill: list[dict[str, Any]], decode: list[dict[str, Any]]) -> None:
    """The unit restarted as one (each host's run log): decode stopped before prefill, prefill started before decode,
    both new processes."""
    def at(events: list[dict[str, Any]], kind: str) -> str:
        return str(next(e["time"] for e in events if e["type"] == kind))
    assert at(decode, "service_stopped") <= at(prefill, "service_stopped") <= at(prefill, "service_started") \
        <= at(decode, "service_started")
    for events in (prefill, decode):
        restart = next(e for e in events if e["type"] == "restart")["pids"]
        assert all(p["new"] != p["old"] for p in restart.values()), restart


def applied(project: Project, *args: str) -> dict[str, Any]:
    result = project.deployer("apply", "fix.yaml", "--host", "pd-1", "--json", *args)
    report = as_json(result)
    assert result.returncode == 0, report
    return report


def test_a_unit_whose_every_host_holds_the_fix_ends_unchanged_everywhere_and_restarts_only_when_asked(
        pd_unit: Project) -> None:
    pd_unit.playbook(steps=UNIT_STEPS)
    serving(pd_unit)
    first = applied(pd_unit)
    at = heads(pd_unit)

    again = applied(pd_unit)
    assert {h: (r["state"], r["changed"], r["git_after"]) for h, r in again["hosts"].items()} == \
        dict.fromkeys(UNIT, ("unchanged", False, None)), again
    assert heads(pd_unit) == at
    for host in UNIT:
        assert not {"step_start", "service_stopped", "service_started"} & set(kinds(pd_unit, again, host)), host
        assert "unchanged" in kinds(pd_unit, again, host)
    shown = pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1")
    assert shown.returncode == 0 and "unchanged: h1, h3 (already applied)" in shown.stdout, shown.stdout
    assert "zero changes" not in shown.stdout + shown.stderr

    restarted = applied(pd_unit, "--restart")
    assert {h: r["state"] for h, r in restarted["hosts"].items()} == dict.fromkeys(UNIT, "unchanged")
    assert heads(pd_unit) == at
    now, then = pids(pd_unit, restarted), pids(pd_unit, first)
    assert all(now[h] != then[h] for h in UNIT), (now, then)
    prefill, decode = (pd_unit.events(restarted["hosts"][h]["run_id"]) for h in UNIT)
    assert [e["step"] for e in prefill if e["type"] == "step_end" and e["status"] == "ok"] == ["co_restart", "drain"]
    assert [e["step"] for e in decode if e["type"] == "step_end" and e["status"] == "ok"] == ["co_restart"]


def test_a_unit_where_one_host_already_holds_the_fix_commits_the_other_and_restarts_the_unit_as_one(
        pd_unit: Project) -> None:
    (repo(pd_unit, "h3") / "pkg/a.py").write_text(FIXED_A)  # h3 got the fix by hand, committed
    git(repo(pd_unit, "h3"), "commit", "-qam", "the fix, by hand")
    pd_unit.playbook(steps=UNIT_STEPS)
    serving(pd_unit)
    before = heads(pd_unit)

    report = applied(pd_unit)
    h1, h3 = report["hosts"]["h1"], report["hosts"]["h3"]
    assert (h1["state"], h1["changed"]) == ("succeeded", True) and h1["git_after"] == heads(pd_unit)["h1"] != \
        before["h1"]
    assert (h3["state"], h3["changed"], h3["git_after"]) == ("unchanged", False, None), h3
    assert heads(pd_unit)["h3"] == before["h3"]
    prefill, decode = (pd_unit.events(report["hosts"][h]["run_id"]) for h in UNIT)
    restarted_as_one(prefill, decode)
    assert not [e for e in decode if e["type"] == "commit"] and "unchanged" in [e["type"] for e in decode]
    shown = pd_unit.deployer("runs", "show", report["hosts"]["h3"]["run_id"])
    assert shown.returncode == 0 and "unchanged" in shown.stdout, shown.stdout
    assert (repo(pd_unit, "h1") / "pkg/a.py").read_text() == FIXED_A


def test_a_unit_whose_changed_host_fails_its_check_rolls_that_host_back_and_the_one_already_applied_keeps_its_head(
        pd_unit: Project) -> None:
    """on_failure: rollback after the unit's restart: the host that committed is reverted, the one that made no
    commit has nothing to revert (its HEAD stays, no revert commit) and ends failed_restored; the unit restarts
    again as one, both hosts, and the drain passes on the reverted build."""
    from fixtures_services import gauge_server

    (repo(pd_unit, "h3") / "pkg/a.py").write_text(FIXED_A)
    git(repo(pd_unit, "h3"), "commit", "-qam", "the fix, by hand")
    inventory = yaml.safe_load(pd_unit.inventory.read_text())
    for host, service in (("h1", "prefill"), ("h3", "decode")):
        spec = inventory["hosts"][host]["services"][service]
        port = int(spec["health"].rsplit(":", 1)[1].split("/")[0])
        # the fix leaves the gauge at 3 (h1 serves the unit's metrics), the reverted build drains it
        spec["start"] = gauge_server(pd_unit.root, port, repo(pd_unit, host), pd_unit.root / "www")
        spec["env"] = {"PYTHONDONTWRITEBYTECODE": "1"}
    pd_unit.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    pd_unit.playbook(steps=UNIT_STEPS, on_failure="rollback")
    serving(pd_unit)
    before = heads(pd_unit)

    result = pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1", "--json")
    report = as_json(result)
    assert result.returncode == 5, report
    h1, h3 = report["hosts"]["h1"], report["hosts"]["h3"]
    assert h1["phase"] == "rolled_back" and "Rolled back every host of the unit (h1)" in h1["error"], h1
    assert (h3["phase"], h3["git_after"]) == ("failed_restored", None), h3
    assert heads(pd_unit)["h3"] == before["h3"] and (repo(pd_unit, "h3") / "pkg/a.py").read_text() == FIXED_A
    assert git(repo(pd_unit, "h1"), "rev-parse", "HEAD^{tree}") == git(repo(pd_unit, "h1"), "rev-parse",
                                                                        f"{before['h1']}^{{tree}}")
    for host in UNIT:  # the unit restarted again as one after the revert
        ended = [(e["step"], e["status"]) for e in pd_unit.events(report["hosts"][host]["run_id"])
                 if e["type"] == "step_end"]
        assert ("rollback:co_restart", "ok") in ended, (host, ended)


def test_a_partly_applied_unit_says_its_held_host_restarts_with_it_in_plan_and_apply_and_its_rollback_restarts_it(
        pd_unit: Project) -> None:
    """The plan and the plain output say h3 (holding the fix) restarts with the unit; `deployer rollback FLEET_ID`
    reverts h1 and restarts the unit as one again, h3's decode too (a run of kind restart: nothing of h3 reverted,
    and the apply's record does not call h3 rolled back)."""
    import re

    (repo(pd_unit, "h3") / "pkg/a.py").write_text(FIXED_A)
    git(repo(pd_unit, "h3"), "commit", "-qam", "the fix, by hand")
    pd_unit.playbook(steps=UNIT_STEPS)
    serving(pd_unit)
    before = heads(pd_unit)

    planned = pd_unit.deployer("plan", "fix.yaml", "--host", "pd-1")
    assert planned.returncode == 0, planned.stderr
    assert "its services restart with unit pd-1, whose other hosts change" in planned.stdout, planned.stdout
    assert "restarting nothing" not in planned.stdout
    document = as_json(pd_unit.deployer("plan", "fix.yaml", "--host", "pd-1", "--json"))
    assert {one["host"]: one["restarts_with_unit"] for one in document["hosts"]} == {"h1": None, "h3": "pd-1"}

    shown = pd_unit.deployer("apply", "fix.yaml", "--host", "pd-1")
    assert shown.returncode == 0, shown.stderr
    assert "unchanged: h3 (already applied; restarted with its unit)" in shown.stdout, shown.stdout
    found = re.search(r"fleet run (\S+) \(apply\)", shown.stdout)
    assert found is not None, shown.stdout
    fleet_id = found.group(1)

    result = pd_unit.deployer("rollback", fleet_id, "--json")
    rolled = as_json(result)
    assert result.returncode == 0, rolled
    assert set(rolled["hosts"]) == set(UNIT) and rolled["units"] == {"pd-1": list(UNIT)}, rolled
    assert rolled["hosts"]["h1"]["phase"] == "rolled_back", rolled["hosts"]["h1"]
    assert git(repo(pd_unit, "h1"), "rev-parse", "HEAD^{tree}") == git(repo(pd_unit, "h1"), "rev-parse",
                                                                        f"{before['h1']}^{{tree}}")
    assert heads(pd_unit)["h3"] == before["h3"] and (repo(pd_unit, "h3") / "pkg/a.py").read_text() == FIXED_A
    prefill, decode = (pd_unit.events(rolled["hosts"][h]["run_id"]) for h in UNIT)
    assert next(e for e in decode if e["type"] == "run_start")["kind"] == "restart"
    assert not [e for e in decode if e["type"] in ("rollback", "commit")]
    restarted_as_one(prefill, decode)
    [original] = [f for f in as_json(pd_unit.deployer("runs", "list", "--json"))["fleets"]
                  if f["fleet_id"] == fleet_id]
    assert (original["hosts"]["h1"]["rollback_status"], original["hosts"]["h3"]["rollback_status"]) == \
        ("successful", None), original["hosts"]


def test_rollback_fleet_of_a_partly_applied_unit_restarts_its_held_host_with_it(pd_unit: Project) -> None:
    """on_failure: rollback_fleet after a later batch fails: the unit's rollback reverts h1 and restarts the unit as
    one, h3 (holding the fix, never committed) too, in a run of kind restart of the fleet; h3's HEAD stays."""
    (repo(pd_unit, "h3") / "pkg/a.py").write_text(FIXED_A)
    git(repo(pd_unit, "h3"), "commit", "-qam", "the fix, by hand")
    (repo(pd_unit, "h2") / "pkg/a.py").write_text("".join(f"# line {i}\n" for i in range(20)) + ORIGINAL_A)
    git(repo(pd_unit, "h2"), "commit", "-qam", "longer a.py")  # the fix breaks h2's diff_bounds
    pd_unit.playbook(steps=UNIT_STEPS, rollout={"batches": [1, 1, "100%"]}, on_failure="rollback_fleet")
    serving(pd_unit)
    before = heads(pd_unit)

    report = as_json(pd_unit.deployer("apply", "fix.yaml", "--host", "all", "--json"))
    assert report["exit_code"] == 1 and "diff_bounds" in report["hosts"]["h2"]["error"], report
    assert report["hosts"]["h1"]["rollback_status"] == "successful", report["hosts"]["h1"]
    assert (report["hosts"]["h3"]["state"], report["hosts"]["h3"]["rollback_status"]) == ("unchanged", None)
    assert git(repo(pd_unit, "h1"), "rev-parse", "HEAD^{tree}") == git(repo(pd_unit, "h1"), "rev-parse",
                                                                        f"{before['h1']}^{{tree}}")
    assert heads(pd_unit)["h3"] == before["h3"]
    starts = {run.name: pd_unit.events(run.name)[0] for run in pd_unit.runs.iterdir()
              if (run / "events.jsonl").is_file()}
    [held] = [run_id for run_id, start in starts.items() if start.get("host") == "h3" and start.get("kind") ==
              "restart" and start.get("fleet") == report["fleet_id"]]
    restarted_as_one(pd_unit.events(report["hosts"]["h1"]["rollback_run_id"]), pd_unit.events(held))
