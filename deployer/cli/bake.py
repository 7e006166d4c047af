"""`deployer bake`: a successful run's fix, made permanent: its commit as a patch and a Dockerfile layer over the
image the target runs (deployer.app.bakes)."""

from __future__ import annotations

import click

from deployer.cli.options import (
    accept_option,
    complete_runs,
    inventory_option,
    json_option,
    runs_dir_option,
)
from deployer.cli.output import emit_json, failures_to_exit_codes
from deployer.cli.running import pin_notice


@click.command("bake")
@click.argument("run_id", shell_complete=complete_runs)
@click.option("--out", type=click.Path(file_okay=False), metavar="DIR",
              help="The directory to write (new, or empty; default ./bake-RUN_ID).")
@inventory_option
@runs_dir_option
@accept_option
@json_option()
@failures_to_exit_codes
def bake(run_id: str, out: str | None, inventory: str | None, runs_dir: str | None, accept_new_host_key: bool,
         as_json: bool) -> None:
    """Write what makes a run's fix permanent: its commit as a patch (git format-patch, read on the target), and a
    Dockerfile FROM the image the target runs with the files it shipped at their paths (a plain host: FROM the
    BASE_IMAGE build argument), so the next image build carries the fix. Only a committed, successful apply
    whose log verifies and whose target's history vouches for it (exit 2, 5 otherwise).

    RUN_ID: `last` (the newest run), or any unique beginning of a run id."""
    from deployer.app.bakes import BakeOptions, bake
    from deployer.ui.console import say

    baked = bake(BakeOptions(run_id=run_id, out=out, inventory=inventory, runs_dir=runs_dir,
                             accept_new_host_key=accept_new_host_key), listener=pin_notice)
    if as_json:
        emit_json(baked.document())
        return
    base = (f"FROM {baked.image.name} ({baked.image.source})" if baked.image is not None
            else "FROM the BASE_IMAGE build argument (a plain host runs no image)")
    say(f"run {baked.run_id} on {baked.host}: commit {baked.commit[:12]} baked into {baked.out}/")
    say(f"  {baked.patch.name}  the commit as a patch: git am it onto {baked.before[:12]}")
    say(f"  Dockerfile  {base}, then {len(baked.files)} file(s) at their paths:")
    for shipped in baked.files:
        say(f"    {shipped.path}")
    say("  README.txt  how to build it, and what the controller's rollout does then")


COMMANDS = (bake,)
