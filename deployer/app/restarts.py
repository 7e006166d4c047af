"""`restart`: bring services back without changing a file, as a run of its own (kind restart), under the host's
lock, with co_restart's proofs. A host behind a router leaves it around its restart (as its unit of one); a
group is restarted one host after another, the first that fails ending it; a unit's services restart as one, and
a group of units (a unit of pods' groups) one unit after another."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.app.outcome import HostsOutcome, RunOutcome
from deployer.app.setting import Setting, build_of, select_hosts
from deployer.app.watch import Watch, Watched, watching

if TYPE_CHECKING:
    from deployer.build import Build
    from deployer.config.models import Inventory
    from deployer.fleet.router import Routers
    from deployer.run.engine import Engine, RunResult
    from deployer.steps.context import Listener


@dataclass(frozen=True, kw_only=True)
class RestartOptions(Setting):
    """host: a host, a group (each host in turn, sorted), a unit (its services restart as one) or a group of units
    (each unit as one, in turn); services:
    those to restart (none: every service of the host, or of the unit); checks_from: a playbook whose checks
    after its commit (drain...) run too."""

    host: str
    services: tuple[str, ...] = ()
    checks_from: str | Path | None = None


def restart(options: RestartOptions, *, listener: Listener | None = None,
            watch: Watch | None = None) -> RunOutcome | HostsOutcome:
    """Restart as options say. A refusal before any host is touched (an unknown service, a config error) raises
    its DeployerError; once runs started, their outcome says how each went."""
    build = build_of(options, listener)
    loaded, hosts = select_hosts(options, options.host)
    services = list(options.services)
    checks = Path(options.checks_from) if options.checks_from else None
    if options.host in loaded.units:
        return restart_unit(build, loaded, options.host, services, checks, watch)
    members = loaded.groups.get(options.host, [])
    if members and all(member in loaded.units for member in members):
        return restart_units(build, loaded, members, services, checks, watch)
    routers = build.routers(loaded)
    # A group's hosts behind routers share one connection to each router's host; one host opens its own, as before.
    with routers.sharing() if len(hosts) > 1 else nullcontext(routers) as routers:
        runs = [restarting(build, loaded, host, services, checks, routers) for host in sorted(hosts)]
        for engine, _ in runs:
            engine.check_host()  # an unknown service is refused before anything connects, on any host
        results: dict[str, RunResult] = {}
        for engine, run in runs:  # a group that is no unit: each host its own run, the others serving meanwhile
            with watching(watch, Watched("host", [engine.host_name], engine.cancel, engine.listeners)):
                results[engine.host_name] = run()
            if results[engine.host_name].exit_code:
                break  # the hosts after it are left as they are
    if len(runs) == 1:
        return RunOutcome(results[runs[0][0].host_name])
    return HostsOutcome(results, len(runs))


def restarting(build: Build, loaded: Inventory, host: str, services: list[str],
               checks: Path | None, routers: Routers) -> tuple[Engine, Callable[[], RunResult]]:
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
    return engine, partial(alone, host, routed, engine, routers, restart=True)


def restart_units(build: Build, loaded: Inventory, units: list[str], services: list[str],
                  checks: Path | None, watch: Watch | None) -> HostsOutcome:
    """A group of units (a unit of pods per group label's value: pd.0, pd.1...): each unit restarted as one, in
    the group's order, the first that fails ending it. Host by host would restart one rank of a gang alone, which
    it cannot survive."""
    results: dict[str, RunResult] = {}
    with build.routers(loaded).sharing() as routers:  # one connection to each router's host for every unit
        for name in units:
            done = restart_unit(build, loaded, name, services, checks, watch, routers)
            results.update(done.results)
            if done.exit_code:
                break  # the units after it are left as they are
    return HostsOutcome(results, sum(len(loaded.units[name].hosts()) for name in units))


def restart_unit(build: Build, loaded: Inventory, name: str, services: list[str], checks: Path | None,
                 watch: Watch | None, routers: Routers | None = None) -> HostsOutcome:
    """A unit's restart as one, out of its router around it (each host its own run, lock and log); each host's
    result in unit order."""
    from deployer.fleet.unit import UnitRun
    from deployer.steps.cancel import CancelToken

    unit = loaded.units[name]
    engines = build.restart_unit(name, unit, services, checks)
    routing = (routers or build.routers(loaded)).for_unit(name, unit, engines)
    run = UnitRun(name, unit, engines, "restore", routing=routing)
    cancel = CancelToken()
    for engine in engines.values():
        engine.cancel = cancel
    with watching(watch, Watched("unit", list(engines), cancel, [])):
        done = run.restart_only()
    return HostsOutcome({host: done[host] for host in engines if host in done}, len(engines), unit=name)
