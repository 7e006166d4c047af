"""Undo a recorded run: back to its `git.before` by a new commit, restart, verify again.

The run log says what to undo; it is trusted only when it verifies and agrees with the target's
own history (the commit's trailers and parent), so an edited log cannot aim a rollback elsewhere.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from deployer import diffs, runlog
from deployer.agent.protocol import ExecResult
from deployer.errors import (
    ChecksFailed,
    ConfigError,
    ConnectError,
    DeployerError,
    Interrupted,
    RollbackFailed,
    StepFailed,
    TransportError,
    VerificationFailed,
)
from deployer.run import serving
from deployer.run.engine import VERIFY, Engine, RunResult
from deployer.run.lock import read_state
from deployer.run.mounts import refuse_if_recreated
from deployer.run.plan import FilePlan, PlanReport, masked
from deployer.run.revert_checks import NotRun, recorded_baseline
from deployer.run.standing import target_state
from deployer.runlog import Run, RunLogWriter, utc_now
from deployer.runstate import Phase
from deployer.steps.context import Context
from deployer.steps.git import SEAL_REF, EndNote, parse_seal, read_end_note
from deployer.steps.gitops import GIT_DIR, differ_argv, exists_argv, git, head, names, touched_by
from deployer.text import shown
from deployer.transport.base import Transport

STEP = "rollback-check"


@dataclass(frozen=True)
class Target:
    """What a run recorded that its rollback needs."""

    before: str
    after: str
    files: list[str]

    @classmethod
    def of(cls, run: Run) -> Target:
        """The run's record, from a log that verifies; exit 5 naming the problems otherwise."""
        problems = runlog.verify(run.dir.parent, run.run_id)
        if problems:
            raise VerificationFailed(f"the log of run {run.run_id} does not verify (deployer runs verify "
                                     f"{run.run_id}); refusing to act on it:\n  " + "\n  ".join(problems))
        git_, end = run.git, run.end or {}
        if not git_.get("after") or not git_.get("before"):
            raise ConfigError(f"run {run.run_id} made no commit (status {run.status}); there is nothing to roll "
                              "back. A run that failed before its commit restored the target itself.")
        return cls(str(git_["before"]), str(git_["after"]), [str(f) for f in end.get("files") or []])


@dataclass(frozen=True)
class Deploy:
    """One deploy in a target's history, as its commit and trailers name it."""
    commit: str
    date: str
    subject: str
    run_id: str
    rollback_of: str
    parent: str = ""
    log: str = ""  # the Deployer-Log trailer: sha256:<hex> of the run log when the commit was made


Runner = Callable[[Sequence[str]], ExecResult]
_FORMAT = ("%H%x1f%aI%x1f%s%x1f%(trailers:key=Deployer-Run,valueonly,separator=%x2C)"
           "%x1f%(trailers:key=Deployer-Rollback-Of,valueonly,separator=%x2C)%x1f%P"
           "%x1f%(trailers:key=Deployer-Log,valueonly,separator=%x2C)%x1e")


def _deploys(run: Runner, *selection: str) -> list[Deploy]:
    """Commits of HEAD's history that selection picks, with their deployer trailers."""
    result = run(git("log", f"--format={_FORMAT}", *selection, "HEAD", "--"))
    if not result.ok:
        raise ConfigError(f"git log failed on the target: {result.err.strip()}")
    deploys = []
    for record in filter(str.strip, result.out.split("\x1e")):
        commit, date, subject, run_id, rollback_of, parents, log = (part.strip() for part in record.split("\x1f"))
        deploys.append(Deploy(commit, date, subject, run_id, rollback_of, (parents.split() or [""])[0], log))
    return deploys


def list_deploys(transport: Transport, repo: str, limit: int = 50) -> list[Deploy]:
    """Commits on the target that carry a Deployer-Run trailer: works without the run directory."""
    return _deploys(lambda argv: transport.run(argv, cwd=repo, timeout=60), f"-n{limit}", "--grep=^Deployer-Run: ")


def _mentioning(ctx: Context, run_id: str) -> list[Deploy]:
    """Commits of HEAD's history whose message names the run (its trailers say how)."""
    return _deploys(lambda argv: ctx.run(argv, timeout=120), "--fixed-strings", f"--grep={run_id}")


