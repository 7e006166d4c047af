"""Undo on failure: before the commit, the target's files get their pre-run bytes back (restore); after it,
on_failure decides between a revert commit (rollback) and saying exactly what stays on the target.

The revert is built as actions in one place, `Revert`: the rollback runs them and `plan --rollback` shows
them, so the preview is exact by construction."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from deployer.agent.protocol import ExecResult
from deployer.errors import ChecksFailed, DeployerError, Interrupted, RollbackFailed, VerificationFailed
from deployer.run.ending import Ending
from deployer.run.lease import run_trailer
from deployer.run.restore import restore_files
from deployer.runlog import utc_now
from deployer.runstate import Phase
from deployer.steps import services
from deployer.steps.action import Bound
from deployer.steps.base import Action
from deployer.steps.cancel import CancelToken
from deployer.steps.context import NOTHING, Context
from deployer.steps.git import LOG_SHA256, RUN_ID, commit_actions, commit_staged, owner_and_mode_kept, trailers
from deployer.steps.gitops import HEAD, differ_argv, exists_argv, git, names


def target_state(ctx: Context) -> str:
    """Where the target stands now, read from it, for a message that must say what was left."""
    try:
        head = ctx.run(HEAD, timeout=30).out.strip() or "unknown"
        notes = {ctx.git_before: "the commit before the run", ctx.git_after: "this run's commit",
                 ctx.facts.rollback_commit: "the revert commit"}
        parts = [f"Target now: HEAD {head[:12]} ({notes.get(head, 'not made by this run')})"]
        for name in ctx.host.services:
            pid = services.manager_for(ctx, name).pid()
            parts.append(f"{name} {'pid ' + str(pid) if pid else 'not running'}")
    except DeployerError as exc:
        return f"The target's state could not be read: {exc}"
    return ", ".join(parts) + "."


def kill_running(ctx: Context) -> int:
    """Kill what still runs on the target; how many (0 when the link is gone: the undo itself then fails, with
    its message). Safe from any thread: it records nothing (a forced stop held back during an undo kills from
    a thread of its own, and the run log is the main thread's; the killed commands' own results say so)."""
    with contextlib.suppress(DeployerError):
        return ctx.transport.cancel()
    return 0


def stop_running(ctx: Context) -> None:
    """A step stopped by a second signal may have left its command running on the target: kill it, so the
    undo that follows is not queued behind it."""
    if killed := kill_running(ctx):
        ctx.emit("commands_killed", count=killed)


def restore(ctx: Context, failure: DeployerError, ending: Ending) -> None:
    """Before the commit, after failure: every dest back to its pre-run bytes, owner and mode (from the run
    dir). A restore that fails too says so after the failure that started it."""
    record = ending.record
    if record.state.phase in (Phase.preparing, Phase.locked):
        ending.end(Phase.failed_restored)
        return
    ctx.bus.step = "restore"
    assert ctx.git_before is not None
    with ctx.cancel.undoing():  # a forced stop (a second signal) lets it finish
        stop_running(ctx)
        try:
            done = restore_files(ctx, record.state.files, ctx.git_before, run_trailer(ctx.run_id), record)
        except DeployerError as exc:
            record.advance(Phase.interrupted, utc_now(), error=str(exc))
            raise RollbackFailed(f"{failure}\nThe restore after it failed: {exc}") from None
    ctx.emit("restore", restored=done.restored, removed=done.removed, temps=done.temps,
             undid_commit=done.undid_commit, head=ctx.git_before)
    ctx.facts.restored = done.restored + done.removed
    ending.end(Phase.failed_restored)


def after_commit_failure(ctx: Context, failure: DeployerError, ending: Ending, *, rollback: bool,
                         revert: Callable[[Context], str], restarts: bool) -> DeployerError:
    """Past the commit: roll back (on_failure: rollback) or say exactly what stays on the target."""
    kind = Interrupted if isinstance(failure, Interrupted) else VerificationFailed
    record = ending.record
    if not rollback:
        ending.end(Phase.failed_committed, error=str(failure))
        return kind(f"{failure}\nThe commit {ctx.git_after} stays on the target (on_failure: restore only "
                    f"undoes failures before the commit). {target_state(ctx)}\n"
                    f"To undo it: deployer rollback {ctx.run_id}")
    # The rollback must finish even when a signal caused it; a second signal still forces a stop.
    ctx.cancel = CancelToken()
    stop_running(ctx)
    record.advance(Phase.rolling_back, utc_now(), error=str(failure))
    try:
        made = revert(ctx)
    except ChecksFailed as exc:  # the revert stands; the reverted build failed a check of its own
        ending.end(Phase.rolled_back, rollback_commit=exc.commit, checks_failed=exc.checks)
        return kind(f"{failure}\nRolled back: commit {str(exc.commit)[:12]} restores {', '.join(ctx.dests)} to "
                    f"{str(ctx.git_before)[:12]}, but {exc}")
    except DeployerError as exc:
        record.advance(Phase.interrupted, utc_now())
        return RollbackFailed(f"{failure}\nThe rollback failed too: {exc}\n{target_state(ctx)}\n"
                              f"Finish it with: deployer recover {ctx.run_id} --rollback")
    ending.end(Phase.rolled_back, rollback_commit=made)
    restarted = "; services restarted" if restarts else ""
    return kind(f"{failure}\nRolled back: commit {made[:12]} restores "
                f"{', '.join(ctx.dests)} to {str(ctx.git_before)[:12]}{restarted}")


@dataclass(frozen=True)
class Revert:
    """A new commit that gives dests their content at `before` (removing those absent there), as actions.

    Safe to repeat after any partial attempt: only files whose HEAD content differs from `before` are
    touched, and when there are none (an interrupted rollback got that far) HEAD is returned as it is.
    A rollback must be able to finish, so the target's commit hooks never run here."""

    before: str
    dests: tuple[str, ...]
    message: str  # with the placeholders only the run fills: its id and the sha256 of its log so far

    @classmethod
    def of(cls, name: str, before: str, dests: list[str], rollback_of: str) -> Revert:
        anchors = trailers(Deployer_Run=RUN_ID, Deployer_Rollback_Of=rollback_of, Deployer_Log=f"sha256:{LOG_SHA256}")
        return cls(before, tuple(dests), f"Roll back {name} (run {rollback_of})\n\n{anchors}\n")

    def run(self, ctx: Context, bound: Bound, timeout: float = 60.0) -> str:
        """Make the revert commit (or find it made); returns it."""
        return self._walk(ctx, bound, timeout, None)

    def plan(self, ctx: Context) -> list[Action]:
        """What run() would do, from the same walk: its reads run (they decide the rest), its changes are listed."""
        shown: list[Action] = []
        self._walk(ctx, NOTHING, 60.0, shown)
        return shown

    def _walk(self, ctx: Context, bound: Bound, timeout: float, shown: list[Action] | None) -> str:
        repo = ctx.repo

        def read(action: Action) -> ExecResult:
            if shown is not None:
                shown.append(action)
            result: ExecResult = ctx.act(action, timeout=timeout)
            return result
        todo = names(read(Action.run("compare", "the run's files whose HEAD content differs from the start",
                                     differ_argv(self.before, "HEAD", self.dests), repo,
                                     failure="cannot compare HEAD with the run's starting commit")).out)
        if not todo:
            return read(Action.run("head", "nothing to revert: read HEAD", HEAD, repo,
                                   failure="cannot read HEAD")).out.strip()
        existed = [d for d in todo if read(Action.run(f"existed {d}", f"whether {d} existed at the start",
                                                      exists_argv(f"{self.before}:{d}"), repo)).ok]
        absent = [d for d in todo if d not in existed]
        checkout = Action.run("checkout", "give the files their content at the start (owner and mode kept)",
                              git("checkout", self.before, "--", *existed), repo,
                              failure="cannot restore the files from git") if existed else None
        # --ignore-unmatch: an earlier attempt may have removed them already
        remove = Action.run("remove", "remove the files the run added",
                            git("rm", "-q", "-f", "--ignore-unmatch", "--", *absent), repo,
                            failure="cannot remove the run's new files") if absent else None
        if shown is not None:
            shown += [a for a in (checkout, remove) if a is not None]
            shown += commit_actions(ctx, todo, self.message)
            return ""
        if checkout is not None:
            with owner_and_mode_kept(ctx, existed, timeout):
                ctx.act(checkout, timeout=timeout)
        if remove is not None:
            ctx.act(remove, timeout=timeout)
        return commit_staged(ctx, todo, self.message, timeout, bound=bound)
