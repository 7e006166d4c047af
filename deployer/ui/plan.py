"""The dry run as a person reads it, and as its --json document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from deployer.steps.action import briefly

if TYPE_CHECKING:
    from deployer.fleet.apply import RolloutPlan
    from deployer.run.plan import PlanReport
    from deployer.steps.services.budgets import Timing


def show_plan(console: Console, report: PlanReport, timings: Sequence[Timing] = (), *, verbose: bool = False) -> None:
    """The plan; each step's actions a line per thing a person cares about (verbose: a line per action, exactly
    as the run does and logs it)."""
    console.print(f"[bold]plan[/bold] for host {escape(f'{report.host_name}: {report.repo} at {report.head[:12]}')}")
    if report.lock is not None:
        console.print(f"[yellow]deploy lock[/yellow] {escape(report.lock.describe())}")
    if report.dirty:
        console.print(f"[red]uncommitted changes on the target:[/red] {escape(', '.join(report.dirty))} "
                      "(apply refuses unless --allow-dirty)")
    if report.placement:
        box = report.placement
        console.print(f"in {escape(box['engine'])} container {escape(box['container'])} (id {box['id'][:12]}):")
        for line in report.places:
            console.print(f"  {line}", markup=False, highlight=False)
    for plan in report.files:
        console.rule(Text(f"{plan.dest}{'' if plan.exists else ' (new file)'}"))
        if console.is_terminal:
            from rich.syntax import Syntax  # pygments: only a plan shows diffs

            console.print(Syntax(plan.diff, "diff", theme="ansi_dark", background_color="default"))
        else:
            console.print(plan.diff, markup=False, highlight=False, end="")
    console.rule("projected git diff --stat")
    for line in report.stat.lines():
        console.print(line, markup=False, highlight=False)
    if report.restarts_with:
        console.print(f"[green]already applied:[/green] every file already holds these bytes at HEAD {report.head}: "
                      f"nothing is committed here, but its services restart with unit {escape(report.restarts_with)}, "
                      "whose other hosts change; apply would end it `unchanged`")
    elif report.already_applied:
        console.print(f"[green]nothing to do:[/green] every file already holds these bytes at HEAD {report.head}: "
                      "apply would end `unchanged`, restarting nothing (unless --restart)")
    elif report.rollback_of is not None:  # diff_bounds judge the fix's diff; a revert is that diff undone
        console.print("bounds: a rollback restores the run's files as they were before it; the playbook's "
                      "diff_bounds judge the fix, not its revert")
    elif report.bounds is None:
        console.print("bounds: none set (the playbook has no diff_bounds step)")
    elif report.bounds:
        console.print(f"[red]bounds: FAIL[/red] — {escape('; '.join(report.bounds))}")
    else:
        console.print("[green]bounds: ok[/green]")
    if report.judged.get("compile"):
        console.print(f"[red]compile: FAIL[/red] — {escape('; '.join(report.judged['compile']))}")
    elif "compile" in report.judged:
        console.print("[green]compile: ok[/green] (the shipped Python compiles here)")
    console.rule("steps")
    if report.unsent is None:
        console.print("sent whole: the steps up to the commit go with the lock and preflight's reads, in one round "
                      "trip, behind the target's own checks")
    else:
        console.print(f"sent in two round trips (the changes wait for preflight's answers): {escape(report.unsent)}")
    for number, (name, actions) in enumerate(report.steps, 1):
        why = report.not_run.get(name)
        console.print(f"{number}. [bold]{escape(name)}[/bold]" + (f" [yellow]not run:[/yellow] {escape(why)}"
                                                                 if why else ""))
        for line in [a.render() for a in actions] if verbose else [b.text for b in briefly(actions)]:
            console.print(f"     {line}", markup=False, highlight=False)
        if note := report.notes.get(name):
            console.print(f"     [yellow]warning:[/yellow] {escape(note)}")
    if timings:
        console.rule("time to healthy (this machine's runs)")
    for timing in timings:
        style = "yellow" if timing.short else "green"
        console.print(f"[{style}]{'warn' if timing.short else 'ok'}[/{style}] "
                      f"{escape(f'{timing.service}: {timing.describe()}')}")
    console.print("dry run: nothing was changed on the target" + ("" if verbose or not report.steps else
                                                                 "; --verbose shows every action exactly"))



def show_rollout(console: Console, rollout: RolloutPlan) -> None:
    """A fleet's batches in order, each with what its routers keep serving by role while it is out, and the routers
    that may pair a patched worker with an unpatched one."""
    console.rule("rollout")
    for number, batch in enumerate(rollout.batches, 1):
        if (pause := rollout.pause_before(number - 1)) is not None:
            console.print(pause, markup=False, highlight=False)
        console.print(f"batch {number}: {batch.describe()}", markup=False, highlight=False)
    for note in rollout.pairing:
        console.print(f"[yellow]warning:[/yellow] {escape(note)}")
