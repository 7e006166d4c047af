"""A fix already applied behind a router (issue 34, item 1): a plain host of the demo stack behind the demo router
(test_host_router's fixture), and a PD unit of two hosts behind it (test_rolling_router's). An apply that finds the
fix there changes nothing: it ends `unchanged` (exit 0, `changed: false`), takes no worker out of the router and
restarts nothing, unless asked with --restart (then out of the router around the restart, as `deployer restart`)."""

from __future__ import annotations

from typing import Any

import test_host_router
import test_rolling_router
from test_rolling_router import PdFleet, every_worker, listed_healthy, router_steps

hosts_fleet = test_host_router.hosts_fleet
transport = test_rolling_router.transport
pd_fleet = test_rolling_router.pd_fleet


def hosts_of(fleet: PdFleet, selection: str, *args: str) -> dict[str, Any]:
    code, report, output = fleet.apply(selection, *args)
    assert code == 0, output
    return dict(report["hosts"]) if "hosts" in report else {"": report}


def test_a_plain_host_behind_the_router_already_holding_the_fix_stays_in_it_and_is_not_restarted(
        hosts_fleet: PdFleet) -> None:
    hosts_of(hosts_fleet, "gpu-d")
    before = hosts_fleet.pids()
    [again] = hosts_of(hosts_fleet, "gpu-d").values()
    assert (again["state"], again["changed"], again["exit_code"]) == ("unchanged", False, 0), again
    assert router_steps(hosts_fleet, again["run_id"]) == []
    assert hosts_fleet.pids() == before

    [restarted] = hosts_of(hosts_fleet, "gpu-d", "--restart").values()
    assert restarted["state"] == "unchanged" and hosts_fleet.pids()["gpu-d"]["decode"] != before["gpu-d"]["decode"]
    kinds = router_steps(hosts_fleet, restarted["run_id"])
    assert kinds[:2] == ["router_remove", "router_listed"] and kinds[-2:] == ["router_add", "router_listed"], kinds
    assert listed_healthy(hosts_fleet) == every_worker(hosts_fleet)


def test_a_unit_behind_the_router_already_holding_the_fix_ends_unchanged_on_every_host_and_is_never_drained(
        pd_fleet: PdFleet) -> None:
    hosts_of(pd_fleet, "pd-1")
    before = pd_fleet.pids()
    again = hosts_of(pd_fleet, "pd-1")
    assert {h: (r["state"], r["changed"]) for h, r in again.items()} == \
        {"gpu-a": ("unchanged", False), "gpu-b": ("unchanged", False)}, again
    assert all(router_steps(pd_fleet, r["run_id"]) == [] for r in again.values())
    assert pd_fleet.pids() == before
    assert listed_healthy(pd_fleet) == every_worker(pd_fleet)