def target_problems(ctx: Context, run: Run, notices: list[str] | None = None,
                    checked: list[str] | None = None) -> list[str]:
    """Where the run's log and the target's history disagree; empty when the history vouches for the log.

    The run's commits (trailer Deployer-Run) must anchor a beginning of this log (trailer Deployer-Log),
    and the commit the log names must be one of them, with the log's `before` as its parent and exactly
    the log's files; the note on the newest of them must vouch for the log's end, and its seal for every line
    through run_end (see end_problems: without them, `notices` says how far the log is anchored); the lines after
    run_end must name runs that acted on this one, and reverts of it that the history holds (link_problems).
    `checked` is told each thing the target vouched for."""
    data = (run.dir / runlog.EVENTS).read_bytes()
    vouched = checked if checked is not None else []
    mentioning = _mentioning(ctx, run.run_id)
    own = [d for d in mentioning if d.run_id == run.run_id]
    problems = link_problems(run, mentioning)
    for deploy in own:
        anchor = deploy.log.removeprefix("sha256:")
        if not deploy.log.startswith("sha256:") or (lines := runlog.anchored_lines(data, anchor)) is None:
            problems.append(f"commit {deploy.commit[:12]} on the target has Deployer-Log {deploy.log or '(none)'}, "
                            "which matches no beginning of this log: the log was rewritten after that commit")
        else:
            vouched.append(f"commit {deploy.commit[:12]}: its Deployer-Log matches the log's first {lines} lines")
    before, after = run.git.get("before"), run.git.get("after")
    if not after:
        if own:
            problems.append(f"the log records no commit, but the target's history has "
                            f"{', '.join(d.commit[:12] for d in own)} made by this run")
        else:
            vouched.append(f"no commit: the history of HEAD on {ctx.host_name} has none made by this run, as the log "
                           "says")
        return problems
    # A recover's log names the commit of the run it recovered (its own commits are only a revert's).
    owner = str(run.start.get("recover_of") or run.run_id)
    made = own if owner == run.run_id else [d for d in _mentioning(ctx, owner) if d.run_id == owner]
    found = next((d for d in made if d.commit == after), None)
    if found is None:
        return [*problems, f"the log's commit {str(after)[:12]} is not a commit of run {owner} in the history "
                           f"of HEAD on {ctx.host_name}"]
    if found.parent != before:
        problems.append(f"the log says the run started from {str(before)[:12]}, but its commit "
                        f"{found.commit[:12]} has parent {found.parent[:12]}")
    files = sorted(str(f) for f in (run.end or {}).get("files") or [])
    touched = touched_by(ctx, found.commit)
    if files != touched:
        problems.append(f"the log names the files {', '.join(files)}, but commit {found.commit[:12]} "
                        f"touched {', '.join(touched)}")
    elif found.parent == before:
        vouched.append(f"commit {found.commit[:12]} is the log's: parent {found.parent[:12]}, files "
                       f"{', '.join(files) or '(none)'}")
    if not own:  # a recover that kept the commit made none itself, and writes no end note (see lease.end_note)
        return problems
    return problems + end_problems(ctx, run, own[0].commit, data, notices, vouched)


def end_problems(ctx: Context, run: Run, newest: str, data: bytes, notices: list[str] | None = None,
                 checked: list[str] | None = None) -> list[str]:
    """The run's end against the note on its newest commit: the note holds the sha256 of the log when the
    release was sent and the end that release proves. Lines after run_end (rollback and recover links) are
    not the note's: they are vouched for by the runs they name."""
    end = run.end or {}
    raw = read_end_note(ctx, newest)
    if raw is None:
        if end.get("anchor") == "notes":
            return [f"commit {newest[:12]} on the target has no end note (refs/notes/deployer), but the log says "
                    "its run wrote one: the note was removed, or the log was moved to another run"]
        if notices is not None:
            notices.append(f"the end of run {run.run_id}'s log is not anchored on the target (no note on its "
                           f"commit {newest[:12]}: a run from before end notes, or one cut before its release); its "
                           "log is checked against the target up to that commit only")
        return []
    note = EndNote.parse(raw)
    if note is None:
        return [f"the end note on commit {newest[:12]} is not deployer's: {shown(raw)}"]
    end_line = next((i for i, event in enumerate(run.events) if event.get("type") == "run_end"), None)
    covered = runlog.anchored_lines(data, note.log_sha256)
    claimed = (note.status, note.exit_code, note.phase)
    if covered is None or end_line is None or covered > end_line or \
            claimed != (end.get("status"), end.get("exit_code"), str(end.get("phase"))):
        return [f"the end note on commit {newest[:12]} says run {run.run_id} ended {note.status} (exit "
                f"{note.exit_code}, phase {note.phase}) with its log at sha256:{note.log_sha256}, but this log "
                f"ends {end.get('status')} (exit {end.get('exit_code')}, phase {end.get('phase')})"
                f"{'' if covered is not None else ' and has no such beginning'}: the log was rewritten after "
                "the run's release"]
    # The note was sent before the run's last lines existed (right behind its commit, when that was its last step);
    # the seal, sent once its run_end was written, covers every line up to it.
    vouched = checked if checked is not None else []
    vouched.append(f"the end note on {newest[:12]}: the run ended {note.status} (exit {note.exit_code}, phase "
                   f"{note.phase}), its log's first {covered} lines as they are")
    sealed = read_end_note(ctx, newest, SEAL_REF)
    if sealed is None:
        if notices is not None:
            notices.append(f"run {run.run_id}'s log is anchored on the target up to line {covered} only (its end "
                           f"note): commit {newest[:12]} has no seal (refs/notes/{SEAL_REF}), as a run from before "
                           "seals, or one whose connection went before its agent wrote it, has none")
        return []
    sha256 = parse_seal(sealed)
    if sha256 is None:
        return [f"the seal on commit {newest[:12]} is not deployer's: {shown(sealed)}"]
    if runlog.anchored_lines(data, sha256) != end_line + 1:
        return [f"the seal on commit {newest[:12]} names the log through its run_end as sha256:{sha256}, but this "
                f"log's first {end_line + 1} lines hash otherwise: the log was rewritten after its end (a line "
                "before its run_end edited, inserted or removed)"]
    vouched.append(f"the seal on {newest[:12]}: every line through the run_end (line {end_line + 1}) as it is")
    return []


