"""`deployer recover`: end a run that was cut (killed, disconnected, out of disk) in a consistent state.

It reads the run's record here (`state.json`, `before/`) and/or the intent record on the target, then the
target itself (HEAD and the run's trailer, the dests' bytes, temp files, the lock), and ends in one of:
- the run's commit exists: it is recorded as the run's `git.after` and kept (or, with --rollback, reverted
  by a new commit and the services restarted and verified again); a run cut in its own on_failure rollback
  had chosen to roll back, so that rollback is finished (its revert commit kept if it made one);
- no commit: every dest gets its pre-run bytes, owner and mode back, new files are removed.
Temp files are removed, the intent record and the lock released, and what it did is appended to the run's
log: its `run_end` if it never wrote one (a kill, a full disk), and a `recovered_by` line, so the log verifies
again whichever way the run ended. Run twice, the second finds nothing to do and changes nothing, its log
included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.errors import ChecksFailed, ConfigError, DeployerError, Interrupted, VerificationFailed
from deployer.run import intent, serving
from deployer.run import rollback as rollbacks
from deployer.run.engine import VERIFY, Engine, RunResult
from deployer.run.lock import read_state
from deployer.run.restart import restarted_services, whole_restart
from deployer.run.restore import parent_of_run_commit, remove_temps, restore_files, run_commits
from deployer.run.revert_checks import recorded_baseline
from deployer.run.shown import shown_state_of
from deployer.run.standing import left_down
from deployer.run.unended import recorded_owner
from deployer.run.vet import vetted
from deployer.runlog import EVENTS, Run, RunLogWriter, anchored_lines, is_run_id, read_run, utc_now
from deployer.runstate import PAST_COMMIT, FileRecord, Phase, RunRecord
from deployer.steps import gitops
from deployer.steps.base import Effect, Step
from deployer.steps.context import Context
from deployer.steps.git import EndNote, read_end_note
from deployer.steps.gitops import touched_by
from deployer.steps.optional import keeping

NOTHING = "nothing to recover (no intent record or lock of it on the target, its record and log ended)"


@dataclass
class Recovered:
    """What recover found and did, for the run's log and the person."""

    run_id: str
    outcome: Phase | None = None  # None: nothing was left to recover
    commit: str | None = None
    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    temps: list[str] = field(default_factory=list)
    rollback_commit: str | None = None
    dests: list[str] = field(default_factory=list)
    end_note: EndNote | None = None  # the cut run's end as its note on the target proves it (its log has none)
    lock_released: bool = False  # the cut run's lock, taken over from it
    kept: list[str] = field(default_factory=list)  # services already serving its commit, left running
    kept_on_revert: list[str] = field(default_factory=list)  # and those already serving its rollback's revert
    # service -> the earlier recover of it, stopped before its end, that started the process kept
    started_by_recover: dict[str, str] = field(default_factory=dict)
    unproven: str | None = None  # why the checks recover ran again do not prove the fix
    finish_failed: DeployerError | None = None  # its restart or checks failed again, and its playbook rolls back
    shown: str | None = None  # the state `runs list` shows for it once settled (`failed`: it had changed nothing)
    checks_failed: ChecksFailed | None = None  # its rollback's revert stands, but the reverted build failed these
    rollback_of: str | None = None  # the cut run was a rollback of this run, and recover finished it
    of_restart: bool = False  # the cut run was a `deployer restart`, and recover finished its restart

    def summary(self) -> str:
        if self.outcome is None:
            return f"run {self.run_id}: {NOTHING}"
        parts = [f"run {self.run_id} -> {self.shown or self.outcome.value}"]
        if self.rollback_of is not None and self.commit:  # the cut run was a rollback: its revert is the commit
            parts.append(f"its rollback of run {self.rollback_of} finished, its revert {self.commit[:12]} kept")
        elif self.commit:
            parts.append(f"its commit {self.commit[:12]} is on the target")
        if self.end_note is not None:
            parts.append(f"it ended {self.end_note.status} there, as its end note on the target says")
        if self.rollback_commit and self.rollback_of is None:
            parts.append(f"rolled back by {self.rollback_commit[:12]}")
        if self.restored:
            parts.append(f"restored {', '.join(self.restored)}")
        if self.removed:
            parts.append(f"removed {', '.join(self.removed)}")
        if self.temps:
            parts.append(f"removed temp files {', '.join(self.temps)}")
        if self.lock_released:
            parts.append("its lock was released")
        if theirs := [name for name in self.kept if name not in self.started_by_recover]:
            on = "restarted by it already" if self.of_restart else "already serving its commit"
            parts.append(f"kept {', '.join(theirs)} ({on})")
        parts.extend(f"kept {name} (started by recover {by}, which stopped before its end)"
                     for name, by in self.started_by_recover.items() if name in self.kept)
        if self.kept_on_revert:
            parts.append(f"kept {', '.join(self.kept_on_revert)} (already serving its revert)")
        if self.unproven:
            parts.append(f"unproven: {self.unproven}")
        return "; ".join(parts)


