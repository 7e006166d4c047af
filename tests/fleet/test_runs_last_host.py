"""`last --host H` wherever a run id is taken (docs/reference/conventions.md): `runs show` and `runs verify` name
the newest run on H, as `rollback last --host H` does; beside an id --host is refused, never silently ignored."""

from __future__ import annotations

import json

from fixtures_repo import Project
from test_rollout_steps_reached import local_fleet  # noqa: F401  (a fixture)


def test_runs_show_and_verify_take_last_on_a_host(local_fleet: Project) -> None:  # noqa: F811
    local_fleet.write("fix.yaml", "name: fix\nfiles: [{src: fix/a.py, dest: pkg/a.py}]\n"
                                  "steps: [upload, {commit: {message: m}}]\n")
    applied = local_fleet.deployer("apply", "fix.yaml", "--host", "h1,h2", "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    fleet = json.loads(applied.stdout)
    on = {host: fleet["hosts"][host]["run_id"] for host in ("h1", "h2")}

    shown = local_fleet.deployer("runs", "show", "last", "--host", "h2", "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    [start] = [event for event in json.loads(shown.stdout) if event["type"] == "run_start"]
    assert start["run_id"] == on["h2"] and start["host"] == "h2"
    plain = local_fleet.deployer("runs", "show", "last", "--host", "h1")
    assert plain.returncode == 0 and on["h1"] in plain.stdout and on["h2"] not in plain.stdout, plain.stdout

    verified = local_fleet.deployer("runs", "verify", "last", "--host", "h1", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["run_id"] == on["h1"]
    # without --host, `last` is the fleet run
    assert json.loads(local_fleet.deployer("runs", "verify", "last", "--json").stdout)["run_id"] == fleet["fleet_id"]

    for command in ("show", "verify"):
        nowhere = local_fleet.deployer("runs", command, "last", "--host", "h3")
        assert nowhere.returncode == 2 and "no run on h3 in " in nowhere.stderr, nowhere.stderr
        beside_id = local_fleet.deployer("runs", command, on["h1"], "--host", "h2")
        assert beside_id.returncode == 2, beside_id.stderr
        assert f"--host picks the newest run on a host for `last`; {on['h1']!r} names a run already" \
            in beside_id.stderr
