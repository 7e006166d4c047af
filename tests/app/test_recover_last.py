"""`recover last` picks the newest cut run, not the newest run (app/recovery.py last_cut): a fleet's sub-run stands
for its fleet run, unless a host is given, when that host's own run is the one to end. Run dirs written here as a
cut run leaves them (a run_start and no run_end); no target is needed to pick one."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from deployer.app.recovery import last_cut
from deployer.runlog import EVENTS, new_run_id

START = datetime(2026, 12, 5, tzinfo=timezone.utc)


def logged(runs: Path, minute: int, *events: dict[str, object]) -> str:
    run_id = new_run_id(START + timedelta(minutes=minute))
    (runs / run_id).mkdir(parents=True)
    (runs / run_id / EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    return run_id


def test_recover_last_names_the_newest_cut_run_its_fleet_run_or_with_a_host_that_hosts_own(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fleet = new_run_id(START)
    cut = logged(runs, 1, {"type": "run_start", "host": "gpu-a", "fleet": fleet})
    logged(runs, 2, {"type": "run_start", "host": "gpu-b"}, {"type": "run_end", "status": "successful"})
    assert last_cut(runs, None) == fleet  # its hosts are recovered together, as `recover FLEET` does
    assert last_cut(runs, "gpu-a") == cut  # --host: that host's run alone, not every host of the fleet
    assert last_cut(runs, "gpu-b") is None  # nothing cut there: recover says so
    plain = logged(runs, 3, {"type": "run_start", "host": "gpu-a"})
    assert last_cut(runs, None) == plain == last_cut(runs, "gpu-a")


def test_a_recover_of_that_is_no_string_names_no_run_in_the_unended_notice(tmp_path: Path) -> None:
    from deployer.app.applies import notice_unended

    runs = tmp_path / "runs"
    cut = logged(runs, 1, {"type": "run_start", "host": "gpu-a"})
    edited = logged(runs, 2, {"type": "run_start", "host": "gpu-a", "recover_of": [cut]})  # a log edited by hand
    said: list[str] = []
    notice_unended(runs, ["gpu-a"], lambda event: said.append(str(event["message"])))
    # Before: `[cut] in {...}` raised TypeError (unhashable) in every apply and check on gpu-a.
    assert [m.split()[1] for m in said] == [cut, edited] and not any("cut recover" in m for m in said), said