def unfinished_origin(runs_dir: Path, run_id: str) -> str | None:
    """The run a recover (run_id) was recovering, where that run is not settled yet (following a recover of a
    recover): what `recover run_id` must finish. None: run_id is no recover, or what it recovered is settled."""
    seen: set[str] = set()
    origin = None
    while run_id not in seen and (runs_dir / run_id / EVENTS).is_file():
        seen.add(run_id)
        of = read_run(runs_dir, run_id).start.get("recover_of")
        if not isinstance(of, str) or not is_run_id(of):
            break
        record = RunRecord.load(runs_dir / of)
        if record is None or record.state.terminal:
            break
        origin = run_id = of
    return origin


def pending_run(engine: Engine) -> str | None:
    """The run the host's intent record names, else the run whose lock was left (killed before its intent
    record); None when the target holds neither."""
    with engine.connect(engine.new_bus()) as transport:
        git_dir = gitops.git_dir(transport, engine.host.repo)
        pending = intent.read(transport, git_dir, engine.host_name)
        if pending is not None:
            return pending.run_id
        lock = read_state(transport, git_dir, engine.host.lock_ttl_s, engine.host_name)
    if lock is None:
        return None
    holder = lock.info.get("run_id")
    if not isinstance(holder, str) or not is_run_id(holder):
        raise DeployerError(f"the deploy lock {lock.path} on {engine.host_name} names no run deployer could "
                            f"recover ({holder!a}); see: deployer lock status --host {engine.host_name}")
    return holder


