"""`deployer check`: can I deploy here now? Read-only on the target."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from deployer.cli.options import (
    accept_option,
    host_option,
    inventory_option,
    json_option,
    parallel_option,
    runs_dir_option,
)
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import builder, pin_notice


@click.command()
@click.argument("playbook", type=click.Path(dir_okay=False), required=False)
@host_option(required=True, help="A host, group or unit, a comma list, or a glob (gpu-*): one row per host.")
@parallel_option
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def check(playbook: str | None, host_name: str, parallel: int, inventory: str | None, runs_dir: str | None,
          accept_new_host_key: bool, as_json: bool) -> None:
    """Can I deploy here now? Read-only on the target: host key, auth, python, repo, lock, services, metrics,
    and each service's last time to healthy (from the runs dir) against its health budget.

    --accept-new-host-key pins an unknown key into the local known_hosts (said in a notice).

    Exits 0 when all is well, otherwise with the exit code of the first problem (over several hosts: of
    the first host, in selection order, that has one)."""
    from deployer import runlog
    from deployer.app.setting import Setting, select_hosts
    from deployer.check import check_hosts
    from deployer.config import targets
    from deployer.steps.playbook import load_playbook
    from deployer.ui.check import show_check, show_check_group
    from deployer.ui.console import make_console

    loaded, hosts = select_hosts(Setting(inventory=inventory), host_name)
    steps = load_playbook(Path(playbook)) if playbook else None
    build = builder(inventory, None, accept_new_host_key)
    for step in steps[1] if steps else []:  # a canary `via:` names a router of this inventory
        step.reach_routers(lambda: build.routers(loaded))
    group = check_hosts({name: loaded.hosts[name] for name in hosts}, steps,
                        connect=build.connector,
                        units={name: loaded.units[name] for name in targets.units_of(loaded, hosts)},
                        listeners=[pin_notice], parallel=parallel, runs_dir=runlog.runs_dir_from(runs_dir))
    if len(hosts) == 1:  # one host: its own report, as before groups existed
        (result,) = group.reports
        emit_json(result.as_json()) if as_json else show_check(make_console(), result)
    elif as_json:
        emit_json(group.as_json())
    else:
        show_check_group(make_console(), group)
    sys.exit(group.exit_code)


COMMANDS = (check,)
