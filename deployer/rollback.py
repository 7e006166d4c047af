"""Undo a recorded run: back to its `git.before` by a new commit, restart, verify again."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from deployer import diffs
from deployer.context import CancelToken, Context
from deployer.engine import Engine, FilePlan, PlanReport, RunResult, target_state
from deployer.errors import ConfigError, DeployerError, RollbackFailed, StepFailed
from deployer.lock import read_state
from deployer.run.state import Phase
from deployer.runlog import Run, RunLogWriter, utc_now
from deployer.steps.base import Action, Effect
from deployer.transport.base import Transport

# The old build must not face the storm that proved the fix: restarts and metric checks only.
VERIFY = (Effect.restarts, Effect.verifies)
STEP = "rollback-check"


@dataclass(frozen=True)
class Target:
    """What a run recorded that its rollback needs."""

    before: str
    after: str
    files: list[str]

    @classmethod
    def of(cls, run: Run) -> Target:
        git, end = run.git, run.end or {}
        recovered = [link for link in run.all("recovered_by") if link.get("commit")]
        if recovered and not git.get("after"):  # cut while committing; recover found the commit
            git = {**git, "after": recovered[-1]["commit"]}
        if not git.get("after") or not git.get("before"):
            raise ConfigError(f"run {run.run_id} made no commit (status {run.status}); there is nothing to roll "
                              "back. A run that failed before its commit restored the target itself.")
        if run.status != "successful" and (end.get("facts") or {}).get("rollback_commit"):
            raise ConfigError(f"run {run.run_id} was already rolled back by its own on_failure "
                              f"(commit {end['facts']['rollback_commit'][:12]})")
        done = [link for link in run.all("rolled_back_by") if link.get("status") == "successful"]
        if done:
            raise ConfigError(f"run {run.run_id} was already rolled back by run {done[-1].get('by')} "
                              f"(commit {str(done[-1].get('commit'))[:12]})")
        return cls(str(git["before"]), str(git["after"]), [str(f) for f in end.get("files") or []])


def check(ctx: Context, target: Target, *, force: bool) -> None:
    """Refuse a commit the target does not have, or files changed since the run (unless forced)."""
    if not ctx.run(("git", "cat-file", "-e", f"{target.after}^{{commit}}"), timeout=30).ok or \
            not ctx.run(("git", "merge-base", "--is-ancestor", target.after, "HEAD"), timeout=30).ok:
        raise StepFailed(STEP, f"commit {target.after[:12]} is not in the history of {ctx.repo} on "
                         f"{ctx.host_name}; it was never deployed there, or the history was rewritten")
    changed = ctx.run(("git", "diff", "--name-only", target.after, "--", *target.files), timeout=30).out.split()
    if changed and already_reverted(ctx, target):
        return  # an earlier rollback of this run got as far as its commit: finish its restart and checks
    if changed and not force:
        raise StepFailed(STEP, f"{', '.join(changed)} changed on the target since run's commit "
                         f"{target.after[:12]} (later commits or local edits); rolling back would discard "
                         "them. Check with git log there, or pass --force")


def already_reverted(ctx: Context, target: Target) -> bool:
    """The run's files already hold their content from before the run (work tree and HEAD)."""
    return ctx.run(("git", "diff", "--quiet", target.before, "--", *target.files), timeout=30).ok and \
        ctx.run(("git", "diff", "--quiet", target.before, "HEAD", "--", *target.files), timeout=30).ok


def rollback(engine: Engine, run: Run, *, force: bool) -> RunResult:
    target = Target.of(run)

    def body(ctx: Context, log: RunLogWriter) -> None:
        ctx.git_before = ctx.check(("git", "rev-parse", "HEAD"), "cannot read HEAD", timeout=30).out.strip()
        check(ctx, target, force=force)
        ctx.facts["files"] = target.files
        # From here the rollback must finish: the first signal no longer stops it (a second forces).
        ctx.cancel = CancelToken()
        assert ctx.record is not None
        ctx.record.advance(Phase.rolling_back, utc_now(), git_before=ctx.git_before)
        try:
            ctx.git_after = engine.revert(ctx, before=target.before, dests=target.files,
                                          rollback_of=run.run_id, verify=VERIFY)
        except DeployerError as exc:
            raise RollbackFailed(f"{exc}\n{target_state(ctx)}\nRun the rollback again to finish it: "
                                 f"deployer rollback {run.run_id}") from None

    result = engine.execute(body, rollback_of=run.run_id)
    link = RunLogWriter.reopen(run.dir.parent, run.run_id)
    try:
        link.write({"type": "rolled_back_by", "by": result.run_id, "status": result.status,
                    "commit": result.git_after})
    finally:
        link.close()
    return result


def plan(engine: Engine, run: Run) -> PlanReport:
    """What the rollback would change, read from the target without changing it."""
    target = Target.of(run)
    with engine.connect(engine.new_bus()) as transport:
        files = [_file_plan(transport, engine.host.repo, target, dest) for dest in target.files]
        head = transport.run(("git", "rev-parse", "HEAD"), cwd=engine.host.repo, timeout=30).out.strip()
        git_dir = transport.run(("git", "rev-parse", "--absolute-git-dir"), cwd=engine.host.repo,
                                timeout=30).out.strip()
        lock = read_state(transport, git_dir, engine.host.lock_ttl_s) if git_dir else None
    stat = diffs.DiffStat(tuple(f.stat for f in files))
    steps = [("rollback", [Action(f"commit {', '.join(target.files)} as of {target.before[:12]} with trailers "
                                  f"Deployer-Run and Deployer-Rollback-Of: {run.run_id}")])]
    steps += [(s.name, [Action(f"again after the revert: {s.kind}")]) for s in engine.steps if s.effect in VERIFY]
    return PlanReport(engine.host_name, engine.host.repo, head, files, stat, None, steps, lock)


def _file_plan(transport: Transport, repo: str, target: Target, dest: str) -> FilePlan:
    current = transport.get(posixpath.join(repo, dest))
    shown = transport.run(("git", "show", f"{target.before}:{dest}"), cwd=repo, timeout=30, capture=None)
    wanted = shown.stdout if shown.ok else None
    if wanted is None:
        return FilePlan(dest, f"--- a/{dest}\n+++ /dev/null\n(removed: absent before the run)\n",
                        diffs.FileStat(dest, 0, len((current or b"").splitlines())), current is not None)
    return FilePlan(dest, diffs.unified(dest, current, wanted), diffs.numstat(dest, current, wanted),
                    current is not None)


@dataclass(frozen=True)
class Deploy:
    commit: str
    date: str
    subject: str
    run_id: str
    rollback_of: str


def list_deploys(transport: Transport, repo: str, limit: int = 50) -> list[Deploy]:
    """Commits on the target that carry a Deployer-Run trailer: works without the run directory."""
    fmt = ("%H%x1f%aI%x1f%s%x1f%(trailers:key=Deployer-Run,valueonly,separator=%x2C)"
           "%x1f%(trailers:key=Deployer-Rollback-Of,valueonly,separator=%x2C)%x1e")
    result = transport.run(("git", "log", f"-n{limit}", "--grep=^Deployer-Run: ", f"--format={fmt}"),
                           cwd=repo, timeout=60)
    if not result.ok:
        raise ConfigError(f"git log failed in {repo}: {result.err.strip()}")
    deploys = []
    for record in filter(str.strip, result.out.split("\x1e")):
        commit, date, subject, run_id, rollback_of = (part.strip() for part in record.split("\x1f"))
        deploys.append(Deploy(commit, date, subject, run_id, rollback_of))
    return deploys
