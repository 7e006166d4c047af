"""The commands around a deploy: the lock, a playbook written from a change, the schemas, the demo."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from deployer.cli.options import accept_option, host_option, inventory_option, json_option, runs_dir_option
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import cancel_on_signals, pin_notice

if TYPE_CHECKING:
    from rich.console import Console

    from deployer.app.watch import Watch, Watched


@click.group()
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
    from deployer.app.locks import LockOptions, lock_status
    from deployer.ui.console import say

    status = lock_status(LockOptions(host=host_name, inventory=inventory, accept_new_host_key=accept_new_host_key),
                         listener=pin_notice)
    if as_json:
        emit_json(status.document())
    else:
        say(f"{host_name}: " + ("unlocked" if status.state is None else f"locked, {status.state.describe()}"))
        for stray in status.strays:
            say(f"{host_name}: {stray} is left from a run cut while taking or releasing the lock; "
                "the next run that takes the lock removes it")
        if status.next:
            say(f"{host_name}: {status.next}")
    if status.exit_code:
        sys.exit(status.exit_code)


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
    from deployer.app.locks import LockOptions, release_lock
    from deployer.ui.console import say

    released = release_lock(LockOptions(host=host_name, inventory=inventory, runs_dir=runs_dir,
                                        accept_new_host_key=accept_new_host_key), listener=pin_notice)
    if as_json:
        emit_json(released.document())
    elif released.state is None:
        say(f"{host_name}: not locked")
    else:
        say(f"{host_name}: removed the lock of run {released.state.info.get('run_id')} (recorded as run "
            f"{released.run_id})")
        if released.next:
            say(f"{host_name}: {released.next}")


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, resolve_path=True),
              help="Where to create the scratch repo (default: a temp dir); with --stop, the demo to stop.")
@click.option("--fleet", is_flag=True, help="Two prefill/decode units over four local hosts, as one fleet run.")
@click.option("--container", "in_containers", is_flag=True,
              help="Prefill and decode each in its own podman container (or podman-docker's docker): the services "
                   "are the containers.")
@click.option("--regression", is_flag=True, help=(
    "With --fleet: the fix also makes the build wait six times as long before a first token; the analysis fails it and "
    "the unit is rolled back."))
@click.option("--keep", is_flag=True, help="Leave the demo stack running and print its URLs.")
@click.option("--stop", "stop_kept", is_flag=True, help=(
    "Stop the stack a `deployer demo --keep` left running, and remove the files of a demo whose stack is stopped."))
@json_option()
@failures_to_exit_codes
def demo(workdir: str | None, fleet: bool, in_containers: bool, regression: bool, keep: bool, stop_kept: bool,
         as_json: bool) -> None:
    """The embedded demo: a buggy serving stack on this machine, hotfixed and proven in one run."""
    from deployer.demo.run import DemoStack, remove_stopped, run_demo, stop_kept_stacks
    from deployer.ui.console import make_console, show_error
    from deployer.ui.demo import show_demo, show_stopped

    if stop_kept:
        from deployer.demo.containers import demo_stacks_in
        chosen = Path(workdir) if workdir else None
        stopped = stop_kept_stacks(chosen, demo_stacks_in)  # a container demo's containers too
        removed = remove_stopped(chosen)
        if as_json:
            emit_json({"stopped": {str(w): pids for w, pids in stopped.items()}, "removed": [str(d) for d in removed],
                       "exit_code": 0, "error": None})
        else:
            show_stopped(make_console(), stopped, chosen, removed)
        return
    if fleet:
        if in_containers:
            raise click.UsageError("--container is the single demo's: give --fleet or --container")
        fleet_demo(Path(workdir) if workdir else None, keep, as_json, regression)
        return
    if regression:
        raise click.UsageError("--regression is the fleet demo's: give --fleet too")
    if in_containers:
        from deployer.demo.containers import container_stack_of, find_engine
    # No engine for --container: exit 4, saying what to install.
    stack = container_stack_of(find_engine()) if in_containers else DemoStack
    console = make_console()
    if not as_json:
        where = " (prefill and decode in containers)" if in_containers else ""
        console.print(f"deployer demo: starting a buggy prefill/decode/router stack on 127.0.0.1{where} ...")
    outcome = run_demo(Path(workdir) if workdir else None, keep=keep, watch=demo_watch(console, as_json),
                       stack=stack)
    if as_json:
        emit_json({**outcome.result.document(), "workdir": str(outcome.stack.workdir)})
    else:
        show_demo(console, outcome)
        if outcome.result.error:
            show_error(outcome.result.error)
    sys.exit(outcome.result.exit_code)


def demo_watch(console: Console, as_json: bool) -> Watch:
    """The demo's watch: signals cancel it, and its live view follows it on the console the demo prints to (a
    step view for the single demo, a row per host for --fleet)."""

    @contextmanager
    def watch(run: Watched) -> Iterator[None]:
        from deployer.ui.live import FleetView, StepView

        view = FleetView(console, run.hosts, quiet=as_json) if run.kind == "fleet" else \
            StepView(console, quiet=as_json)
        run.listeners.append(view)
        with cancel_on_signals(run.cancel), view:
            yield
    return watch


def fleet_demo(workdir: Path | None, keep: bool, as_json: bool, regression: bool) -> None:
    """`deployer demo --fleet`: the fleet run's live view and per-host table, then each unit's gauge."""
    from deployer.demo.run import run_fleet_demo
    from deployer.ui.console import make_console, show_error
    from deployer.ui.demo import show_fleet_demo
    from deployer.ui.fleet import show_fleet

    console = make_console()
    if not as_json:
        console.print("deployer demo --fleet: starting two buggy prefill/decode units over four local hosts ...")
    outcome = run_fleet_demo(workdir, keep=keep, watch=demo_watch(console, as_json), regression=regression)
    state = outcome.state
    if as_json:
        emit_json({**state.document(), "gauges": outcome.gauges(), "analyses": outcome.analyses(),
                   "load": outcome.load.summary(),
                   "proof": outcome.proof.summary() if outcome.proof is not None else None,
                   "workdir": str(outcome.workdir), "exit_code": outcome.exit_code, "error": outcome.error})
    else:
        show_fleet(console, state)
        show_fleet_demo(console, outcome)
        if outcome.error:
            show_error(outcome.error)
    sys.exit(outcome.exit_code)


@click.command()
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
    from deployer.app import scaffold
    from deployer.ui.console import say

    made = scaffold.init(scaffold.InitOptions(source=source, base=base, output=output, as_patch=as_patch,
                                              message=message, host=host_name, metric=metric, inventory=inventory))
    if as_json:
        emit_json(made.document())
        return
    say(f"wrote {made.playbook}: {len(made.files)} file(s), "
        f"+{sum(f.insertions for f in made.files)} -{sum(f.deletions for f in made.files)}")
    for f in made.files:
        say(f"  {f.dest}  +{f.insertions} -{f.deletions}{'  (new file)' if f.new else ''}")
    for note in made.notes:
        say(f"note: {note}")
    say(f"next: {made.next_step(made.playbook)}")


@click.command()
@click.argument("kind", type=click.Choice(["playbook", "inventory"]))
@json_option("Accepted for symmetry: the schema is JSON already.")
@failures_to_exit_codes
def schema(kind: Literal["playbook", "inventory"], as_json: bool) -> None:
    """Print the JSON Schema of a playbook or an inventory (for editors: see the docs' editor how-to)."""
    from deployer.app.schemas import schema_for

    emit_json(schema_for(kind))


COMMANDS = (lock, demo, init, schema)
