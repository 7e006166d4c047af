"""`deployer check`: can I deploy here now? Read-only on the target."""

from __future__ import annotations

import sys

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
from deployer.cli.running import pin_notice


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
    from deployer.app.checks import CheckOptions, check
    from deployer.ui.check import show_check, show_check_group
    from deployer.ui.console import make_console

    group = check(CheckOptions(host=host_name, playbook=playbook, parallel=parallel, inventory=inventory,
                               runs_dir=runs_dir, accept_new_host_key=accept_new_host_key), listener=pin_notice)
    if as_json:
        emit_json(group.document())
    elif len(group.reports) == 1:  # one host: its own report, as before groups existed
        show_check(make_console(), group.reports[0])
    else:
        show_check_group(make_console(), group)
    sys.exit(group.exit_code)


COMMANDS = (check,)