def recover(engine: Engine, run_id: str, *, rollback: bool) -> tuple[RunResult, Recovered]:
    """Recover run_id on the engine's host, as a run of its own (own log, own lock) that adopts the cut one's."""
    record = RunRecord.load(engine.runs_dir / run_id)
    found = Recovered(run_id)

    def adopted(event: dict[str, Any]) -> None:
        found.lock_released = found.lock_released or event.get("type") == "lock_adopted"
        if event.get("type") == "service_kept" and isinstance(event.get("service"), str):
            on_revert = str(event.get("step") or "").startswith("rollback")
            (found.kept_on_revert if on_revert else found.kept).append(event["service"])

    def body(ctx: Context, log: RunLogWriter) -> None:
        assert ctx.git_dir is not None
        pending = intent.read(ctx.transport, ctx.git_dir, engine.host_name)
        if pending is not None and pending.run_id != run_id:
            raise ConfigError(f"the target's intent record names run {pending.run_id}, not {run_id}: "
                              f"recover that one (deployer recover {pending.run_id} --host {engine.host_name})")
        # A run settled here with its commit whose log lacks its end (a full disk) still needs the commit the
        # target has: it goes the long way, and its log's end names it.
        settled = record is not None and record.state.terminal and (
            record.state.phase not in (Phase.succeeded, Phase.failed_committed) or
            ended(engine.runs_dir, run_id, record))
        if pending is None and record is not None and record.state.rollback_of and \
                record.state.phase == Phase.rolling_back:
            # A rollback cut after it had begun to change the target: finished as `deployer rollback` of the run
            # it undoes would finish it (its revert commit kept if it made one), under this run's lock.
            return end(ctx, _finish_rollback(engine, ctx, record.state.rollback_of, found))
        if record is not None and record.state.kind == "restart" and not settled and _cut_restarting(record):
            found.of_restart = True
            return end(ctx, _finish_restart(engine, ctx, record, found))
        if pending is None and (record is None or settled or not record.state.files):
            # Nothing of the run to undo on the target: cut before its first change (perhaps holding the lock,
            # now released), or settled already. Its record and log may still need their end.
            if found.lock_released or not ended(engine.runs_dir, run_id, record):
                found.outcome = _settle_original(record, Phase.failed_restored)
            # A cut inside the write of its intent record leaves that write's temp in the state dir.
            found.temps = remove_temps(ctx, [])
            ctx.emit("recovered", of_run=run_id, outcome=found.outcome and found.outcome.value,
                     lock_released=found.lock_released, temps=found.temps)
            return
        files, before, trailer = _what_to_undo(ctx, record, pending)
        found.dests = [f.dest for f in files]
        ctx.git_before = before
        commits = run_commits(ctx, before, trailer)
        if commits:
            found.commit = ctx.git_after = commit = commits[0]
            ctx.facts.files = found.dests  # the log names the kept commit and its files (runs verify --target)
            found.temps = remove_temps(ctx, files)
            # A run whose release went through behind its commit wrote its end note: it finished, though its
            # record and log here could not say so (a full disk, a link that froze before the answer).
            found.end_note = _proved_end(ctx, engine.runs_dir, run_id, record, commit)
            outcome = Phase.succeeded if found.end_note is not None else Phase.failed_committed
            cut_rolling_back = len(commits) > 1 or (record is not None and record.state.phase == Phase.rolling_back)
            if not (rollback or cut_rolling_back) and record is not None and _cut_restarting(record):
                outcome = _finish(engine, ctx, record, found)
            if rollback or cut_rolling_back or outcome == Phase.rolling_back:
                _settle_original(record, Phase.rolling_back, commit)
                dests = touched_by(ctx, commit, timeout=30)
                cut = serving.with_its_recovers(engine.runs_dir, run_id, but=ctx.run_id)
                try:
                    with ctx.cancel.finishing_first("the rollback") as ctx.cancel:
                        found.rollback_commit = engine.revert(
                            ctx, before=before, dests=dests, rollback_of=run_id, verify=VERIFY,
                            baseline=_baseline(cut[0] if cut else None), keep=serving.started_by(cut, True))
                except ChecksFailed as exc:  # the revert stands: the cut run ends rolled_back all the same
                    found.rollback_commit, found.checks_failed = exc.commit, exc
                outcome = Phase.rolled_back
        elif pending is None:
            # No intent record and no commit: the agent let none of the run's changes through, or the run undid
            # them before it cleared the record (its own record here could not say so: a full disk). The target
            # may have moved on since; restoring the run's pre-run bytes would undo someone else's work. Its temps
            # are deployer's own, and this holds the lock.
            found.temps = remove_temps(ctx, files)
            outcome = Phase.failed_restored
        else:
            done = restore_files(ctx, files, before, trailer, record)
            found.restored, found.removed, found.temps = done.restored, done.removed, done.temps
            outcome = Phase.failed_restored
        end(ctx, outcome)

    def end(ctx: Context, outcome: Phase) -> None:
        """The cut run's record and log settled in outcome, and this run's end said."""
        checks_failed = found.checks_failed.checks if found.checks_failed is not None else []
        found.outcome = _settle_original(record, outcome, found.commit, checks_failed=checks_failed)
        ctx.emit("recovered", of_run=run_id, outcome=found.outcome.value, commit=found.commit,
                 restored=found.restored, removed=found.removed, temps=found.temps,
                 rollback_commit=found.rollback_commit, lock_released=found.lock_released,
                 checks_failed=checks_failed)
        if found.checks_failed is not None:  # this run's record says so too: its revert stands
            assert ctx.record is not None
            ctx.record.advance(Phase.rolling_back, utc_now())
            raise found.checks_failed
        if found.finish_failed is not None:
            raise VerificationFailed(f"{found.finish_failed}\nrun {run_id}: its playbook says on_failure: rollback, so "
                                     f"recover rolled it back by {str(found.rollback_commit)[:12]} (rolled_back)")

    if rollback and record is not None and record.state.terminal and record.state.git_after and \
            record.state.phase != Phase.rolled_back and ended(engine.runs_dir, run_id, record):
        undo = f"To undo its commit {record.state.git_after[:12]}: deployer rollback {run_id}"
        if (by := rolled_back_by(engine.runs_dir, run_id)) is not None:  # its phase stays; its log links the undo
            undo = f"Its commit {record.state.git_after[:12]} was already rolled back by run {by}: nothing to undo"
        raise ConfigError(f"run {run_id} already ended ({record.state.phase.value}): recover has nothing of it to "
                          f"finish. {undo}")
    engine.adopt_lock_of = run_id
    engine.listeners.append(adopted)
    try:
        result = engine.execute(body, recover_of=run_id)
    finally:
        engine.listeners.remove(adopted)
    if found.outcome is not None:  # settled, even when the services it restarted stay down
        _link(engine.runs_dir, run_id, result, found)
        found.shown = shown_state_of(engine.runs_dir, run_id, found.outcome.value)
        _settle_cut_recovers(engine.runs_dir, run_id, result.run_id)
    if found.rollback_of is not None:  # the run it rolled back names it, as if it had ended by itself
        rollbacks.link_rollback(read_run(engine.runs_dir, found.rollback_of), run_id,
                                "failed" if found.checks_failed else "successful", Phase.rolled_back.value,
                                found.rollback_commit)
    if found.outcome is None and result.status == "canceled":  # stopped before it settled the cut run
        result.error = (f"{result.error}\nRun {run_id} is not finished: deployer recover {run_id} --host "
                        f"{engine.host_name} finishes it (keeping the services this recover brought up healthy)")
    return result, found


