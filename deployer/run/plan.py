"""The dry run of one host: only reads on the target, and what apply would change, count and run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deployer import diffs
from deployer.command import Masker
from deployer.run import whole
from deployer.run.lock import LockState, read_state
from deployer.run.mounts import describe
from deployer.run.preflight import preflight, projected_stat
from deployer.run.prepare import already_applied
from deployer.steps.action import Kind, briefly
from deployer.steps.base import Action, Step
from deployer.steps.context import Context
from deployer.steps.optional import judge_here, judges, plan_note


@dataclass
class FilePlan:
    """One file in a plan: its diff and counts, and whether it exists on the target."""
    dest: str
    diff: str
    stat: diffs.FileStat
    exists: bool


@dataclass
class PlanReport:
    """What `plan` shows for one host: the diffs, the projected stat, the judged steps and actions."""
    host_name: str
    repo: str
    head: str
    files: list[FilePlan]
    stat: diffs.DiffStat
    judged: dict[str, list[str]]  # what steps judge before the target is touched ("bounds", "compile"): problems
    steps: list[tuple[str, list[Action]]]
    lock: LockState | None
    dirty: list[str] = field(default_factory=list)
    placement: dict[str, Any] | None = None  # a container target's: its id and where each dest lives
    unsent: str | None = None  # why apply would not send its chain up to the commit with the lock (None: it would)
    already_applied: bool = False  # every dest holds its bytes at HEAD: apply would end `unchanged`, judging nothing
    restarts_with: str | None = None  # already applied, in a unit that changes elsewhere: restarted with it
    not_run: dict[str, str] = field(default_factory=dict)  # step -> why it will not run (a rollback's left-out check)
    notes: dict[str, str] = field(default_factory=dict)  # step -> what apply may warn of (Step.plan_note)
    rollback_of: str | None = None  # the run whose rollback this plans (None: a playbook's apply)

    @property
    def places(self) -> list[str]:
        """Where each dest lives in the container, for people (none: not a container)."""
        return [f"{dest}: {where}" for dest, where in describe(self.placement).items()] if self.placement else []

    @property
    def bounds(self) -> list[str] | None:
        """None: the playbook bounds nothing; [] within bounds."""
        return self.judged.get("bounds")

    @property
    def failed_here(self) -> list[str]:
        """Every problem the plan found, each under what judged it: what makes `plan` exit 1."""
        return [f"{label}: FAIL — {'; '.join(problems)}" for label, problems in self.judged.items() if problems]

    def document(self) -> dict[str, Any]:
        """The plan as `plan --json` prints it."""
        return {"host": self.host_name, "repo": self.repo, "head": self.head,
                "files": [{"dest": f.dest, "insertions": f.stat.insertions, "deletions": f.stat.deletions,
                           "new": not f.exists, "diff": f.diff} for f in self.files],
                "stat": self.stat.summary(), "already_applied": self.already_applied,
                "restarts_with_unit": self.restarts_with, "bounds": self.bounds,
                "compile": self.judged.get("compile"),
                "dirty": self.dirty, "placement": self.placement, "lock": self.lock.info if self.lock else None,
                "sent_whole": {"yes": self.unsent is None, "why_not": self.unsent},
                "steps": [{"name": n, "actions": [a.describe() for a in acts],
                           "commands": [a.command() for a in acts if a.kind == Kind.run],
                           "brief": [{"line": b.text, "actions": list(b.actions)} for b in briefly(acts)],
                           **({"not_run": self.not_run[n]} if n in self.not_run else {}),
                           **({"note": self.notes[n]} if n in self.notes else {})} for n, acts in self.steps]}


def masked(masker: Masker, actions: Sequence[Action]) -> list[Action]:
    """Actions as a plan shows them: secrets masked in everything they show or send."""
    return [action.mapped(masker) for action in actions]


def plan(ctx: Context, steps: Sequence[Step], *, allow_dirty: bool = False) -> PlanReport:
    """Preflight's reads, the projected diff, what the steps judge before the target is touched, each step's
    actions, and whether apply would send its chain up to the commit with the lock (run/whole.py)."""
    bus = ctx.bus
    bus.step = "preflight"
    head = preflight(ctx, allow_dirty=True)
    counts = diffs.numstats([(c.dest, head[c.dest], c.new) for c in ctx.changes])
    files = [FilePlan(c.dest, bus.masker(diffs.unified(c.dest, head[c.dest], c.new)), stat, c.old is not None)
             for c, stat in zip(ctx.changes, counts, strict=True)]
    stat = projected_stat(ctx, head, {f.dest: f.stat for f in files})
    applied = already_applied(ctx)  # as apply judges it: nothing to do, so nothing to judge
    judged = {} if applied else {judges(s): judge_here(s, ctx, lambda: stat) for s in steps if judges(s)}
    assert ctx.git_dir is not None and ctx.git_before is not None
    lock = read_state(ctx.transport, ctx.git_dir, ctx.host.lock_ttl_s, ctx.host_name)
    shown = [(s.name, masked(bus.masker, s.plan(ctx))) for s in steps]
    unsent = whole.unsent(ctx, list(steps), allow_dirty=allow_dirty) or whole.declined(ctx)
    notes = {s.name: note for s in steps if (note := plan_note(s, ctx, steps)) is not None}
    return PlanReport(ctx.host_name, ctx.repo, ctx.git_before, files, stat, judged, shown, lock,
                      list(ctx.facts.dirty), ctx.facts.placement, unsent, notes=notes, already_applied=applied)
