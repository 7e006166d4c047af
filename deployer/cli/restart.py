"""`deployer restart`: bring services back without changing a file, as a run of its own."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import click

from deployer.cli.options import accept_option, host_option, inventory_option, json_option, runs_dir_option
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import pin_notice, show_outcome, watcher

if TYPE_CHECKING:
    from deployer.app.outcome import HostsOutcome


@click.command()
@click.argument("services", nargs=-1)
@host_option(required=True, help="A host, a group (each host in turn, sorted; the first that fails ends it), "
                                 "or a unit (its services restart as one: stop in reverse, start in order).")
@click.option("-p", "--playbook", "checks_from", type=click.Path(dir_okay=False),
              help="Also run the checks (drain...) this playbook runs after its commit.")
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def restart(services: tuple[str, ...], host_name: str, checks_from: str | None, inventory: str | None,
            runs_dir: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Restart SERVICES (default: every service of the host) with co_restart's proofs, under the host's lock.

    A run of its own (kind restart in `runs list`): its record and log, no file changed. Exits as apply does:
    3 when the lock is held, 5 when a service does not come back (the services still down are named, with the
    command that tries again)."""
    from deployer.app.outcome import HostsOutcome
    from deployer.app.restarts import RestartOptions, restart

    outcome = restart(RestartOptions(host=host_name, services=services, checks_from=checks_from, inventory=inventory,
                                     runs_dir=runs_dir, accept_new_host_key=accept_new_host_key),
                      listener=pin_notice, watch=watcher(as_json))
    if isinstance(outcome, HostsOutcome):
        report_hosts(outcome, as_json)
    show_outcome(outcome, as_json)


def report_hosts(outcome: HostsOutcome, as_json: bool) -> NoReturn:
    """Each host's run (in the order they ran), then the exit code of the first that failed; one JSON document."""
    from deployer.ui.console import make_console, show_error
    from deployer.ui.report import show_result

    if as_json:
        emit_json(outcome.document())
    else:
        console = make_console()
        for host, result in outcome.results.items():
            console.print(f"{host}:", markup=False, highlight=False)
            show_result(console, result)
        if outcome.error:
            show_error(outcome.error)
    sys.exit(outcome.exit_code)


COMMANDS = (restart,)