def _finish_rollback(engine: Engine, ctx: Context, of_run: str, found: Recovered) -> Phase:
    """The rollback of of_run to its end, for a rollback run that was cut; its record ends rolled_back, even
    when the reverted build fails a check (the revert stands)."""
    run = read_run(engine.runs_dir, of_run)
    ctx.git_before = gitops.head(ctx)
    revert: str | None
    try:
        target = rollbacks.Target.of(run)
        rollbacks.refuse(ctx, run, target, force=False)
        cut = serving.with_its_recovers(engine.runs_dir, found.run_id, but=ctx.run_id)
        revert = rollbacks.finish(engine, ctx, run, target, keep=serving.started_by(cut, True))
    except ChecksFailed as exc:
        revert, found.checks_failed = exc.commit, exc
    found.rollback_commit = found.commit = revert
    found.rollback_of = of_run
    return Phase.rolled_back


def _cut_restarting(record: RunRecord) -> bool:
    """The run was cut in its restart or its checks (a kill leaves the phase; a stop, interrupted after it)."""
    phases = [t.phase for t in record.state.history if t.phase != Phase.interrupted]
    return bool(phases) and phases[-1] in (Phase.restarting, Phase.verifying)


def _finish(engine: Engine, ctx: Context, record: RunRecord, found: Recovered) -> Phase:
    """What the cut run had left after its commit: its restart and checks, run again as the run would have,
    but for the services it had already brought up on its commit (kept: no second outage). A failure rolls the
    run back when its playbook says on_failure: rollback (rolling_back: the caller reverts). Otherwise services
    that stay down settle the run as failed_committed all the same (its commit kept, its intent record cleared, so
    `deployer restart` may run), and the failure names them with the command that tries again."""
    steps = engine.steps
    after = steps[next((i for i, s in enumerate(steps) if s.effect == Effect.commits), -1) + 1:]
    lineage = serving.with_its_recovers(engine.runs_dir, found.run_id, but=ctx.run_id)
    cut = lineage[0] if lineage else None
    if cut is not None:  # its drains judge the fix from the baseline the cut run read before its commit
        ctx.facts.baseline = {**recorded_baseline(cut), **ctx.facts.baseline}
    try:
        restarted = _again(engine, ctx, after, lineage, found)
    except DeployerError as failure:
        ctx.bus.step = None
        if isinstance(failure, Interrupted):
            raise
        if engine.playbook.model.on_failure == "rollback":
            found.finish_failed = failure
            return Phase.rolling_back
        found.outcome = _settle_original(record, Phase.failed_committed, found.commit)
        assert ctx.git_dir is not None
        intent.remove(ctx.transport, ctx.git_dir)()
        raise VerificationFailed(f"{failure}\nrun {found.run_id} keeps its commit {str(found.commit)[:12]} "
                                 f"(failed_committed; its playbook's on_failure is "
                                 f"{engine.playbook.model.on_failure}, so recover did not roll it back: deployer "
                                 f"rollback {found.run_id} does). {left_down(ctx, restarted_services(engine))}"
                                 ) from None
    ctx.bus.step = None
    # A process an earlier recover started never saw the cut run's load either.
    earlier = {name: by for name, by in found.started_by_recover.items() if name not in restarted}
    found.unproven = ctx.facts.unproven = _unproven(after, cut, restarted, earlier)
    return Phase.succeeded