def link_problems(run: Run, mentioning: list[Deploy]) -> list[str]:
    """The lines after run_end (rolled_back_by, recovered_by) are written after the run's seal: each must name a
    run of this runs dir that acted on this one, and the revert it names must be a revert of this run in HEAD's
    history (a rolled_back_by's made by the run it names; a successful one without its own, some revert)."""
    reverts = {d.commit: d.run_id for d in mentioning if d.rollback_of == run.run_id}
    end_line = next((i for i, event in enumerate(run.events) if event.get("type") == "run_end"), len(run.events))
    problems = []
    for number, event in enumerate(run.events[end_line + 1:], end_line + 2):
        kind, by = event.get("type"), str(event.get("by"))
        if kind not in ("rolled_back_by", "recovered_by"):
            continue
        try:
            start = runlog.read_run(run.dir.parent, by).start if runlog.is_run_id(by) else {}
        except ConfigError:
            start = {}
        if run.run_id not in (start.get("rollback_of"), start.get("recover_of")):
            problems.append(f"line {number}: {kind} names run {by!a}, which is no run of this runs dir that acted "
                            "on this one")
        revert = event.get("commit") if kind == "rolled_back_by" else event.get("rollback_commit")
        maker = reverts.get(str(revert)) if revert is not None else None
        if revert is not None and (maker is None or (kind == "rolled_back_by" and maker != by)):
            problems.append(f"line {number}: {kind} names the revert {str(revert)[:12]}, which is not a revert of "
                            f"this run{f' by run {by}' if kind == 'rolled_back_by' else ''} in the history of HEAD")
        elif revert is None and kind == "rolled_back_by" and event.get("status") == "successful" and not reverts:
            problems.append(f"line {number}: rolled_back_by says run {by} rolled this run back, but the history of "
                            "HEAD holds no revert of it")
    return problems


def check_recorded(ctx: Context, run: Run, target: Target) -> None:
    """The run's commit is in HEAD's history, the history vouches for the log, and it was not undone already."""
    if not ctx.run(exists_argv(f"{target.after}^{{commit}}"), timeout=30).ok or \
            not ctx.run(git("merge-base", "--is-ancestor", target.after, "HEAD"), timeout=30).ok:
        raise StepFailed(STEP, f"commit {target.after[:12]} is not in the history of {ctx.repo} on "
                         f"{ctx.host_name}; it was never deployed there, or the history was rewritten")
    problems = target_problems(ctx, run)
    if problems:
        raise VerificationFailed(f"the log of run {run.run_id} does not match the target's history; refusing "
                                 "to roll back from it:\n  " + "\n  ".join(problems))
    refuse_if_rolled_back(ctx, run)


