"""`deployer restart`: bring services back without changing a file, as a run of its own."""

from __future__ import annotations

from pathlib import Path

import click

from deployer.cli.options import accept_option, host_option, inventory_option, json_option, runs_dir_option
from deployer.cli.output import failures_to_exit_codes
from deployer.cli.running import builder, run_with_view


@click.command()
@click.argument("services", nargs=-1)
@host_option(required=True, help="A host, or a unit (its services restart as one: stop in reverse, start in "
                                 "order).")
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
    from deployer.cli.deploy import select_hosts
    from deployer.errors import ConfigError
    from deployer.run.restart import restart as run_restart

    build = builder(inventory, runs_dir, accept_new_host_key)
    _, hosts = select_hosts(host_name, None, inventory)
    if len(hosts) != 1:
        raise ConfigError(f"--host {host_name} names {len(hosts)} hosts ({', '.join(hosts)}); restart works on "
                          "one host at a time")
    engine = build.restart(hosts[0], list(services), Path(checks_from) if checks_from else None)
    engine.check_host()  # an unknown service is refused before anything connects
    run_with_view(engine, as_json, lambda: run_restart(engine, list(services)))


COMMANDS = (restart,)
