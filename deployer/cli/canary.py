"""`deployer canary --record`: write the golden answer a playbook's `canary: {golden: FILE}` compares with."""

from __future__ import annotations

import click

from deployer.cli.options import accept_option, host_option, inventory_option, json_option
from deployer.cli.output import emit_json, failures_to_exit_codes


@click.command()
@click.argument("playbook", required=False, type=click.Path(exists=True, dir_okay=False))
@host_option(required=True, help="The host whose server answers (its canary URL: the step's, or its service's).")
@click.option("--record", "out", required=True, type=click.Path(dir_okay=False),
              help="Write the answer here, as the golden one (only an answer that passes the canary's checks).")
@inventory_option
@accept_option
@json_option()
@failures_to_exit_codes
def canary(playbook: str | None, host_name: str, out: str, inventory: str | None, accept_new_host_key: bool,
           as_json: bool) -> None:
    """Send PLAYBOOK's canary request (its first `canary` step; without one, the defaults), in the step's or the
    host's `api:` (sglang, openai, openai-chat or a template), straight to the host's server and record the
    answer. Run it against a server you trust (before the fix, with deterministic inference on)."""
    from deployer.app.golden import GoldenOptions, record_golden
    from deployer.text import shown

    golden = record_golden(GoldenOptions(host=host_name, out=out, playbook=playbook, inventory=inventory,
                                         accept_new_host_key=accept_new_host_key))
    if as_json:
        emit_json(golden.document())
        return
    answer = golden.answer
    click.echo(f"recorded {out}: {answer.url} answered {answer.status} in {answer.seconds:.2f}s, "
               f"{shown(answer.text or '')}")


COMMANDS = (canary,)