def refuse_if_rolled_back(ctx: Context, run: Run) -> None:
    """A rollback the log claims counts only when its revert commit is in the target's history."""
    # A rollback whose checks of the reverted build failed still ended rolled_back: its revert stands.
    claimed = {str(link.get("by")) for link in run.all("rolled_back_by")
               if link.get("status") == "successful" or link.get("phase") == Phase.rolled_back.value}
    own_revert = ((run.end or {}).get("facts") or {}).get("rollback_commit") if run.status != "successful" else None
    # A recover that finished the run's rollback names the revert (the cut run's own, or one it made); recover
    # links itself to the run only when it succeeded.
    recovered = {str(link["rollback_commit"]): str(link.get("by")) for link in run.all("recovered_by")
                 if link.get("rollback_commit")}
    for deploy in _mentioning(ctx, run.run_id):
        if deploy.rollback_of != run.run_id:
            continue
        if deploy.run_id == run.run_id and deploy.commit == own_revert:
            raise ConfigError(f"run {run.run_id} was already rolled back by its own on_failure "
                              f"(commit {deploy.commit[:12]})")
        if deploy.run_id in claimed:
            raise ConfigError(f"run {run.run_id} was already rolled back by run {deploy.run_id} "
                              f"(commit {deploy.commit[:12]})")
        if deploy.commit in recovered:
            raise ConfigError(f"run {run.run_id} was already rolled back, finished by deployer recover "
                              f"(run {recovered[deploy.commit]}, commit {deploy.commit[:12]})")


def check(ctx: Context, target: Target, *, force: bool) -> None:
    """Refuse files changed since the run (unless forced); a partial earlier rollback is not a change."""
    files = target.files
    committed = _differ(ctx, target.after, "HEAD", files)
    if committed and already_reverted(ctx, target):
        return  # an earlier rollback of this run got as far as its commit: finish its restart and checks
    # In the work tree, a file that holds the run's content or the content before it is ours to replace.
    edited = set(_differ(ctx, target.after, None, files)) & set(_differ(ctx, target.before, None, files))
    changed = sorted(set(committed) | edited)
    if changed and not force:
        raise StepFailed(STEP, f"{', '.join(changed)} changed on the target since run's commit "
                         f"{target.after[:12]} (later commits or local edits); rolling back would discard "
                         "them. Check with git log there, or pass --force")


def _differ(ctx: Context, commit: str, other: str | None, files: list[str]) -> list[str]:
    """The files that differ between commit and other (None: the work tree)."""
    return names(ctx.check(differ_argv(commit, other, files), "cannot compare the run's files", timeout=30).out)


def already_reverted(ctx: Context, target: Target) -> bool:
    """The run's files already hold their content from before the run (work tree and HEAD)."""
    return not _differ(ctx, target.before, None, target.files) and \
        not _differ(ctx, target.before, "HEAD", target.files)


def refuse(ctx: Context, run: Run, target: Target, *, force: bool) -> None:
    """A rollback of run refused before it changes anything: the target recreated, its log or history not
    vouching, already rolled back, or the files changed since (unless forced)."""
    refuse_if_recreated(ctx, run)  # a container target recreated since the run lost its writable layer
    check_recorded(ctx, run, target)
    check(ctx, target, force=force)
    ctx.facts.files = target.files


def finish(engine: Engine, ctx: Context, run: Run, target: Target,
           keep: Mapping[str, tuple[int, str]] | None = None) -> str:
    """The rollback of run to its end, once refuse() let it through: the revert commit (unless an earlier
    rollback already made it) and the checks that prove it. Used by `rollback`, and by `recover` of a rollback
    that was cut (`keep`: the services an earlier attempt, cut or stopped, had started on its revert)."""
    with ctx.cancel.finishing_first("the rollback") as ctx.cancel:
        return engine.revert(ctx, before=target.before, dests=target.files, rollback_of=run.run_id,
                             verify=VERIFY, baseline=recorded_baseline(run), keep=keep)


def rollback(engine: Engine, run: Run, *, force: bool) -> RunResult:
    """Revert the run's commit, restart, and prove the revert (run/revert_checks.py)."""
    target = Target.of(run)

    def body(ctx: Context, log: RunLogWriter) -> None:
        ctx.git_before = head(ctx)
        refuse(ctx, run, target, force=force)
        assert ctx.record is not None
        ctx.record.advance(Phase.rolling_back, utc_now(), git_before=ctx.git_before)
        try:
            revert = finish(engine, ctx, run, target, keep=serving.started_by(stopped_attempt(run), True))
        except ChecksFailed as exc:  # the revert stands: the run ends rolled_back, naming the check
            ctx.git_after = exc.commit if exc.commit != ctx.git_before else None
            raise
        except DeployerError as exc:
            raise RollbackFailed(f"{exc}\n{target_state(ctx)}\n{finish_hint(exc, run.run_id)}") from None
        # When an earlier attempt already made the revert commit, this run made none of its own.
        ctx.git_after = revert if revert != ctx.git_before else None

    result = engine.execute(body, rollback_of=run.run_id)
    link_rollback(run, result.run_id, result.status, result.phase, result.git_after)
    return result


