"""The command line: parse, load, hand over to the core, render, map failures to exit codes."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from click.shell_completion import CompletionItem

# Only click is imported up front, so `deployer --help` and shell completion stay fast; each
# command imports the core (pydantic, paramiko, rich) when it runs.
if TYPE_CHECKING:
    from deployer import runlog
    from deployer.config.models import Host, Inventory
    from deployer.fleet.runner import FleetCancel, FleetState
    from deployer.run.engine import Engine, RunResult
    from deployer.run.plan import PlanReport
    from deployer.steps.context import CancelToken, Listener
    from deployer.transport.base import Transport
    from deployer.ui import Console

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES = """Exit codes: 0 ok, 1 a step failed (target restored), 2 usage/config error, 3 lock held,
4 connection or host-key error, 5 verification failed, 6 rollback failed, 130 interrupted."""


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1))


def fail_json(exit_code: int, error: str, **extra: Any) -> None:
    """With --json, a failure is still exactly one JSON object on stdout."""
    emit_json({**extra, "exit_code": exit_code, "error": error})


def failures_to_exit_codes(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from deployer.errors import DeployerError

        as_json = bool(kwargs.get("as_json"))
        try:
            return func(*args, **kwargs)
        except DeployerError as exc:
            stop(exc.exit_code, str(exc), as_json)
        except KeyboardInterrupt:
            stop(130, "interrupted", as_json)
    return wrapper  # type: ignore[return-value]


def stop(exit_code: int, error: str, as_json: bool) -> NoReturn:
    from deployer import ui
    if as_json:
        fail_json(exit_code, error)
    ui.show_error(error)
    sys.exit(exit_code)


class DeployerGroup(click.Group):
    """Click's own usage errors (exit 2) also answer --json with one JSON object on stdout."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,  # type: ignore[override]
             **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            # prog_name fixed: `python -m deployer` completes through the same _DEPLOYER_COMPLETE.
            code = super().main(argv, prog_name or "deployer", standalone_mode=False, **extra)
        except click.ClickException as exc:
            if "--json" in argv:
                fail_json(exc.exit_code, exc.format_message())
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            if "--json" in argv:
                fail_json(130, "interrupted")
            click.echo("Aborted!", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


def run() -> NoReturn:
    """The `deployer` command: main(), then leave without the interpreter's teardown.

    Freeing every module and object one by one costs ~50 ms a run (a tenth of a short apply) and serves no
    finished command: by the time main returns, the run log is closed, the lock released, the connection
    shut and every worker joined. Only the buffered output is left to write."""
    try:
        main()
        code = 0
    except SystemExit as exc:
        if not isinstance(exc.code, int | None):
            raise
        code = exc.code or 0
    sys.stdout.flush()  # click and rich flush every write already; anything else written goes out here
    sys.stderr.flush()
    os._exit(code)


# -- completion: names read from the inventory and the runs dir, never from a target ----------------

def complete_hosts(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from deployer.config.models import find_inventory, load_inventory
    from deployer.errors import DeployerError

    try:
        inventory = load_inventory(find_inventory(ctx.params.get("inventory")))
    except DeployerError:
        return []
    names = [*inventory.hosts, *inventory.groups, *inventory.units]
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from deployer import runlog
    root = runlog.runs_dir_from(ctx.params.get("runs_dir"))
    if not root.is_dir():
        return []
    return [CompletionItem(p.name) for p in sorted(root.iterdir())
            if p.name.startswith(incomplete) and ((p / runlog.EVENTS).is_file() or (p / "fleet.json").is_file())]


def host_option(required: bool = False, help: str = "Inventory host name.") -> Callable[[F], F]:
    return click.option("--host", "host_name", required=required, help=help, shell_complete=complete_hosts)


def inventory_option(func: F) -> F:
    return click.option("-i", "--inventory", type=click.Path(dir_okay=False), is_eager=True,
                        help="Inventory file (default $DEPLOYER_INVENTORY, then ./hosts.yaml).")(func)


def runs_dir_option(func: F) -> F:
    return click.option("--runs-dir", type=click.Path(file_okay=False), is_eager=True,
                        help="Run log directory (default $DEPLOYER_RUNS_DIR, then .deployer/runs).")(func)


def accept_option(func: F) -> F:
    return click.option("--accept-new-host-key", is_flag=True,
                        help="Pin an unknown SSH host key into known_hosts (a changed key is always refused).")(func)


def json_option(help: str = "Print one machine-readable JSON object (also on failure).") -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


@click.group(cls=DeployerGroup, epilog=EXIT_CODES)
@click.version_option(package_name="deployer")
def main() -> None:
    """Ship a source patch to a serving host and prove it."""


@contextmanager
def cancel_on_signals(token: CancelToken) -> Iterator[None]:
    """First SIGINT/SIGTERM/SIGHUP: stop at the next safe point. A second one: stop now."""
    from deployer import ui
    def handler(signum: int, frame: FrameType | None) -> None:
        if token.cancelled:
            raise KeyboardInterrupt
        token.cancel(f"interrupted by {signal.Signals(signum).name}")
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            ui.show_error(f"{signal.Signals(signum).name}: stopping at the next safe point (again to force)")

    # SIGHUP too: a closed terminal or a dropped ssh session must not skip the restore.
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def pin_notice(event: dict[str, Any]) -> None:
    """Pinning a host key is an explicit choice: say so on every command, as a notice (it is no error)."""
    from deployer import ui
    if event.get("type") == "host_key_pinned":
        ui.show_notice(f"pinned a new host key for {event['entry']}: {event['key_type']} {event['fingerprint']}")
    if event.get("type") == "end_unanchored":
        ui.show_notice(str(event["message"]))


def build_engine(playbook_path: str, host_name: str, loaded: Inventory, runs_dir: str | None,
                 accept_new_host_key: bool, allow_dirty: bool = False) -> Engine:
    """The engine for one host that select_hosts named in loaded."""
    from deployer import runlog
    from deployer.config.playbook import load_playbook
    from deployer.run.engine import Engine
    from deployer.transport.factory import open_transport

    host = loaded.hosts[host_name]
    playbook, steps = load_playbook(Path(playbook_path))
    return Engine(host_name=host_name, host=host, playbook=playbook, steps=steps, listeners=[pin_notice],
                  runs_dir=runlog.runs_dir_from(runs_dir), allow_dirty=allow_dirty,
                  connect=lambda bus: open_transport(host_name, host, bus,
                                                     accept_new_host_key=accept_new_host_key))


def select_hosts(host_spec: str, limit: str | None, inventory: str | None) -> tuple[Inventory, list[str]]:
    """The inventory and the hosts --host (a host, group, unit, comma list or glob) and --limit name."""
    from deployer.config import targets
    from deployer.config.models import find_inventory, load_inventory

    loaded = load_inventory(find_inventory(inventory))
    return loaded, targets.resolve(loaded, host_spec, limit=limit)


def fleet_engines(playbook_path: str, loaded: Inventory, hosts: list[str], runs_dir: str | None,
                  accept_new_host_key: bool, allow_dirty: bool) -> dict[str, Engine]:
    """One engine per host, sharing the playbook (loaded once) and nothing else."""
    from deployer import runlog
    from deployer.config.playbook import load_playbook
    from deployer.run.engine import Engine
    from deployer.transport.factory import open_transport

    playbook, steps = load_playbook(Path(playbook_path))

    def connector(name: str) -> Callable[[Any], Transport]:
        host = loaded.hosts[name]
        return lambda bus: open_transport(name, host, bus, accept_new_host_key=accept_new_host_key)

    return {name: Engine(host_name=name, host=loaded.hosts[name], playbook=playbook, steps=steps,
                         listeners=[pin_notice], runs_dir=runlog.runs_dir_from(runs_dir), allow_dirty=allow_dirty,
                         connect=connector(name)) for name in hosts}


def show_plan(report: PlanReport, as_json: bool) -> None:
    """The plan; exit 1 when the projected change breaks the playbook's bounds or does not compile here, so a CI
    job can gate on it."""
    from deployer import ui
    failed = "; ".join(report.failed_here) or None
    if as_json:
        emit_json({**ui.plan_json(report), "exit_code": 1 if failed else 0, "error": failed})
    else:
        ui.show_plan(ui.make_console(), report)
    if failed:
        sys.exit(1)


def run_with_view(engine: Engine, as_json: bool, run: Callable[[], RunResult]) -> None:
    """Run with the live step view and signal handling, then report and exit with the run's code."""
    from deployer import ui
    console = ui.make_console()
    view = ui.StepView(console, quiet=as_json)
    engine.listeners.append(view)
    with cancel_on_signals(engine.cancel), view:
        result = run()
    report(console, result, as_json)


def apply_one(engine: Engine, accept_new_host_key: bool, as_json: bool) -> None:
    """A single-host apply whose connection opens while the rest of the run sets up (checked config first)."""
    from deployer.transport.factory import Opening

    engine.check_host()  # a config problem stops the run before anything connects
    opening = Opening(engine.host_name, engine.host, accept_new_host_key=accept_new_host_key)
    engine.connect = opening
    try:
        run_with_view(engine, as_json, engine.apply)
    finally:
        opening.discard()


def notice_unended(runs_dir: Path, hosts: list[str]) -> None:
    """A killed run of this machine on these hosts is named before the next apply there (it left no trace on
    the target to stop it)."""
    from deployer import ui
    from deployer.run.unended import unended_runs

    for host in hosts:
        for run_id in unended_runs(runs_dir, host):
            ui.show_notice(f"run {run_id} on {host} never ended (killed?): its log has no run_end, so "
                           f"`runs verify` fails until it is ended with: deployer recover {run_id}")


def report(console: Console, result: RunResult, as_json: bool) -> None:
    from deployer import ui
    if as_json:
        emit_json(ui.result_json(result))
    else:
        ui.show_result(console, result)
        if result.error:
            ui.show_error(result.error)
        if result.warning:
            ui.show_warning(result.warning)
    sys.exit(result.exit_code)


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False), required=False)
@host_option()
@click.option("--rollback", "rollback_of", metavar="RUN_ID", help="Preview the rollback of a run instead.",
              shell_complete=complete_runs)
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def plan(playbook: str | None, host_name: str | None, rollback_of: str | None, inventory: str | None,
         runs_dir: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Dry run: diffs, the projected diff --stat and the exact commands (every host of a group); changes nothing.

    Exits 1 when the projected change breaks the playbook's diff_bounds."""
    from deployer import runlog
    from deployer.config import targets
    from deployer.errors import ConfigError
    from deployer.fleet.runner import for_units
    from deployer.run import rollback as rollbacks

    if rollback_of:
        run = runlog.read_run(runlog.runs_dir_from(runs_dir), rollback_of)
        engine = engine_for_run(run, host_name, inventory, runs_dir, accept_new_host_key)
        show_plan(rollbacks.plan(engine, run), as_json)
        return
    if not playbook or not host_name:
        raise ConfigError("plan needs PLAYBOOK and --host (or --rollback RUN_ID)")
    loaded, hosts = select_hosts(host_name, None, inventory)
    if len(hosts) == 1:
        show_plan(build_engine(playbook, hosts[0], loaded, runs_dir, accept_new_host_key).plan(), as_json)
        return
    engines = fleet_engines(playbook, loaded, hosts, runs_dir, accept_new_host_key, allow_dirty=False)
    for_units(engines, {name: loaded.units[name] for name in targets.whole_units(loaded, hosts)})
    show_plans([engine.plan() for engine in engines.values()], as_json)


def limit_option(func: F) -> F:
    return click.option("--limit", help="Narrow --host to the hosts this also names (same forms).",
                        shell_complete=complete_hosts)(func)


def parallel_option(func: F) -> F:
    return click.option("--parallel", type=click.IntRange(1, 1024), default=16, show_default=True,
                        help="Hosts worked on at once in a fleet run.")(func)


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@host_option(required=True, help="A host, group or unit, a comma list, or a glob (gpu-*); several hosts make "
                                 "a fleet run.")
@limit_option
@parallel_option
@inventory_option
@runs_dir_option
@accept_option
@click.option("--allow-dirty", is_flag=True, help="Ship even over uncommitted changes in the target files.")
@click.option("--dry-run", is_flag=True, help="Same as `deployer plan`.")
@json_option()
@failures_to_exit_codes
def apply(playbook: str, host_name: str, limit: str | None, parallel: int, inventory: str | None,
          runs_dir: str | None, accept_new_host_key: bool, allow_dirty: bool, dry_run: bool, as_json: bool) -> None:
    """Run the chain: compile, upload, compile there, bound, commit, restart, verify."""
    from deployer import runlog
    from deployer.config import targets
    loaded, hosts = select_hosts(host_name, limit, inventory)
    units = {name: loaded.units[name] for name in targets.whole_units(loaded, hosts)}
    if not dry_run:
        notice_unended(runlog.runs_dir_from(runs_dir), hosts)
    if len(hosts) == 1:  # one host: a plain run, as before fleets existed
        engine = build_engine(playbook, hosts[0], loaded, runs_dir, accept_new_host_key, allow_dirty)
        if dry_run:
            show_plan(engine.plan(), as_json)
        else:
            apply_one(engine, accept_new_host_key, as_json)
        return
    from deployer.config.playbook import parse_playbook
    from deployer.fleet.runner import FleetApply, for_units

    engines = fleet_engines(playbook, loaded, hosts, runs_dir, accept_new_host_key, allow_dirty)
    if dry_run:
        for_units(engines, units)
        show_plans([engine.plan() for engine in engines.values()], as_json)
        return
    model = parse_playbook(Path(playbook))[0]
    fleet = FleetApply(engines, runlog.runs_dir_from(runs_dir), model.rollout, model.on_failure, parallel,
                       units=units)
    run_fleet(hosts, fleet.cancel, as_json, fleet.listeners, fleet.run)


def show_plans(reports: list[PlanReport], as_json: bool) -> None:
    """Every host's plan; exit 1 when any host's projected change breaks the bounds or does not compile."""
    from deployer import ui
    failed = [f"{r.host_name}: {problem}" for r in reports for problem in r.failed_here]
    if as_json:
        emit_json({"hosts": [ui.plan_json(r) for r in reports], "exit_code": 1 if failed else 0,
                   "error": "; ".join(failed) or None})
    else:
        console = ui.make_console()
        for report in reports:
            ui.show_plan(console, report)
    if failed:
        sys.exit(1)


def run_fleet(hosts: list[str], cancel: FleetCancel, as_json: bool, listeners: list[Listener],
              run: Callable[[], FleetState]) -> None:
    """A fleet run with its live view and signal handling; then the per-host table, and its exit code."""
    from deployer import ui
    console = ui.make_console()
    view = ui.FleetView(console, hosts, quiet=as_json)
    listeners.append(view)
    with cancel_on_signals(cancel), view:
        state = run()
    if as_json:
        emit_json(ui.fleet_json(state))
    else:
        ui.show_fleet(console, state)
        if state.error:
            ui.show_error(state.error)
    sys.exit(state.exit_code or 0)


@main.group()
def runs() -> None:
    """Inspect run logs."""


@runs.command("list")
@runs_dir_option
@json_option()
@failures_to_exit_codes
def runs_list(runs_dir: str | None, as_json: bool) -> None:
    """List recorded runs, oldest first."""
    from deployer import runlog, ui
    from deployer.fleet.runner import list_fleets
    from deployer.run.shown import shown_state

    root = runlog.runs_dir_from(runs_dir)
    found, fleets = runlog.list_runs(root), list_fleets(root)
    if as_json:
        emit_json({"runs": [{"run_id": r.run_id, "state": shown_state(r), "status": r.status,
                             "host": r.start.get("host"), "kind": r.start.get("kind", "apply"),
                             "playbook": r.start.get("playbook_name"), "fleet": r.start.get("fleet"),
                             "git": r.git} for r in found],
                   "fleets": [ui.fleet_json(f) for f in fleets]})
    else:
        console = ui.make_console()
        ui.show_runs(console, found)
        if fleets:
            console.print()
            ui.show_fleets(console, fleets)


@runs.command("show")
@click.argument("run_id", shell_complete=complete_runs)
@runs_dir_option
@json_option("Print the raw events.")
@failures_to_exit_codes
def runs_show(run_id: str, runs_dir: str | None, as_json: bool) -> None:
    """Show one run: steps, outcome, commits, links, and its metric samples as a chart (a fleet run: its hosts)."""
    from deployer import runlog, ui
    from deployer.fleet.runner import FleetRecord, is_fleet

    root = runlog.runs_dir_from(runs_dir)
    if is_fleet(root, run_id):
        state = FleetRecord.load(root, run_id).state
        emit_json(ui.fleet_json(state)) if as_json else ui.show_fleet(ui.make_console(), state)
        return
    run = runlog.read_run(root, run_id)
    if as_json:
        emit_json(run.events)
    else:
        ui.show_run(ui.make_console(), run)


@runs.command("verify")
@click.argument("run_id", shell_complete=complete_runs)
@runs_dir_option
@click.option("--target", "on_target", is_flag=True,
              help="Also compare the log with the run's commits on its host (Deployer-Log trailers).")
@inventory_option
@json_option()
@failures_to_exit_codes
def runs_verify(run_id: str, runs_dir: str | None, on_target: bool, inventory: str | None, as_json: bool) -> None:
    """Check the run log's hash chain and its artifacts (every sub-run of a fleet run); exit 5 when altered."""
    from deployer import runlog, ui
    from deployer.fleet.runner import is_fleet, verify_fleet

    root = runlog.runs_dir_from(runs_dir)

    def verify_one(runs_path: Path, one: str) -> list[str]:
        found = runlog.verify(runs_path, one)
        if on_target:
            from deployer.run import rollback as rollbacks
            run = runlog.read_run(runs_path, one)
            found += rollbacks.verify_on_target(engine_for_run(run, None, inventory, runs_dir, False), run)
        return found

    unreachable: dict[str, str] = {}
    if is_fleet(root, run_id):
        per_host, unreachable = verify_fleet(root, run_id, verify_one)
        problems = [f"{host}: {problem}" for host, found in per_host.items() for problem in found]
    else:
        problems = verify_one(root, run_id)
    # A tampered log (5) outweighs a host whose history could not be read (4, as for a single run).
    exit_code = 5 if problems else 4 if unreachable else 0
    errors = problems + [f"{host}: not verified against the target: {why}" for host, why in unreachable.items()]
    if as_json:
        emit_json({"run_id": run_id, "problems": problems, "unreachable": unreachable, "exit_code": exit_code,
                   "error": "; ".join(errors) or None})
    if exit_code:
        if not as_json:
            for problem in errors:
                ui.show_error(problem)
        sys.exit(exit_code)
    if not as_json:
        ui.say(f"run {run_id}: log verifies")


def engine_for_run(run: runlog.Run, host_override: str | None, inventory: str | None, runs_dir: str | None,
                   accept_new_host_key: bool) -> Engine:
    """An engine on the run's host, with the run's own copy of its playbook."""
    from deployer import runlog
    from deployer.config.models import find_inventory, get_host, load_inventory
    from deployer.config.playbook import parse_playbook
    from deployer.run.engine import Engine
    from deployer.steps.context import LoadedPlaybook
    from deployer.transport.factory import open_transport

    host_name = host_override or recorded_host(run)
    inventory_path = find_inventory(inventory)
    host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    copy = run.dir / "playbook.yaml"
    model, steps, _ = parse_playbook(copy)
    loaded = LoadedPlaybook(path=copy, raw=copy.read_bytes(), model=model, sources={}, patch=None)
    return Engine(host_name=host_name, host=host, playbook=loaded, steps=steps, listeners=[pin_notice],
                  runs_dir=runlog.runs_dir_from(runs_dir),
                  connect=lambda bus: open_transport(host_name, host, bus, accept_new_host_key=accept_new_host_key))


@main.command()
@click.argument("run_id", required=False, shell_complete=complete_runs)
@host_option(help="Host (default: the run's host; required with --list); for a fleet run, the hosts to roll "
                  "back (default: every host that committed).")
@click.option("--list", "list_only", is_flag=True, help="List the deployer commits on the host (from its git log).")
@click.option("--force", is_flag=True, help="Roll back even if the run's files changed since.")
@parallel_option
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def rollback(run_id: str | None, host_name: str | None, list_only: bool, force: bool, parallel: int,
             inventory: str | None, runs_dir: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Revert RUN_ID's files to before the run by a new commit, restart, verify again.

    RUN_ID may be a fleet run: each of its hosts that committed is rolled back."""
    from deployer import runlog
    from deployer.config import targets
    from deployer.config.models import find_inventory, load_inventory
    from deployer.errors import ConfigError
    from deployer.fleet.runner import FleetCancel, FleetRecord, is_fleet, rollback_fleet
    from deployer.run import rollback as rollbacks

    if list_only:
        if not host_name:
            raise ConfigError("--list needs --host")
        list_host_deploys(host_name, inventory, accept_new_host_key, as_json)
        return
    if not run_id:
        raise ConfigError("give a RUN_ID (see 'deployer runs list' or 'deployer rollback --host H --list')")
    root = runlog.runs_dir_from(runs_dir)
    if is_fleet(root, run_id):
        fleet_id = run_id
        loaded = load_inventory(find_inventory(inventory))
        chosen = targets.resolve(loaded, host_name) if host_name else None
        hosts = chosen or list(FleetRecord.load(root, fleet_id).state.hosts)
        cancel = FleetCancel()
        listeners: list[Listener] = [pin_notice]
        run_fleet(hosts, cancel, as_json, listeners, lambda: rollback_fleet(
            root, fleet_id, sub_run_engine(root, inventory, runs_dir, accept_new_host_key), hosts=chosen,
            force=force, parallel=parallel, listeners=listeners, cancel=cancel, units=dict(loaded.units)))
        return
    run = runlog.read_run(root, run_id)
    engine = engine_for_run(run, host_name, inventory, runs_dir, accept_new_host_key)
    run_with_view(engine, as_json, lambda: rollbacks.rollback(engine, run, force=force))


def sub_run_engine(root: Path, inventory: str | None, runs_dir: str | None,
                   accept_new_host_key: bool) -> Callable[[str, str], Engine]:
    """For a fleet's follow-up: the engine of one sub-run, on its host, with its own playbook copy."""
    from deployer import runlog
    def make(host: str, run_id: str) -> Engine:
        return engine_for_run(runlog.read_run(root, run_id), host, inventory, runs_dir, accept_new_host_key)
    return make


def open_host(host_name: str, inventory: str | None, accept_new_host_key: bool) -> tuple[Host, Transport]:
    """A connection to an inventory host outside any run (listing, lock inspection)."""
    from deployer.command import Masker
    from deployer.config.models import find_inventory, get_host, load_inventory
    from deployer.steps.context import EventBus
    from deployer.transport.factory import open_transport

    inventory_path = find_inventory(inventory)
    host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    bus = EventBus(Masker(host.secrets()), host_name)
    bus.listeners.append(pin_notice)
    return host, open_transport(host_name, host, bus, accept_new_host_key=accept_new_host_key)


def list_host_deploys(host_name: str, inventory: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    from deployer import ui
    from deployer.run import rollback as rollbacks
    host, transport = open_host(host_name, inventory, accept_new_host_key)
    with transport:
        deploys = rollbacks.list_deploys(transport, host.repo)
    if as_json:
        emit_json({"host": host_name, "deploys": [vars(d) for d in deploys], "exit_code": 0, "error": None})
    else:
        ui.show_deploys(ui.make_console(), deploys)


@main.group()
def lock() -> None:
    """Inspect or break the deploy lock on a host."""


@lock.command("status")
@host_option(required=True)
@inventory_option
@accept_option
@json_option()
@failures_to_exit_codes
def lock_status(host_name: str, inventory: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Who holds the deploy lock, since when, and whether it is stale. Exit 3 when held."""
    from deployer import ui
    from deployer.run import gitops
    from deployer.run import lock as locks
    host, transport = open_host(host_name, inventory, accept_new_host_key)
    with transport:
        git_dir = gitops.git_dir(transport, host.repo)
        state = locks.read_state(transport, git_dir, host.lock_ttl_s, host_name)
        strays = locks.strays(transport, git_dir)
    if as_json:
        emit_json({"host": host_name, "locked": state is not None, "exit_code": 0 if state is None else 3,
                   "holder": None if state is None else {**state.info, "stale": state.stale,
                                                         "heartbeat_age_s": state.heartbeat_age_s}})
    else:
        ui.say(f"{host_name}: " + ("unlocked" if state is None else f"locked, {state.describe()}"))
        for stray in strays:
            ui.say(f"{host_name}: {stray} is left from a run cut while taking or releasing the lock; "
                       "the next run that takes the lock removes it")
    if state is not None:
        sys.exit(3)


@lock.command("release")
@host_option(required=True)
@click.option("--force", is_flag=True, required=True, help="Required: you are breaking someone's lock.")
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def lock_release(host_name: str, force: bool, inventory: str | None, runs_dir: str | None,
                 accept_new_host_key: bool, as_json: bool) -> None:
    """Remove a held (normally stale) lock; the removal is recorded as a run of its own."""
    from deployer import runlog, ui
    from deployer.run import gitops
    from deployer.run import lock as locks
    from deployer.run.engine import operator_id

    host, transport = open_host(host_name, inventory, accept_new_host_key)
    with transport:
        git_dir = gitops.git_dir(transport, host.repo)
        state = locks.read_state(transport, git_dir, host.lock_ttl_s, host_name)
        if state is None:
            emit_json({"host": host_name, "released": None}) if as_json else ui.say(f"{host_name}: not locked")
            return
        if not state.stale:
            ui.show_error(f"the lock was NOT stale: {state.describe()}; that run may still be going")
        locks.force_release(transport, git_dir)
    run_id = runlog.record_run(runlog.runs_dir_from(runs_dir), host_name, "lock_release", operator_id(), [
        {"type": "lock_force_released", "holder": state.info, "heartbeat_age_s": state.heartbeat_age_s,
         "stale": state.stale}])
    if as_json:
        emit_json({"host": host_name, "released": state.info, "run_id": run_id})
    else:
        ui.say(f"{host_name}: removed the lock of run {state.info.get('run_id')} (recorded as run {run_id})")


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False),
              help="Where to create the scratch repo (default: a temp dir); with --stop, the demo to stop.")
@click.option("--fleet", is_flag=True, help="Two prefill/decode units over four local hosts, as one fleet run.")
@click.option("--keep", is_flag=True, help="Leave the demo stack running and print its URLs.")
@click.option("--stop", "stop_kept", is_flag=True, help="Stop the stack a `deployer demo --keep` left running.")
@json_option()
@failures_to_exit_codes
def demo(workdir: str | None, fleet: bool, keep: bool, stop_kept: bool, as_json: bool) -> None:
    """The embedded demo: a buggy serving stack on this machine, hotfixed and proven in one run."""
    from deployer import ui
    from deployer.demo.run import run_demo, stop_kept_stacks
    from deployer.steps.context import CancelToken

    if stop_kept:
        chosen = Path(workdir) if workdir else None
        stopped = stop_kept_stacks(chosen)
        if as_json:
            emit_json({"stopped": {str(w): pids for w, pids in stopped.items()}, "exit_code": 0, "error": None})
        else:
            ui.show_stopped(ui.make_console(), stopped, chosen)
        return
    if fleet:
        fleet_demo(Path(workdir) if workdir else None, keep, as_json)
        return
    console = ui.make_console()
    view = ui.StepView(console, quiet=as_json)
    token = CancelToken()
    if not as_json:
        console.print("deployer demo: starting a buggy prefill/decode/router stack on 127.0.0.1 ...")
    with cancel_on_signals(token), view:
        outcome = run_demo(Path(workdir) if workdir else None, keep=keep, listeners=[view], cancel=token)
    if as_json:
        emit_json({**ui.result_json(outcome.result), "workdir": str(outcome.stack.workdir)})
    else:
        ui.show_demo(console, outcome)
        if outcome.result.error:
            ui.show_error(outcome.result.error)
    sys.exit(outcome.result.exit_code)


def fleet_demo(workdir: Path | None, keep: bool, as_json: bool) -> None:
    """`deployer demo --fleet`: the fleet run's live view and per-host table, then each unit's gauge."""
    from deployer import ui
    from deployer.demo.run import fleet_hosts, run_fleet_demo
    from deployer.fleet.runner import FleetCancel

    console = ui.make_console()
    view = ui.FleetView(console, fleet_hosts(), quiet=as_json)
    cancel = FleetCancel()
    if not as_json:
        console.print("deployer demo --fleet: starting two buggy prefill/decode units over four local hosts ...")
    with cancel_on_signals(cancel), view:
        outcome = run_fleet_demo(workdir, keep=keep, listeners=[view], cancel=cancel)
    state = outcome.state
    if as_json:
        emit_json({**ui.fleet_json(state), "gauges": outcome.gauges(), "workdir": str(outcome.workdir)})
    else:
        ui.show_fleet(console, state)
        ui.show_fleet_demo(console, outcome)
        if state.error:
            ui.show_error(state.error)
    sys.exit(state.exit_code or 0)


@main.command()
@click.option("--from", "source", required=True, type=click.Path(file_okay=False),
              help="The local git checkout holding the fix.")
@click.option("--base", default="HEAD", show_default=True,
              help="Ship the changes against this ref (HEAD: the uncommitted work), or a range A..B.")
@host_option(help="Add the steps this inventory host supports (co_restart of its services; drain with --metric).")
@click.option("--metric", help="The gauge that shows the symptom: adds baseline and drain steps (to 0).")
@click.option("--patch", "as_patch", is_flag=True, help="Write one patch file instead of copies of the files.")
@click.option("-o", "--output", default="fix.yaml", show_default=True, type=click.Path(dir_okay=False),
              help="The playbook to write (its files go beside it).")
@click.option("--message", help="The commit message (default: the local commit's subject).")
@inventory_option
@json_option()
@failures_to_exit_codes
def init(source: str, base: str, host_name: str | None, metric: str | None, as_patch: bool, output: str,
         message: str | None, inventory: str | None, as_json: bool) -> None:
    """Write a playbook from a local change: dests, diff bounds and message measured, not typed."""
    from deployer import ui
    from deployer.config.models import find_inventory, get_host, load_inventory
    from deployer.scaffold import write_playbook

    host = None
    if host_name:
        inventory_path = find_inventory(inventory)
        host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    made = write_playbook(Path(source), base=base, output=Path(output), as_patch=as_patch, message=message,
                          host=host, metric=metric, host_name=host_name)
    if as_json:
        emit_json({"playbook": str(made.playbook), "written": [str(p) for p in made.written],
                   "files": [vars(f) for f in made.files], "message": made.message, "exit_code": 0, "error": None})
        return
    ui.say(f"wrote {made.playbook}: {len(made.files)} file(s), "
               f"+{sum(f.insertions for f in made.files)} -{sum(f.deletions for f in made.files)}")
    for f in made.files:
        ui.say(f"  {f.dest}  +{f.insertions} -{f.deletions}{'  (new file)' if f.new else ''}")
    for note in made.notes:
        ui.say(f"note: {note}")
    ui.say(f"next: {made.next_step(made.playbook)}")


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False), required=False)
@host_option(required=True, help="A host, group or unit, a comma list, or a glob (gpu-*): one row per host.")
@parallel_option
@inventory_option
@accept_option
@json_option()
@failures_to_exit_codes
def check(playbook: str | None, host_name: str, parallel: int, inventory: str | None, accept_new_host_key: bool,
          as_json: bool) -> None:
    """Can I deploy here now? Read-only on the target: host key, auth, python, repo, lock, services, metrics.

    --accept-new-host-key pins an unknown key into the local known_hosts (said in a notice).

    Exits 0 when all is well, otherwise with the exit code of the first problem (over several hosts: of
    the first host, in selection order, that has one)."""
    from deployer import ui
    from deployer.check import check_hosts
    from deployer.config import targets
    from deployer.config.playbook import load_playbook
    from deployer.transport.factory import open_transport

    loaded, hosts = select_hosts(host_name, None, inventory)
    steps = load_playbook(Path(playbook)) if playbook else None

    def connector(name: str, host: Host) -> Callable[[Any], Transport]:
        return lambda bus: open_transport(name, host, bus, accept_new_host_key=accept_new_host_key)

    group = check_hosts({name: loaded.hosts[name] for name in hosts}, steps, connect=connector,
                        units={name: loaded.units[name] for name in targets.units_of(loaded, hosts)},
                        listeners=[pin_notice], parallel=parallel)
    if len(hosts) == 1:  # one host: its own report, as before groups existed
        (result,) = group.reports
        emit_json(result.as_json()) if as_json else ui.show_check(ui.make_console(), result)
    elif as_json:
        emit_json(group.as_json())
    else:
        ui.show_check_group(ui.make_console(), group)
    sys.exit(group.exit_code)


@main.command()
@click.argument("kind", type=click.Choice(["playbook", "inventory"]))
@json_option("Accepted for symmetry: the schema is JSON already.")
@failures_to_exit_codes
def schema(kind: str, as_json: bool) -> None:
    """Print the JSON Schema of a playbook or an inventory (for editors: see the README)."""
    from deployer.config.schema import schema_for

    emit_json(schema_for(kind))


@main.command()
@click.argument("run_id", required=False, shell_complete=complete_runs)
@host_option(help="Host (default: the run's host); alone, recovers the run its intent record names.")
@click.option("--rollback", "roll_back", is_flag=True, help="If the run's commit exists, revert it, restart, verify.")
@parallel_option
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def recover(run_id: str | None, host_name: str | None, roll_back: bool, parallel: int, inventory: str | None,
            runs_dir: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """End a cut run (killed, disconnected, disk full) in a consistent state; safe to run twice.

    RUN_ID may be a fleet run: each of its sub-runs that was cut is recovered."""
    from deployer import runlog, ui
    from deployer.errors import ConfigError
    from deployer.fleet.runner import FleetCancel, FleetRecord, cut_sub_runs, is_fleet, recover_fleet
    from deployer.run import recover as recovery

    if not run_id and not host_name:
        raise ConfigError("give a RUN_ID, or --host H to recover the run its intent record names")
    runs_path = runlog.runs_dir_from(runs_dir)
    if run_id and is_fleet(runs_path, run_id):
        fleet_id = run_id
        if not cut_sub_runs(runs_path, fleet_id):  # as a single run with nothing left says: exit 0
            nothing_to_recover(f"fleet run {fleet_id}: nothing to recover (every host's record and log ended)",
                               as_json, fleet_id=fleet_id)
            return
        cancel = FleetCancel()
        listeners: list[Listener] = [pin_notice]
        run_fleet(list(FleetRecord.load(runs_path, fleet_id).state.hosts), cancel, as_json, listeners,
                  lambda: recover_fleet(runs_path, fleet_id, sub_run_engine(runs_path, inventory, runs_dir,
                                                                            accept_new_host_key),
                                        rollback=roll_back, parallel=parallel, listeners=listeners, cancel=cancel))
        return
    if run_id and (runs_path / run_id / runlog.EVENTS).is_file():
        run = runlog.read_run(runs_path, run_id)
        # Killed before it kept its playbook's copy, the run had not reached the target's lock yet.
        engine = engine_for_run(run, host_name, inventory, runs_dir, accept_new_host_key) \
            if (run.dir / "playbook.yaml").is_file() else \
            bare_engine(host_name or recorded_host(run), inventory, runs_dir, accept_new_host_key)
    elif host_name:
        engine = bare_engine(host_name, inventory, runs_dir, accept_new_host_key)
        run_id = run_id or pending_run(engine)
        if run_id is None:  # as `recover RUN` says of a run with nothing left: exit 0
            nothing_to_recover(f"{host_name}: {recovery.NOTHING}", as_json, host=host_name, run_id=None)
            return
    else:
        raise ConfigError(f"no run {run_id!r} in {runs_path}: pass --host H to recover it from the target's "
                          "intent record")
    console = ui.make_console()
    view = ui.StepView(console, quiet=as_json)
    engine.listeners.append(view)
    with cancel_on_signals(engine.cancel), view:
        result, found = recovery.recover(engine, run_id, rollback=roll_back)
    if not as_json and result.exit_code == 0:
        ui.say(found.summary())
    report(console, result, as_json)


def nothing_to_recover(message: str, as_json: bool, **ids: str | None) -> None:
    """Nothing was left to end: exit 0, as `recover RUN` of a settled run says."""
    if as_json:
        emit_json({**ids, "exit_code": 0, "error": None, "message": message})
    else:
        click.echo(message)


def bare_engine(host_name: str, inventory: str | None, runs_dir: str | None, accept_new_host_key: bool) -> Engine:
    """An engine with no playbook: for recovering a run whose run dir is on another machine."""
    from deployer import runlog
    from deployer.config.models import Playbook, find_inventory, get_host, load_inventory
    from deployer.run.engine import Engine
    from deployer.steps.context import LoadedPlaybook
    from deployer.transport.factory import open_transport

    inventory_path = find_inventory(inventory)
    host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    model = Playbook.model_construct(name="recover", description="", files=[], patch=None, steps=[],
                                     on_failure="restore")
    loaded = LoadedPlaybook(path=Path("(intent record on the target)"), raw=b"", model=model, sources={},
                            patch=None)
    return Engine(host_name=host_name, host=host, playbook=loaded, steps=[], listeners=[pin_notice],
                  runs_dir=runlog.runs_dir_from(runs_dir),
                  connect=lambda bus: open_transport(host_name, host, bus, accept_new_host_key=accept_new_host_key))


def recorded_host(run: runlog.Run) -> str:
    """The host a run was for: its run_start names it, or, killed before it wrote one, its state record."""
    from deployer.errors import ConfigError
    from deployer.run.state import RunRecord

    record = RunRecord.load(run.dir)
    host = run.start.get("host") or (record.state.host if record is not None else None)
    if not isinstance(host, str):
        raise ConfigError(f"run {run.run_id} names no host (its log and record are empty): pass --host H")
    return host


def pending_run(engine: Engine) -> str | None:
    """The run the host's intent record names, else the run whose lock was left (killed before its intent
    record); None when the target holds neither."""
    from deployer.errors import DeployerError
    from deployer.run import gitops, intent
    from deployer.run.lock import read_state
    from deployer.runlog import is_run_id

    with engine.connect(engine.new_bus()) as transport:
        git_dir = gitops.git_dir(transport, engine.host.repo)
        pending = intent.read(transport, git_dir, engine.host_name)
        if pending is not None:
            return pending.run_id
        lock = read_state(transport, git_dir, engine.host.lock_ttl_s, engine.host_name)
    if lock is None:
        return None
    holder = lock.info.get("run_id")
    if not isinstance(holder, str) or not is_run_id(holder):
        raise DeployerError(f"the deploy lock {lock.path} on {engine.host_name} names no run deployer could "
                            f"recover ({holder!a}); see: deployer lock status --host {engine.host_name}")
    return holder