def _again(engine: Engine, ctx: Context, steps: list[Step], lineage: list[Run], found: Recovered) -> list[str]:
    """The restarts and checks among steps run again as the cut run would have, but for the services it or a
    recover of it stopped before its end had already brought up (lineage: their logs; kept: no second outage); the
    services restarted. A restart goes on to its end whatever a first signal asks (a second forces), as a rollback
    does: stopped halfway it would leave services down again, which is what recover is there to end; the checks
    after it are stopped at their safe points."""
    starts = serving.started_by(lineage, False)
    found.started_by_recover = {name: by for name, (_, by) in starts.items() if by != found.run_id}
    restarted: list[str] = []
    for step in steps:
        if step.effect not in VERIFY:
            continue
        rest, _, restarting = keeping(step, ctx, starts)
        if rest is None:
            continue
        restarted += restarting
        if rest.effect == Effect.restarts:
            whole_restart(engine, ctx, rest, "the cut run's restart")
        else:
            engine.run_step(ctx, rest, rest.name)
    return restarted


def _finish_restart(engine: Engine, ctx: Context, record: RunRecord, found: Recovered) -> Phase:
    """A `deployer restart` cut in its restart or its checks: it changed no file, and left its services half
    restarted (some stopped, one perhaps up again). Finished as it would have: its restart and checks, but for
    the services it had already brought up (kept). Services that stay down settle it failed_restored all the
    same, and the failure names them with the command that tries again."""
    try:
        _again(engine, ctx, engine.steps, serving.with_its_recovers(engine.runs_dir, found.run_id, but=ctx.run_id),
               found)
    except DeployerError as failure:
        ctx.bus.step = None
        if isinstance(failure, Interrupted):
            raise
        found.outcome = _settle_original(record, Phase.failed_restored)
        raise VerificationFailed(f"{failure}\n{left_down(ctx, restarted_services(engine))}") from None
    ctx.bus.step = None
    return Phase.succeeded