def stopped_attempt(run: Run) -> Run | None:
    """The newest rollback of run, where it stopped before its end (a stop, a lost link, a failed check) and this
    machine has its log: the services it brought up on the revert still serve it, unless someone changed them
    since (the keep checks each is still that process, and healthy). None after a successful one: there is no
    rollback left to finish."""
    links = run.all("rolled_back_by")
    by = links[-1].get("by") if links else None
    if not isinstance(by, str) or not runlog.is_run_id(by) or links[-1].get("status") == "successful":
        return None
    attempt = serving.logged(run.dir.parent, by)
    # Both logs are input: the attempt must say it rolled this very run back.
    return attempt if attempt is not None and attempt.start.get("rollback_of") == run.run_id else None


def finish_hint(failure: DeployerError, run_id: str) -> str:
    """What to do about a rollback that stopped half way: again as it is only when what stopped it passes (a lost
    link, a stop); a failure that would repeat needs a person first."""
    again = f"deployer rollback {run_id}"
    if isinstance(failure, Interrupted):
        return f"It was stopped before its end; finish it with: {again}"
    if isinstance(failure, TransportError | ConnectError):
        return f"Once the target answers again, finish it with: {again}"
    return f"Fix what failed above on the target first (a rollback again would fail the same way), then: {again}"


def link_rollback(run: Run, by: str, status: str, phase: str | None, commit: str | None) -> None:
    """The rolled-back run's own log points at the rollback that undid it (the rollback's points back)."""
    link = RunLogWriter.reopen(run.dir.parent, run.run_id)
    try:
        link.write({"type": "rolled_back_by", "by": by, "status": status, "phase": phase, "commit": commit})
    finally:
        link.close()


def verify_on_target(engine: Engine, run: Run, checked: list[str] | None = None) -> list[str]:
    """`runs verify --target`: where the run's log and the target's history disagree (`checked`: told what the
    target vouched for)."""
    bus = engine.new_bus()
    with engine.connect(bus) as transport:
        ctx = engine.context("<verify>", bus, transport)
        notices: list[str] = []
        problems = target_problems(ctx, run, notices, checked)
    for notice in notices:
        bus.emit("end_unanchored", message=notice)
    return problems


def plan(engine: Engine, run: Run) -> PlanReport:
    """What the rollback would change and run, read from the target without changing it: the revert's
    actions from the walk the rollback makes (its reads done, its changes listed), then the actions of the
    steps it runs again, under the step names its run log records them by."""
    target = Target.of(run)
    bus = engine.new_bus()
    with engine.connect(bus) as transport:
        ctx = engine.context("<dry-run>", bus, transport)
        refuse_if_recreated(ctx, run)
        check_recorded(ctx, run, target)
        files = [_file_plan(transport, engine.host.repo, target, dest) for dest in target.files]
        now = ctx.git_before = head(ctx)
        git_dir = ctx.run(GIT_DIR, timeout=30).out.strip()
        lock = read_state(transport, git_dir, engine.host.lock_ttl_s, engine.host_name) if git_dir else None
        ctx.git_dir = git_dir or None
        bus.step = "rollback"
        steps = [("rollback", masked(bus.masker, engine.reverting(target.before, target.files, run.run_id).plan(ctx)))]
        checks = engine.checks_after_revert(VERIFY, recorded_baseline(run))
        steps += [(f"rollback:{s.name}", [] if isinstance(s, NotRun) else masked(bus.masker, s.plan(ctx)))
                  for s in checks]
    stat = diffs.DiffStat(tuple(f.stat for f in files))
    return PlanReport(engine.host_name, engine.host.repo, now, files, stat, {}, steps, lock,
                      not_run={f"rollback:{s.name}": s.why for s in checks if isinstance(s, NotRun)},
                      rollback_of=run.run_id)


def _file_plan(transport: Transport, repo: str, target: Target, dest: str) -> FilePlan:
    current = transport.get(posixpath.join(repo, dest))
    shown = transport.run(git("cat-file", "blob", f"{target.before}:{dest}"), cwd=repo, timeout=30, capture=None)
    wanted = shown.stdout if shown.ok else None
    if wanted is None:
        return FilePlan(dest, f"--- a/{dest}\n+++ /dev/null\n(removed: absent before the run)\n",
                        diffs.FileStat(dest, 0, len((current or b"").splitlines())), current is not None)
    return FilePlan(dest, diffs.unified(dest, current, wanted), diffs.numstat(dest, current, wanted),
                    current is not None)
