"""The command line: parse, load, hand over to the core, render, map failures to exit codes."""

from __future__ import annotations

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

from deployer import runlog, ui
from deployer.config import find_inventory, get_host, load_inventory
from deployer.context import CancelToken
from deployer.engine import Engine
from deployer.errors import DeployerError
from deployer.playbook import load_playbook
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
    """First SIGINT/SIGTERM: stop at the next safe point. A second one: stop now."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if token.cancelled:
            raise KeyboardInterrupt
        token.cancel(f"interrupted by {signal.Signals(signum).name}")
        ui.show_error(f"{signal.Signals(signum).name}: stopping at the next safe point (again to force)")

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def build_engine(playbook_path: str, host_name: str, inventory: str | None, runs_dir: str | None,
                 accept_new_host_key: bool, allow_dirty: bool = False) -> Engine:
    inventory_path = find_inventory(inventory)
    host = get_host(load_inventory(inventory_path), host_name, inventory_path)
    playbook, steps = load_playbook(Path(playbook_path))
    return Engine(host_name=host_name, host=host, playbook=playbook, steps=steps,
                  runs_dir=runlog.runs_dir_from(runs_dir), allow_dirty=allow_dirty,
                  connect=lambda bus: open_transport(host_name, host, bus,
                                                     accept_new_host_key=accept_new_host_key))


def run_plan(engine: Engine, as_json: bool) -> None:
    report = engine.plan()
    if as_json:
        click.echo(json.dumps(ui.plan_json(report), indent=1))
    else:
        ui.show_plan(ui.make_console(), report)


def run_apply(engine: Engine, as_json: bool) -> None:
    console = ui.make_console()
    view = ui.StepView(console, quiet=as_json)
    engine.listeners.append(view)
    with cancel_on_signals(engine.cancel), view:
        result = engine.apply()
    if as_json:
        click.echo(json.dumps(ui.result_json(result), indent=1))
    else:
        ui.show_result(console, result)
        if result.error:
            ui.show_error(result.error)
    sys.exit(result.exit_code)


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--host", "host_name", required=True, help="Inventory host name.")
@inventory_option
@runs_dir_option
@accept_option
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable plan.")
@failures_to_exit_codes
def plan(playbook: str, host_name: str, inventory: str | None, runs_dir: str | None,
         accept_new_host_key: bool, as_json: bool) -> None:
    """Dry run: diffs, the projected diff --stat and the exact commands; changes nothing."""
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
        run_apply(engine, as_json)


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
@failures_to_exit_codes
def runs_verify(run_id: str, runs_dir: str | None) -> None:
    """Check the run log's hash chain and its artifacts; exit 5 when anything was altered."""
    problems = runlog.verify(runlog.runs_dir_from(runs_dir), run_id)
    if problems:
        for problem in problems:
            ui.show_error(problem)
        sys.exit(5)
    click.echo(f"run {run_id}: log verifies")