def _unproven(after: list[Step], cut: Run | None, restarted: list[str], earlier: Mapping[str, str]) -> str | None:
    """Why the checks recover ran do not prove the fix (None: they do, or the playbook sends no load): recover
    never sends load again, so a check proves the fix only on the very servers that took the cut run's load.
    `restarted`: by this recover; `earlier`: by an earlier recover of the run (each service: that recover)."""
    loads = [s.name for s in after if s.effect == Effect.loads]
    checks = [s.name for s in after if s.effect == Effect.verifies]
    if not loads or not checks:
        return None
    by_run: dict[str, list[str]] = {}
    for name, by in earlier.items():
        by_run.setdefault(by, []).append(name)
    who = [f"recover restarted {', '.join(restarted)}"] if restarted else []
    who += [f"recover {by} had restarted {', '.join(names)}" for by, names in by_run.items()]
    if who:
        return (f"{' and '.join(who)}, and no {', '.join(loads)} is sent again, so the {', '.join(checks)} read "
                "servers that never saw the run's load")
    done = {e.get("step") for e in ([] if cut is None else cut.all("step_end")) if e.get("status") == "ok"}
    if unsent := [name for name in loads if name not in done]:
        return (f"the cut run never finished its {', '.join(unsent)} and recover sends no load again, so the "
                f"{', '.join(checks)} ran without it")
    return None


def _what_to_undo(ctx: Context, record: RunRecord | None,
                  pending: intent.Intent | None) -> tuple[list[FileRecord], str, str]:
    """Files, HEAD before and trailer: from the run dir when this machine has it, else from the target, whose
    record is checked against the target before anything acts on it."""
    if record is not None and record.state.git_before is not None and record.state.trailer is not None:
        return record.state.files, record.state.git_before, record.state.trailer
    if pending is not None:
        return vetted(ctx, pending), pending.head_before, pending.trailer
    # A chain sent whole, cut before its premise's answer came back (run/whole.py): no intent record on the target
    # says the agent changed nothing, or the chain ran to its release, whose commit names HEAD before it.
    assert record is not None and record.state.trailer is not None  # the caller returns early otherwise
    before = parent_of_run_commit(ctx, record.state.trailer) or gitops.head(ctx)
    return record.state.files, before, record.state.trailer


def rolled_back_by(runs_dir: Path, run_id: str) -> str | None:
    """The rollback that undid the run's commit and ended well, as the run's log links it (None: none did)."""
    if not (runs_dir / run_id / EVENTS).is_file():
        return None
    return next((by for link in read_run(runs_dir, run_id).all("rolled_back_by")
                 if link.get("status") == "successful" and isinstance(by := link.get("by"), str) and is_run_id(by)),
                None)


def ended(runs_dir: Path, run_id: str, record: RunRecord | None) -> bool:
    """The run's record here is settled and its log has its run_end (or this machine has neither)."""
    if record is not None and not record.state.terminal:
        return False
    return not (runs_dir / run_id / EVENTS).is_file() or read_run(runs_dir, run_id).end is not None


def _proved_end(ctx: Context, runs_dir: Path, run_id: str, record: RunRecord | None, commit: str) -> EndNote | None:
    """The success the note on the run's commit proves, when the run could not say how it ended: its log has no
    end, or one written by a run whose record here never settled (it lost the answer: a frozen link). The note
    is written on the target only behind the run's release, so it is what happened there; but it is the target's
    word: only a note that names a beginning of this very log, before any end, counts."""
    path = runs_dir / run_id / EVENTS
    if not path.is_file() or ended(runs_dir, run_id, record):
        return None
    note = EndNote.parse(read_end_note(ctx, commit) or "")
    if note is None or note.phase != Phase.succeeded.value:
        return None
    data = path.read_bytes()
    covered = anchored_lines(data, note.log_sha256)
    end_at = next((i for i, event in enumerate(read_run(runs_dir, run_id).events) if event.get("type") == "run_end"),
                  None)
    return note if covered is not None and (end_at is None or covered <= end_at) else None


def _baseline(cut: Run | None) -> dict[str, float]:
    """The cut run's baseline, which its rollback judges the reverted build against (none: no log here)."""
    return recorded_baseline(cut) if cut is not None else {}


