"""The command line: parse, load, hand over to the core, render, map failures to exit codes."""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import click

from deployer import lock as locks
from deployer import rollback as rollbacks
from deployer import runlog, ui
from deployer.command import Masker
from deployer.config import Host, find_inventory, get_host, load_inventory
from deployer.context import CancelToken, EventBus, LoadedPlaybook
from deployer.engine import Engine, PlanReport, RunResult, operator_id
from deployer.errors import ConfigError, DeployerError
from deployer.playbook import load_playbook, parse_playbook
from deployer.transport.base import Transport
from deployer.transport.factory import open_transport

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES = """Exit codes: 0 ok, 1 a step failed (target restored), 2 usage/config error, 3 lock held,
4 connection or host-key error, 5 verification failed, 6 rollback failed, 130 interrupted."""


def failures_to_exit_codes(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DeployerError as exc:
            ui.show_error(str(exc))
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            ui.show_error("interrupted")
            sys.exit(130)
    return wrapper  # type: ignore[return-value]


def inventory_option(func: F) -> F:
    return click.option("-i", "--inventory",
                        help="Inventory file (default $DEPLOYER_INVENTORY, then ./hosts.yaml).")(func)


def runs_dir_option(func: F) -> F:
    return click.option("--runs-dir",
                        help="Run log directory (default $DEPLOYER_RUNS_DIR, then .deployer/runs).")(func)


def accept_option(func: F) -> F:
    return click.option("--accept-new-host-key", is_flag=True,
                        help="Pin an unknown SSH host key into known_hosts (a changed key is always refused).")(func)


@click.group(epilog=EXIT_CODES)
@click.version_option(package_name="deployer")
def main() -> None:
    """Ship a source patch to a serving host and prove it."""


@contextmanager
def cancel_on_signals(token: CancelToken) -> Iterator[None]:
    """First SIGINT/SIGTERM/SIGHUP: stop at the next safe point. A second one: stop now."""
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
    """Pinning a host key is an explicit choice: say so on every command, not only in run logs."""
    if event.get("type") == "host_key_pinned":
        ui.show_error(f"pinned a new host key for {event['entry']}: {event['key_type']} {event['fingerprint']}")


def build_engine(playbook_path: str, host_name: str, inventory: str | None, runs_dir: str | None,
                 accept_new_host_key: bool, allow_dirty: bool = False) -> Engine:
    inventory_path = find_inventory(inventory)
    host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    playbook, steps = load_playbook(Path(playbook_path))
    return Engine(host_name=host_name, host=host, playbook=playbook, steps=steps, listeners=[pin_notice],
                  runs_dir=runlog.runs_dir_from(runs_dir), allow_dirty=allow_dirty,
                  connect=lambda bus: open_transport(host_name, host, bus,
                                                     accept_new_host_key=accept_new_host_key))


def run_plan(engine: Engine, as_json: bool) -> None:
    show_plan(engine.plan(), as_json)


def show_plan(report: PlanReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(ui.plan_json(report), indent=1))
    else:
        ui.show_plan(ui.make_console(), report)


def run_with_view(engine: Engine, as_json: bool, run: Callable[[], RunResult]) -> None:
    """Run with the live step view and signal handling, then report and exit with the run's code."""
    console = ui.make_console()
    view = ui.StepView(console, quiet=as_json)
    engine.listeners.append(view)
    with cancel_on_signals(engine.cancel), view:
        result = run()
    report(console, result, as_json)


def report(console: ui.Console, result: RunResult, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(ui.result_json(result), indent=1))
    else:
        ui.show_result(console, result)
        if result.error:
            ui.show_error(result.error)
    sys.exit(result.exit_code)


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False), required=False)
@click.option("--host", "host_name", help="Inventory host name.")
@click.option("--rollback", "rollback_of", metavar="RUN_ID", help="Preview the rollback of a run instead.")
@inventory_option
@runs_dir_option
@accept_option
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable plan.")
@failures_to_exit_codes
def plan(playbook: str | None, host_name: str | None, rollback_of: str | None, inventory: str | None,
         runs_dir: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Dry run: diffs, the projected diff --stat and the exact commands; changes nothing."""
    if rollback_of:
        run = runlog.read_run(runlog.runs_dir_from(runs_dir), rollback_of)
        engine = engine_for_run(run, host_name, inventory, runs_dir, accept_new_host_key)
        show_plan(rollbacks.plan(engine, run), as_json)
        return
    if not playbook or not host_name:
        raise ConfigError("plan needs PLAYBOOK and --host (or --rollback RUN_ID)")
    run_plan(build_engine(playbook, host_name, inventory, runs_dir, accept_new_host_key), as_json)


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--host", "host_name", required=True, help="Inventory host name.")
@inventory_option
@runs_dir_option
@accept_option
@click.option("--allow-dirty", is_flag=True, help="Ship even over uncommitted changes in the target files.")
@click.option("--dry-run", is_flag=True, help="Same as `deployer plan`.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@failures_to_exit_codes
def apply(playbook: str, host_name: str, inventory: str | None, runs_dir: str | None,
          accept_new_host_key: bool, allow_dirty: bool, dry_run: bool, as_json: bool) -> None:
    """Run the chain: compile, upload, compile there, bound, commit, restart, verify."""
    engine = build_engine(playbook, host_name, inventory, runs_dir, accept_new_host_key, allow_dirty)
    if dry_run:
        run_plan(engine, as_json)
    else:
        run_with_view(engine, as_json, engine.apply)


@main.group()
def runs() -> None:
    """Inspect run logs."""


@runs.command("list")
@runs_dir_option
@failures_to_exit_codes
def runs_list(runs_dir: str | None) -> None:
    """List recorded runs, oldest first."""
    ui.show_runs(ui.make_console(), runlog.list_runs(runlog.runs_dir_from(runs_dir)))


@runs.command("show")
@click.argument("run_id")
@runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw events.")
@failures_to_exit_codes
def runs_show(run_id: str, runs_dir: str | None, as_json: bool) -> None:
    """Show one run: steps, outcome, commits, links."""
    run = runlog.read_run(runlog.runs_dir_from(runs_dir), run_id)
    if as_json:
        click.echo(json.dumps(run.events, indent=1))
    else:
        ui.show_run(ui.make_console(), run)


@runs.command("verify")
@click.argument("run_id")
@runs_dir_option
@click.option("--target", "on_target", is_flag=True,
              help="Also compare the log with the run's commits on its host (Deployer-Log trailers).")
@inventory_option
@failures_to_exit_codes
def runs_verify(run_id: str, runs_dir: str | None, on_target: bool, inventory: str | None) -> None:
    """Check the run log's hash chain and its artifacts; exit 5 when anything was altered."""
    problems = runlog.verify(runlog.runs_dir_from(runs_dir), run_id)
    if on_target:
        run = runlog.read_run(runlog.runs_dir_from(runs_dir), run_id)
        problems += rollbacks.verify_on_target(engine_for_run(run, None, inventory, runs_dir, False), run)
    if problems:
        for problem in problems:
            ui.show_error(problem)
        sys.exit(5)
    click.echo(f"run {run_id}: log verifies")


def engine_for_run(run: runlog.Run, host_override: str | None, inventory: str | None, runs_dir: str | None,
                   accept_new_host_key: bool) -> Engine:
    """An engine on the run's host, with the run's own copy of its playbook."""
    host_name = host_override or str(run.start.get("host") or "")
    inventory_path = find_inventory(inventory)
    host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    copy = run.dir / "playbook.yaml"
    model, steps, _ = parse_playbook(copy)
    loaded = LoadedPlaybook(path=copy, raw=copy.read_bytes(), model=model, sources={}, patch=None)
    return Engine(host_name=host_name, host=host, playbook=loaded, steps=steps, listeners=[pin_notice],
                  runs_dir=runlog.runs_dir_from(runs_dir),
                  connect=lambda bus: open_transport(host_name, host, bus, accept_new_host_key=accept_new_host_key))


@main.command()
@click.argument("run_id", required=False)
@click.option("--host", "host_name", help="Host (default: the run's host; required with --list).")
@click.option("--list", "list_only", is_flag=True, help="List the deployer commits on the host (from its git log).")
@click.option("--force", is_flag=True, help="Roll back even if the run's files changed since.")
@inventory_option
@runs_dir_option
@accept_option
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@failures_to_exit_codes
def rollback(run_id: str | None, host_name: str | None, list_only: bool, force: bool, inventory: str | None,
             runs_dir: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Revert RUN_ID's files to before the run by a new commit, restart, verify again."""
    if list_only:
        if not host_name:
            raise ConfigError("--list needs --host")
        list_host_deploys(host_name, inventory, accept_new_host_key, as_json)
        return
    if not run_id:
        raise ConfigError("give a RUN_ID (see 'deployer runs list' or 'deployer rollback --host H --list')")
    run = runlog.read_run(runlog.runs_dir_from(runs_dir), run_id)
    engine = engine_for_run(run, host_name, inventory, runs_dir, accept_new_host_key)
    run_with_view(engine, as_json, lambda: rollbacks.rollback(engine, run, force=force))


def open_host(host_name: str, inventory: str | None, accept_new_host_key: bool) -> tuple[Host, Transport]:
    """A connection to an inventory host outside any run (listing, lock inspection)."""
    inventory_path = find_inventory(inventory)
    host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    bus = EventBus(Masker(host.secrets()), host_name)
    bus.listeners.append(pin_notice)
    return host, open_transport(host_name, host, bus, accept_new_host_key=accept_new_host_key)


def list_host_deploys(host_name: str, inventory: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    host, transport = open_host(host_name, inventory, accept_new_host_key)
    with transport:
        deploys = rollbacks.list_deploys(transport, host.repo)
    if as_json:
        click.echo(json.dumps([vars(d) for d in deploys], indent=1))
    else:
        ui.show_deploys(ui.make_console(), deploys)


@main.group()
def lock() -> None:
    """Inspect or break the deploy lock on a host."""


@lock.command("status")
@click.option("--host", "host_name", required=True, help="Inventory host name.")
@inventory_option
@accept_option
@click.option("--json", "as_json", is_flag=True)
@failures_to_exit_codes
def lock_status(host_name: str, inventory: str | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Who holds the deploy lock, since when, and whether it is stale. Exit 3 when held."""
    host, transport = open_host(host_name, inventory, accept_new_host_key)
    with transport:
        state = locks.read_state(transport, git_dir_of(transport, host), host.lock_ttl_s)
    if as_json:
        click.echo(json.dumps(None if state is None else {**state.info, "stale": state.stale,
                                                          "heartbeat_age_s": state.heartbeat_age_s}))
    else:
        click.echo(f"{host_name}: " + ("unlocked" if state is None else f"locked, {state.describe()}"))
    if state is not None:
        sys.exit(3)


@lock.command("release")
@click.option("--host", "host_name", required=True, help="Inventory host name.")
@click.option("--force", is_flag=True, required=True, help="Required: you are breaking someone's lock.")
@inventory_option
@runs_dir_option
@accept_option
@failures_to_exit_codes
def lock_release(host_name: str, force: bool, inventory: str | None, runs_dir: str | None,
                 accept_new_host_key: bool) -> None:
    """Remove a held (normally stale) lock; the removal is recorded as a run of its own."""
    host, transport = open_host(host_name, inventory, accept_new_host_key)
    with transport:
        git_dir = git_dir_of(transport, host)
        state = locks.read_state(transport, git_dir, host.lock_ttl_s)
        if state is None:
            click.echo(f"{host_name}: not locked")
            return
        if not state.stale:
            ui.show_error(f"the lock was NOT stale: {state.describe()}; that run may still be going")
        locks.force_release(transport, git_dir)
    run_id = runlog.new_run_id()
    log = runlog.RunLogWriter(runlog.runs_dir_from(runs_dir), run_id)
    try:
        log.write({"type": "run_start", "host": host_name, "operator": operator_id(), "kind": "lock_release"})
        log.write({"type": "lock_force_released", "host": host_name, "holder": state.info,
                   "heartbeat_age_s": state.heartbeat_age_s, "stale": state.stale})
        log.write({"type": "run_end", "host": host_name, "status": "successful", "exit_code": 0, "git": {}})
    finally:
        log.close()
    click.echo(f"{host_name}: removed the lock of run {state.info.get('run_id')} (recorded as run {run_id})")


def git_dir_of(transport: Transport, host: Host) -> str:
    result = transport.run(("git", "rev-parse", "--absolute-git-dir"), cwd=host.repo, timeout=30)
    if not result.ok:
        raise ConfigError(f"{host.repo} is not a git checkout on the target: {result.err.strip()}")
    return result.out.strip()


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False),
              help="Where to create the scratch repo (default: a temp dir).")
@click.option("--keep", is_flag=True, help="Leave the demo stack running and print its URLs.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary.")
@failures_to_exit_codes
def demo(workdir: str | None, keep: bool, as_json: bool) -> None:
    """The embedded demo: a buggy serving stack on this machine, hotfixed and proven in one run."""
    from deployer.demo.run import run_demo  # the demo's imports are not needed by other commands

    console = ui.make_console()
    view = ui.StepView(console, quiet=as_json)
    token = CancelToken()
    if not as_json:
        console.print("deployer demo: starting a buggy prefill/decode/router stack on 127.0.0.1 ...")
    with cancel_on_signals(token), view:
        outcome = run_demo(Path(workdir) if workdir else None, keep=keep, listeners=[view], cancel=token)
    if as_json:
        click.echo(json.dumps({**ui.result_json(outcome.result), "workdir": str(outcome.stack.workdir)}, indent=1))
    else:
        ui.show_demo(console, outcome)
        if outcome.result.error:
            ui.show_error(outcome.result.error)
    sys.exit(outcome.result.exit_code)
