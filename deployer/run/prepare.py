"""What an apply does before its first step: preflight, the judgments made here, the pre-run bytes kept here.

A chain sent whole (run/whole.py) does the same once its premise held, less what the target decided for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from deployer import diffs
from deployer.agent.protocol import sha256_hex
from deployer.errors import StepFailed
from deployer.run.preflight import Reads, lazy_projection, preflight, refuse_unready
from deployer.run.whole import Whole
from deployer.runlog import RunLogWriter
from deployer.runstate import FileRecord, ensure_headroom, git_blob_id
from deployer.steps import optional
from deployer.steps.base import Step
from deployer.steps.context import Context


def before_steps(ctx: Context, log: RunLogWriter, steps: Sequence[Step], *, allow_dirty: bool, runs_dir: Path,
                 sent: Reads | None) -> None:
    """Preflight (on the reads sent with the lock, when they were), what the target lacks, what fails without
    it, and the pre-run bytes here: all before anything on the target changes."""
    head = preflight(ctx, allow_dirty=allow_dirty, sent=sent)
    refuse_unready(ctx, steps)
    ctx.projected = lazy_projection(ctx, head)
    ctx.facts.already_applied = already_applied(ctx)
    if not ctx.facts.already_applied:  # its diff is empty: a bounds check would fail a run with nothing to do
        judge_here(ctx, steps, ctx.projected)
    keep_here(ctx, log, runs_dir)


def already_applied(ctx: Context) -> bool:
    """Every dest holds its shipped bytes at HEAD (the fix's commit is there) and in the work tree: an apply
    would change nothing. A file that has them uncommitted still needs the commit."""
    unchanged = set(ctx.facts.unchanged)
    return bool(ctx.changes) and all(c.dest in unchanged and c.old == c.new for c in ctx.changes)


def after_premise(ctx: Context, log: RunLogWriter, whole: Whole, runs_dir: Path, sent: Reads | None) -> None:
    """before_steps() for a chain sent whole, once its premise held: the target may hold its changes by now.
    Its local steps judged the shipped bytes before it was sent, every check before the commit is the target's
    own, and no step of it reads the target to judge the run; what preflight reads must be what it was built on."""
    preflight(ctx, allow_dirty=False, sent=sent)
    whole.check(ctx)
    keep_here(ctx, log, runs_dir, left="the run puts back what it sent (git's objects hold the pre-run bytes)")


def judge_here(ctx: Context, steps: Sequence[Step], projected: Callable[[], diffs.DiffStat]) -> None:
    """What can fail without the target fails before the run touches it (a baseline's storm included), in the
    playbook's own words: the first such step is named as the failed one."""
    for step in steps:
        if problems := optional.judge_here(step, ctx, projected):
            ctx.emit("judged_here", judged=optional.judges(step), of_step=step.name, problems=problems)
            failure = StepFailed(step.name, f"{'; '.join(problems)} (judged before the run touched the "
                                 "target: nothing on it was changed)")
            if step.where:
                failure.args = (f"{step.where}: {failure}",)
            raise failure


def keep_here(ctx: Context, log: RunLogWriter, runs_dir: Path, left: str = "nothing was changed") -> None:
    """The pre-run bytes, owner and mode of every dest, and the shipped diff, on disk here (before anything
    changes there, except in a chain sent whole: its premise's intent record and git's objects have them)."""
    record = ctx.record
    assert record is not None
    ensure_headroom(runs_dir, sum(len(c.new) + len(c.old or b"") for c in ctx.changes), left)
    files = [FileRecord(
        dest=change.dest, path=change.path, existed=change.old is not None, tracked=change.tracked,
        sha256=None if change.old is None else sha256_hex(change.old), new_sha256=sha256_hex(change.new),
        new_blob=git_blob_id(change.new), mode=change.mode, uid=change.uid, gid=change.gid,
        new_dirs=change.new_dirs, before=None if change.old is None else record.keep_before(index, change.old))
        for index, change in enumerate(ctx.changes)]
    record.update(files=files, git_before=ctx.git_before, git_dir=ctx.git_dir)
    log.attach("shipped.diff", ctx.bus.masker("".join(
        diffs.unified(c.dest, c.old, c.new) for c in ctx.changes)).encode())
    ctx.bus.step = None
    ctx.emit("status", status="running")
