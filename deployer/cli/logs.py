"""`deployer logs`: a service's log on its host, read through the agent, without logging in to find it."""

from __future__ import annotations

import select
import signal
import sys
import threading

import click

from deployer.cli.options import accept_option, host_option, inventory_option, json_option
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import pin_notice

FOLLOW_READER_POLL_S = 0.5  # how often a quiet follow looks whether what reads its output is still there


@click.command()
@click.argument("service", required=False)
@host_option(required=True, help="A host, or a group or unit: each of its hosts (those that have SERVICE).")
@click.option("--all", "whole", is_flag=True, help="The whole log, every start's output (default: this start's).")
@click.option("-n", "--lines", type=click.IntRange(min=1), help="Only the last N lines.")
@click.option("-f", "--follow", is_flag=True, help="Then show what is written, until Ctrl-C (exit 130).")
@inventory_option
@accept_option
@json_option()
@failures_to_exit_codes
def logs(service: str | None, host_name: str, whole: bool, lines: int | None, follow: bool, inventory: str | None,
         accept_new_host_key: bool, as_json: bool) -> None:
    """Show SERVICE's log on the host (default: every service of the host, each under a heading): what a
    `start:` service printed (or its own `log:` file), a systemd unit's journal, a container's output. Text from
    the target is shown with its control characters escaped. Exit 2 when no host has SERVICE."""
    from deployer.app.logs import LogOptions, service_logs
    from deployer.ui.logs import LogPrinter

    if follow and as_json:
        raise click.UsageError("--follow writes text as it comes: give --follow or --json")
    chosen = service_logs(LogOptions(host=host_name, service=service, whole=whole, lines=lines, inventory=inventory,
                                     accept_new_host_key=accept_new_host_key), listener=pin_notice)
    printer = LogPrinter(headings=sum(map(len, chosen.services.values())) > 1)
    if not follow:
        read = chosen.read()
        if as_json:
            emit_json(read.document())
        for one in [] if as_json else read.logs:
            printer.show(one)
        return
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    reader = threading.Thread(target=_until_no_reader, args=(stop,), daemon=True)
    reader.start()
    try:
        chosen.follow(printer.show, stop)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    # A follow ends when it is interrupted, or when what read its output is gone (`| head -1`): as a pipe's
    # writer ends when its reader does, without a word.
    sys.exit(1 if _no_reader() else 130)


def _no_reader() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll says POLLERR at once)."""
    try:
        polled = select.poll()
        polled.register(sys.stdout.fileno(), 0)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in polled.poll(0))
    except (OSError, ValueError):
        return False


def _until_no_reader(stop: threading.Event) -> None:
    """A follow that writes nothing while its logs are quiet would never hear that its reader left: look."""
    while not stop.wait(FOLLOW_READER_POLL_S):
        if _no_reader():
            stop.set()


COMMANDS = (logs,)
