"""The command line: parse, load, hand over to the core, render, map failures to exit codes.

The `deployer` group is here, its commands in one module per family (deploy, followup, history, admin...). Only click is
imported up front, so `deployer --help` and shell completion stay fast; each command imports the core
(pydantic, paramiko, rich) when it runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from deployer.cli import admin, bake, canary, check, daemon, deploy, followup, history, logs, restart, rollout
from deployer.cli.output import EXIT_CODES, fail_json
from deployer.codetable import installed


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


@click.group(cls=DeployerGroup, epilog=EXIT_CODES,
             commands=[*deploy.COMMANDS, *check.COMMANDS, *followup.COMMANDS, *restart.COMMANDS, *canary.COMMANDS,
                       *history.COMMANDS, *logs.COMMANDS, *admin.COMMANDS, *bake.COMMANDS, *rollout.COMMANDS,
                       *daemon.COMMANDS])
@click.version_option(package_name="deployer")
def main() -> None:
    """Ship a source patch to a serving host and prove it."""


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
    installed().save()  # after the output: a first run's table costs its user nothing they wait for
    os._exit(code)
