"""`deployer restart`: bring services back without changing a file, as a run of its own."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from deployer.cli.options import accept_option, host_option, inventory_option, json_option, runs_dir_option
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import builder, cancel_on_signals, run_with_view

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployer.build import Build
    from deployer.config.models import Inventory, Unit
    from deployer.fleet.router import UnitRouting
    from deployer.run.engine import Engine, RunResult
    from deployer.steps.context import Context


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
    from deployer.cli.deploy import select_hosts

    build = builder(inventory, runs_dir, accept_new_host_key)
    loaded, hosts = select_hosts(host_name, None, inventory)
    checks = Path(checks_from) if checks_from else None
    if host_name in loaded.units:
        unit = loaded.units[host_name]
        members = build.restart_unit(host_name, unit, list(services), checks)
        restart_unit(members, host_name, unit, as_json, build.routers(loaded).for_unit(host_name, unit, members))
        return
    runs = [restarting(build, loaded, host, list(services), checks) for host in sorted(hosts)]
    for engine, _ in runs:
        engine.check_host()  # an unknown service is refused before anything connects, on any host
    if len(runs) == 1:
        engine, run = runs[0]
        run_with_view(engine, as_json, run)
        return
    restart_in_turn(runs, as_json)


def restarting(build: Build, loaded: Inventory, host: str, services: list[str],
               checks: Path | None) -> tuple[Engine, Callable[[], RunResult]]:
    """A host's restart, and its engine: a plain host behind a router restarts as its unit of one, out of the router
    around the restart (alone), wherever it is named (alone, or in a group)."""
    from deployer.config.units import every_unit
    from deployer.run.restart import restart as run_restart

    routed = every_unit(loaded.units, loaded.hosts).get(host)  # a host of a unit names no router of its own
    if routed is None:
        engine = build.restart(host, services, checks)
        return engine, partial(run_restart, engine, services)
    from deployer.fleet.unit import alone

    engine = build.restart_unit(host, routed, services, checks)[host]
    return engine, partial(alone, host, routed, engine, build.routers(loaded), restart=True)


def restart_in_turn(runs: list[tuple[Engine, Callable[[], RunResult]]], as_json: bool) -> None:
    """A group that is no unit: one host after another, each its own run (a host behind a router out of it around
    its own restart only, so the others serve meanwhile); the first that fails ends it, with its exit code (the
    hosts after it are left as they are)."""
    from deployer.ui.console import make_console
    from deployer.ui.live import StepView

    results = {}
    for engine, run in runs:
        view = StepView(make_console(), quiet=as_json)
        engine.listeners.append(view)
        with cancel_on_signals(engine.cancel), view:
            results[engine.host_name] = run()
        if results[engine.host_name].exit_code:
            break
    report_hosts(results, len(runs), as_json)


def restart_unit(engines: dict[str, Engine], name: str, unit: Unit, as_json: bool,
                 routing: Callable[[dict[str, Context]], UnitRouting] | None) -> None:
    """A unit's restart as one (each host its own run, lock and log); each host's report, then the exit code
    of the first host, in unit order, that failed."""
    from deployer.fleet.unit import UnitRun
    from deployer.steps.cancel import CancelToken

    run = UnitRun(name, unit, engines, "restore", routing=routing)  # out of its router around the restart
    cancel = CancelToken()
    for engine in engines.values():
        engine.cancel = cancel
    with cancel_on_signals(cancel):
        done = run.restart_only()
    report_hosts({host: done[host] for host in engines if host in done}, len(engines), as_json, unit=name)


def report_hosts(results: dict[str, RunResult], expected: int, as_json: bool, **document: str) -> None:
    """Each host's run (in the order given), then the exit code of the first that failed; one JSON document."""
    from deployer.ui.console import make_console, show_error
    from deployer.ui.report import show_result

    failed = [r for r in results.values() if r.exit_code]
    exit_code = failed[0].exit_code if failed else 0 if len(results) == expected else 1
    if as_json:
        emit_json({**document, "hosts": {h: r.document() for h, r in results.items()}, "exit_code": exit_code,
                   "error": failed[0].error if failed else None})
    else:
        console = make_console()
        for host, result in results.items():
            console.print(f"{host}:", markup=False, highlight=False)
            show_result(console, result)
        if failed and failed[0].error:
            show_error(failed[0].error)
    sys.exit(exit_code)


COMMANDS = (restart,)
