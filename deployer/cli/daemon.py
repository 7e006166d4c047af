"""`deployer daemon`: a resident deployer that starts commands without Python's and deployer's start-up."""

from __future__ import annotations

import time
from pathlib import Path

import click

from deployer.cli.options import json_option
from deployer.cli.output import emit_json, failures_to_exit_codes


@click.group()
def daemon() -> None:
    """A resident deployer: later commands skip Python's and deployer's start-up (about 0.3 s each).

    One per user and install, at a socket only you can reach; a command that finds it hands over its argv,
    directory, environment and terminal, and runs there as it would here. It serves only the code it loaded
    (after an upgrade or an edit it exits and commands run without it), and exits when idle.
    DEPLOYER_DAEMON=off ignores it; DEPLOYER_DAEMON=auto starts one whenever a command finds none."""


dir_option = click.option(
    "--dir", "folder", type=click.Path(path_type=Path), default=None,
    help="The folder of the daemon's socket [default: $DEPLOYER_DAEMON_DIR, else $XDG_RUNTIME_DIR/deployer, else "
         "~/.cache/deployer/daemon]. Commands find the daemon there only through DEPLOYER_DAEMON_DIR.")


@daemon.command("start")
@dir_option
@click.option("--idle", "idle_minutes", type=click.FloatRange(min=0.1, max=7 * 24 * 60), default=15.0,
              show_default=True,
              help="Exit after this many minutes without a command (at most a week).")
@json_option()
@failures_to_exit_codes
def daemon_start(folder: Path | None, idle_minutes: float, as_json: bool) -> None:
    """Start the daemon (a running one of this code is kept; one of other code is replaced)."""
    from deployer.daemon.control import start

    found, started = start(idle_minutes * 60, folder)
    if as_json:
        emit_json({**found, "started_now": started})
        return
    click.echo(f"deployer daemon pid {found['pid']} {'started' if started else 'already running'}; "
               f"it exits after {found['idle_s'] / 60:g} minutes without a command")


@daemon.command("status")
@dir_option
@json_option()
@failures_to_exit_codes
def daemon_status(folder: Path | None, as_json: bool) -> None:
    """Whether a daemon runs for this install, and whether it runs this code. Exit 3 when none runs."""
    from deployer.daemon.control import status

    found = status(folder)
    if as_json:
        none = {"exit_code": 3, "error": "no deployer daemon runs for this install"}
        emit_json({"running": found is not None, **(found or none)})
    elif found is None:
        click.echo("no deployer daemon runs for this install: commands start on their own")
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found["started"]))
        click.echo(f"deployer daemon pid {found['pid']}, since {since}, {found['served']} commands served; "
                   + ("runs this code" if found["current"] else "runs other code, or was started from another module "
                      "path, flags or process context: it serves no command of this one (`deployer daemon start` "
                      "replaces it)"))
    if found is None:
        raise SystemExit(3)


@daemon.command("stop")
@dir_option
@json_option()
@failures_to_exit_codes
def daemon_stop(folder: Path | None, as_json: bool) -> None:
    """Stop the daemon; commands it started run on to their end."""
    from deployer.daemon.control import stop

    pid = stop(folder)
    if as_json:
        emit_json({"stopped": pid})
    else:
        click.echo("no deployer daemon was running" if pid is None else f"deployer daemon pid {pid} stopped")


COMMANDS = [daemon]