def _settle_original(record: RunRecord | None, outcome: Phase, commit: str | None = None,
                     checks_failed: list[str] | None = None) -> Phase:
    """The cut run's record moved to what the target shows; returns the phase it ends in."""
    if record is None:
        return outcome
    if record.state.terminal:
        # Settled by its own run already (killed before its release: the target holds what the record says);
        # the link line says what recover added, a rollback included.
        return outcome if outcome == Phase.rolled_back else record.state.phase
    after = commit or record.state.git_after
    if outcome in (Phase.failed_committed, Phase.rolling_back) and record.state.phase not in PAST_COMMIT:
        # Cut while committing, or before its record here said so (the commit went ahead with the upload, and
        # the target ran it first): the commit exists after all.
        record.advance(Phase.interrupted, utc_now())
    record.advance(outcome, utc_now(), git_after=after, **({"checks_failed": checks_failed} if checks_failed else {}))
    return outcome


def _settle_cut_recovers(runs_dir: Path, run_id: str, finisher: str) -> None:
    """The recovers of run_id cut before their end (no run_end; their process here gone), now that finisher
    settled run_id: each had nothing of its own left on the target (the lock it held was taken over), so its
    record ends canceled, its log saying who finished its work. One that made a commit of its own (a revert) is
    left as it is: its record still says so."""
    for cut in serving.with_its_recovers(runs_dir, run_id, but=finisher)[1:]:
        record = RunRecord.load(cut.dir)
        if cut.end is not None or record is None or record.state.terminal or record.state.git_after or \
                recorded_owner(cut.dir)[1] is not False:
            continue
        record.advance(Phase.failed_restored, utc_now(), error=f"cut; run {finisher} finished run {run_id}")
        writer = RunLogWriter.reopen(runs_dir, cut.run_id)
        writer.free_room()
        try:
            writer.write({"type": "run_end", "status": "canceled", "exit_code": None,
                          "phase": Phase.failed_restored, "error": f"the run was cut before its end; run {finisher} "
                          f"finished what it was doing (recover of run {run_id})", "ended_by": finisher,
                          "git": {"before": None, "after": None}, "files": [], "facts": {}})
        finally:
            writer.close()


def _link(runs_dir: Path, run_id: str, result: RunResult, found: Recovered) -> None:
    """Append to the cut run's own log: its end (if it never wrote one) and the link to this recover."""
    if not (runs_dir / run_id / EVENTS).is_file():
        return
    run = read_run(runs_dir, run_id)
    writer = RunLogWriter.reopen(runs_dir, run_id)
    writer.free_room()  # a cut run's, kept for the end written here
    try:
        if run.end is None:
            # The end its note proves, word for word; else as its record ended, without an exit code of its own.
            done = found.outcome == Phase.succeeded or (found.rollback_of is not None and found.checks_failed is None)
            status = "successful" if done else "failed"
            status, code = (found.end_note.status, found.end_note.exit_code) if found.end_note else (status, None)
            writer.write({"type": "run_end", "status": status, "exit_code": code, "phase": found.outcome,
                          "error": "the run was cut; it was ended by deployer recover", "ended_by": result.run_id,
                          "git": {"before": result.git_before, "after": found.commit},
                          "files": found.dests, "facts": {"unproven": found.unproven} if found.unproven else {}})
        proved = {} if found.end_note is None or found.commit is None else {
            "end": {"status": found.end_note.status, "exit_code": found.end_note.exit_code,
                    "phase": found.end_note.phase},
            "learnt": f"from the end note on its commit {found.commit[:12]} (refs/notes/deployer), written on the "
                      "target only behind the run's release and naming this log's beginning: the run ended so "
                      "there, though this machine never heard it"}
        earlier = {name: by for name, by in found.started_by_recover.items() if name in found.kept}
        mine = {key: value for key, value in (("kept", found.kept), ("kept_on_revert", found.kept_on_revert),
                                              ("kept_started_by", earlier), ("unproven", found.unproven)) if value}
        writer.write({"type": "recovered_by", "by": result.run_id, "status": result.status,
                      "outcome": found.outcome, "commit": found.commit, "rollback_commit": found.rollback_commit,
                      "before": result.git_before, **proved, **mine})
    finally:
        writer.close()
