"""Runs a playbook on one host: the fail-fast chain of steps, whose declared effects move the run's state.

The lease (lock, intent record, release) is in lease.py, the dry run in plan.py, the undo in undo.py; the
engine holds one Lease and one Ending per run and drives them."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import deployer
from deployer.command import Masker
from deployer.config.models import Host
from deployer.errors import (
    ChecksFailed,
    ConfigError,
    DeployerError,
    Interrupted,
    RecordRefused,
    RequestSkipped,
    RollbackFailed,
)
from deployer.run import prepare, undo
from deployer.run.ahead import Ahead
from deployer.run.ending import Ending
from deployer.run.lease import Lease, Note, end_note, run_trailer, send_seal
from deployer.run.plan import PlanReport, plan
from deployer.run.revert_checks import NotRun, RevertChecks, checks_failed_message, failed_names, prove
from deployer.run.standing import left_down, target_state
from deployer.run.whole import Whole
from deployer.runlog import RunLogWriter, new_run_id, operator_id, utc_now
from deployer.runowner import Owner
from deployer.runstate import (
    PAST_COMMIT,
    Phase,
    RunRecord,
    RunRecordError,
    RunState,
    ensure_headroom,
)
from deployer.steps import optional
from deployer.steps.base import Effect, Step
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Context, EventBus, Listener, LoadedPlaybook
from deployer.steps.git import LOG_SHA256, RUN_ID, EndNote
from deployer.transport.base import Transport

Connector = Callable[[EventBus], Transport]


def as_failure(exc: BaseException) -> DeployerError:
    """Every way a run can stop, as a typed failure; a bug in deployer still restores the target."""
    if isinstance(exc, DeployerError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted("interrupted")
    return DeployerError(f"internal error: {type(exc).__name__}: {exc} (please report this)")


# The phase a step's effect moves the run into before the step runs, and the one it leaves it in after.
ENTER = {Effect.changes_files: Phase.changing, Effect.commits: Phase.committing, Effect.restarts: Phase.restarting,
         Effect.verifies: Phase.verifying, Effect.loads: Phase.verifying}
LEAVE = {Effect.changes_files: Phase.changed, Effect.commits: Phase.committed}
# What every rollback runs again after its revert, in-run or manual: the restart and the checks (a drain).
# The old build must not face the storm that proved the fix: never the load steps.
VERIFY = (Effect.restarts, Effect.verifies)



class LogSink:
    """The run log as a listener: a failed write (a full disk) stops the run at its next safe point.

    Raising from inside a step would skip the restore; so the failure is handed to the cancel token,
    the run stops, restores the target, and says why. Later events are dropped, not half-written."""

    def __init__(self, log: RunLogWriter, cancel: CancelToken) -> None:
        self.log, self.cancel = log, cancel
        self.broken: OSError | None = None

    def resume(self) -> None:
        """Write again (the run's end): a disk that was full may have room by now."""
        self.broken = None

    def __call__(self, event: dict[str, Any]) -> None:
        if self.broken is not None:
            return
        try:
            self.log.write(event)
        except OSError as exc:
            self.broken = exc
            self.cancel.cancel("the run log could not be written", DeployerError(
                f"the run log {self.log.dir} could not be written ({exc.strerror or exc}); the run stopped at "
                "the next safe point"))


@dataclass
class RunResult:
    """One run's outcome: status, exit code, error, commits and facts."""
    run_id: str
    run_dir: Path
    status: str  # successful | failed | canceled
    exit_code: int
    error: str | None
    git_before: str | None
    git_after: str | None
    facts: dict[str, Any]
    phase: str = Phase.preparing.value
    warning: str | None = None  # what a run that ended as its record says could not make sure of (the release)

    def document(self) -> dict[str, Any]:
        """The run's outcome as `--json` prints it."""
        from deployer.run.shown import shown_outcome_of

        state, changed = shown_outcome_of(self.run_dir.parent, self.run_id, self.phase)
        return {"run_id": self.run_id, "state": state, "changed": changed,
                "status": self.status, "exit_code": self.exit_code, "error": self.error, "warning": self.warning,
                "git": {"before": self.git_before, "after": self.git_after}, "run_dir": str(self.run_dir),
                "facts": self.facts}


@dataclass
class Engine:
    """One host's runs of a playbook: the chain, its lease, its log and its undo."""
    host_name: str
    host: Host
    connect: Connector
    playbook: LoadedPlaybook
    steps: list[Step]
    runs_dir: Path
    listeners: list[Listener] = field(default_factory=list)
    cancel: CancelToken = field(default_factory=CancelToken)
    allow_dirty: bool = False
    restart: bool = False  # apply --restart: an apply with nothing to change restarts and checks all the same
    operator: str = field(default_factory=operator_id)
    adopt_lock_of: str | None = None  # recover: the cut run whose lock (and intent record) this run takes over
    lock_wait_s: float = 0.0  # --lock-wait: seconds a held lock is waited for before the run is refused
    run_tags: dict[str, Any] = field(default_factory=dict)  # added to run_start (a fleet run names itself)
    revert_checks: RevertChecks = field(default_factory=RevertChecks)  # a rollback's
    # The run's log, lease and ending while it runs (one run at a time per engine).
    _log: RunLogWriter | None = field(default=None, init=False, repr=False)
    _lease: Lease | None = field(default=None, init=False, repr=False)
    _ending: Ending | None = field(default=None, init=False, repr=False)
    _ahead: Ahead | None = field(default=None, init=False, repr=False)  # what the whole chain sends ahead
    _whole: Whole | None = field(default=None, init=False, repr=False)  # the chain sent with the lock, if it was

    def new_bus(self) -> EventBus:
        bus = EventBus(Masker(self.host.secrets()), self.host_name)
        bus.listeners.extend(self.listeners)
        return bus

    def context(self, run_id: str, bus: EventBus, transport: Transport) -> Context:
        ctx = Context(run_id=run_id, host_name=self.host_name, host=self.host, transport=transport,
                      playbook=self.playbook, bus=bus, cancel=self.cancel)
        ctx.facts.operator = self.operator
        return ctx

    # -- dry run ---------------------------------------------------------------------------------------

    def check_host(self) -> None:
        """Everything the steps need from the inventory host, before anything connects."""
        problems = [f"{s.where}: {s.name}: {problem}" for s in self.steps
                    if (problem := optional.check_host(s, self.host_name, self.host))]
        if problems:
            raise ConfigError("\n".join(problems))

    def plan(self) -> PlanReport:
        """Only reads on the target: what apply would change, count and run."""
        self.check_host()
        bus = self.new_bus()
        with self.connect(bus) as transport:
            return plan(self.context("<dry-run>", bus, transport), self.steps, allow_dirty=self.allow_dirty)

    # -- the run ---------------------------------------------------------------------------------------

    def apply(self) -> RunResult:
        self.check_host()

        def body(ctx: Context, log: RunLogWriter) -> None:
            whole = self._whole
            if whole is not None and whole.premise_held(ctx):
                whole.record_premised(ctx)  # what a restore needs, before anything else can fail
                sent = self._lease.sent_reads() if self._lease else None
                self.run_steps(ctx, prologue=lambda: prepare.after_premise(ctx, log, whole, self.runs_dir, sent))
                return
            self.prepare(ctx, log)
            if ctx.facts.already_applied:
                ctx.emit("unchanged", files=ctx.facts.unchanged, head=ctx.git_before, restart=self.restart)
                if self.restart:  # asked for: the services restarted and checked on the code they already run
                    self.run_steps(ctx, [s for s in self.steps if s.effect in VERIFY])
                return
            self.run_steps(ctx)
        # A patch is applied here to copies of the target's files, read one by one: no reads to send ahead.
        return self.execute(body, reads=self.playbook.patch is None, whole=True)

    def prepare(self, ctx: Context, log: RunLogWriter) -> None:
        """Preflight, and the pre-run bytes kept here: what every apply does before its first step."""
        assert self._lease is not None
        prepare.before_steps(ctx, log, self.steps, allow_dirty=self.allow_dirty, runs_dir=self.runs_dir,
                             sent=self._lease.sent_reads())

    def execute(self, body: Callable[[Context, RunLogWriter], None], *, reads: bool = False, whole: bool = False,
                **start: Any) -> RunResult:
        """One run: its log, one connection, the lock, the body, and a run_end whatever happens.

        reads: the body starts with prepare(), whose preflight reads are sent with the lock (one round trip);
        whole: and the chain up to the commit with them, when it may be (run/whole.py)."""
        run_id = new_run_id()
        # A run's kind is in its record and its run_start (`runs list`): a rollback, a recover, a restart, an apply.
        kind = start.pop("kind", None) or ("rollback" if start.get("rollback_of") else
                                           "recover" if start.get("recover_of") else "apply")
        ensure_headroom(self.runs_dir, 0)
        log = self._log = RunLogWriter(self.runs_dir, run_id)
        log.keep_room()
        record = RunRecord(log.dir, RunState(run_id=run_id, host=self.host_name, operator=self.operator,
                                             kind=kind, owner=Owner.this(),
                                             repo=self.host.repo, trailer=run_trailer(run_id),
                                             rollback_of=start.get("rollback_of")), before_write=log.sync)
        lease = self._lease = Lease(self.host_name, self.host.lock_ttl_s, self.operator, self.adopt_lock_of,
                                    self.runs_dir / self.adopt_lock_of if self.adopt_lock_of else None,
                                    lock_wait_s=self.lock_wait_s)
        ending = self._ending = Ending(record)
        record.advance(Phase.preparing, utc_now())
        bus = self.new_bus()
        sink = LogSink(log, self.cancel)
        bus.listeners.insert(0, sink)
        # Its run id too: a listener (the webhooks) hears the run's events from the bus, never its log's name.
        bus.emit("run_start", status="starting", run_id=run_id, operator=self.operator, version=deployer.__version__,
                 playbook=str(self.playbook.path), playbook_name=self.playbook.model.name,
                 playbook_sha256=hashlib.sha256(self.playbook.raw).hexdigest(),
                 steps=[s.describe() for s in self.steps], on_failure=self.playbook.model.on_failure,
                 kind=kind, **self.run_tags, **start)
        # The copy is masked like everything else written here; playbook_sha256 names the original.
        log.attach("playbook.yaml", bus.masker(self.playbook.raw.decode("utf-8", "replace")).encode())
        ctx: Context | None = None
        left: str | None = None
        status, exit_code, error, warning = "successful", 0, None, None
        ended = ("successful", 0)  # what the body ended with: the end note's claim
        noted = False
        transport: Transport | None = None
        try:
            transport = self.connect(bus)
            try:
                bus.emit("connected", transport=vars(transport.info))
                ctx = self.context(run_id, bus, transport)
                ctx.record = record
                bus.step = "preflight"
                self._ahead = Ahead(self.steps, self._close_behind, self._note_log_sha256)
                self._whole = Whole.of(ctx, self.steps, lease, self._ahead, allow_dirty=self.allow_dirty) \
                    if whole and reads else None
                lease.take(ctx, reads, whole=self._whole.send if self._whole else None)
                body(ctx, log)
                ending.end(Phase.rolled_back if record.state.kind == "rollback" else
                           Phase.unchanged if ctx.facts.already_applied else Phase.succeeded)
            except (Exception, KeyboardInterrupt) as exc:
                failed = as_failure(exc)
                # A chain sent whole whose premise did not hold changed nothing; one whose answer was lost may
                # have changed anything up to its commit.
                left_sent = self._whole.settle(ctx) if self._whole is not None and ctx is not None else None
                if left_sent is not None:
                    failed = RollbackFailed(f"{failed}\n{left_sent}")
                ending.settle(failed)
                ended = ("canceled" if isinstance(failed, Interrupted) else "failed", failed.exit_code)
                if isinstance(exc, RecordRefused):
                    lease.keep(bus)  # left with the refused record, as its message says
                if left_sent is not None:
                    raise failed from None
                raise
            finally:
                # A lost connection fails the release too; that must not replace the body's failure.
                # A recover that did not end its cut run leaves that run's intent record for the next try.
                # A recover whose rollback's revert stands ended its cut run too, though a check of it failed.
                settled = (record.state.terminal or ending.unrecorded is not None) and not (
                    self.adopt_lock_of is not None and record.state.phase not in (Phase.succeeded, Phase.rolled_back))
                note = end_note(ctx if settled else None, log, EndNote(log.sha256(), *ended, ending.held.value))
                left, noted = lease.release(transport, bus, ctx if settled else None, note)
            if left and not settled:
                raise DeployerError(left)
            warning = left  # the run ended as its record says; only its release is in doubt
        except (Exception, KeyboardInterrupt) as exc:
            failure = as_failure(exc)
            ending.settle(failure)  # a failure to connect never reached the inner handler
            status = "canceled" if isinstance(failure, Interrupted) else "failed"
            exit_code, error = failure.exit_code, bus.masker(str(failure))
            if left and left not in error:
                error += "\n" + left
            if sink.broken is not None and "run log" not in error:
                error += f"\nThe run log could not be written: {sink.broken.strerror or sink.broken}"
        finally:
            bus.step = None
            # Events the sink dropped are gone; the end, in the room kept for it, says so.
            lost = {"events_lost": str(sink.broken.strerror or sink.broken)} if sink.broken is not None else {}
            if lost and not error:
                said = (f"The run log {log.dir} could not be written ({lost['events_lost']}): some of this run's "
                        "events are missing from it; its end records the run's commit and outcome")
                warning = f"{warning}\n{said}" if warning else said
            log.free_room()
            sink.resume()  # the run_end is worth a try: a full disk may have room again
            if unrecorded := ending.retry():
                if error:
                    error += f"\n{unrecorded}"
                else:
                    warning = f"{warning}\n{unrecorded}" if warning else unrecorded
            commits = {"before": ctx.git_before if ctx else None, "after": ctx.git_after if ctx else None}
            facts = ctx.facts.record() if ctx else {}
            phase = ending.held  # what the target holds
            anchored = {"anchor": "notes"} if noted else {}  # the end note is on the target: verify requires it
            bus.emit("run_end", status=status, exit_code=exit_code, error=error, git=commits, phase=phase,
                     files=facts.get("files") or (ctx.dests if ctx else []), facts=facts, **anchored, **lost)
            if sink.broken is not None:
                # Not even the end fit (no room could be kept: a file-size limit): an exit 0 would vouch for a run
                # whose record here lacks its end, and its commit.
                unlogged = (f"The run's end could not be written to its log {log.dir} "
                            f"({sink.broken.strerror or sink.broken}): the target holds {phase.value}, which the log "
                            f"does not say. Once the runs dir has room, `deployer recover {run_id}` records it")
                error, exit_code = f"{error}\n{unlogged}" if error else unlogged, exit_code or 6
            log.close()
            if transport is not None:
                if noted and sink.broken is None:  # the seal names the log through its run_end
                    send_seal(transport, ctx, log)
                with contextlib.suppress(Exception):
                    transport.close()
            self._log = self._ahead = self._whole = None
        return RunResult(run_id, log.dir, status, exit_code, error, commits["before"], commits["after"], facts,
                         phase.value, warning)

    def run_step(self, ctx: Context, step: Step, name: str) -> str:
        """One step between step_start and step_end events; a failure comes out typed, naming the step's line."""
        ctx.bus.step = name
        started = time.monotonic()
        self._note_log_sha256(ctx)  # a commit made by this step anchors the log up to its step_start
        try:
            ctx.emit("step_start", kind=step.kind)
            ctx.cancel.check()
            summary = step.run(ctx)
        except (Exception, KeyboardInterrupt) as exc:
            failure = as_failure(exc)
            if isinstance(exc, RequestSkipped) and ctx.cancel.cancelled:
                failure = ctx.cancel.stopped()  # what the stop took back: the stop is the failure
            if step.where and not isinstance(failure, Interrupted):
                # The playbook line to look at; the typed error and its exit code stay as they are.
                failure.args = (f"{step.where}: {failure}",)
            ctx.emit("step_end", status="canceled" if isinstance(failure, Interrupted) else "failed",
                     duration_s=round(time.monotonic() - started, 3), error=ctx.bus.masker(str(failure)))
            raise failure from None
        finally:
            ctx.facts.log_sha256 = None
        ctx.emit("step_end", status="ok", duration_s=round(time.monotonic() - started, 3), summary=summary)
        return summary

    def _note_log_sha256(self, ctx: Context) -> None:
        if self._log is not None:
            self._log.sync()  # a trailer may name these bytes: on disk first
            ctx.facts.log_sha256 = self._log.sha256()

    def run_steps(self, ctx: Context, steps: list[Step] | None = None,
                  prologue: Callable[[], None] | None = None) -> None:
        """The chain (or a part of it: a unit runs its hosts' chains in phases); each step's declared effect
        moves the run's phase, written before the step acts. A prologue runs before the first step, failing
        as a step does (a chain sent whole: the target may hold its changes already)."""
        record, lease, ending = ctx.record, self._lease, self._ending
        assert record is not None and lease is not None and ending is not None
        chain = self.steps if steps is None else steps
        sending = self._ahead if steps is None and self._ahead is not None else \
            Ahead(chain, self._close_behind if steps is None else None, self._note_log_sha256)
        for index, step in enumerate(chain):
            ctx.on_sent = lambda index=index: sending.sent(ctx, index)
            if steps is None and index == len(chain) - 1 and step.name not in ctx.ahead:
                self._close_behind(ctx, step)
            # The phase moves and the step run under one handler: a forced stop (a second signal) between
            # steps must undo the target just as one inside a step does.
            try:
                if prologue is not None:
                    first, prologue = prologue, None
                    first()
                self.enter(ctx, step.effect)
                self.run_step(ctx, step, step.name)
                if unrecorded := lease.intent_failure(ctx):
                    raise unrecorded
                if step.effect in LEAVE:
                    record.advance(LEAVE[step.effect], utc_now(), git_after=ctx.git_after)
            except (DeployerError, KeyboardInterrupt) as exc:
                # From here to the end of a restore, a forced stop (often the second signal of a stop that the
                # first one began) lets the target be put back first; it still kills what the landing waits on.
                with ctx.cancel.undoing(kill=lambda: undo.kill_running(ctx)):
                    failure = as_failure(exc)
                    ctx.bus.step = None
                    if isinstance(failure, Interrupted):  # a stop: what still runs is killed, not waited for
                        undo.stop_running(ctx)
                    sending.settle(ctx)
                    failure = lease.intent_failure(ctx) or failure
                    if isinstance(failure, RunRecordError) and lease.released_with_note():
                        # The commit was the last step and the release behind it ran with the end note: the
                        # target holds a finished run, as the note says. Only the record here is behind.
                        ending.end(Phase.succeeded, git_after=ctx.git_after)
                        return
                    # The run's commit is on the target (the record may have failed to say so: a full disk).
                    committed = record.state.git_after is not None or ctx.git_after is not None
                    if not committed:
                        self.restore(ctx, failure)
                        raise failure from None
                    if record.state.phase not in PAST_COMMIT:  # it ran ahead of its turn: the record catches up
                        with contextlib.suppress(RunRecordError):
                            record.advance(Phase.committed, utc_now(), git_after=ctx.git_after)
                # A rollback can be long (it restarts services): a forced stop still stops it.
                raise undo.after_commit_failure(
                    [self.past(ctx)], failure, rollback=self.playbook.model.on_failure == "rollback",
                    again=lambda: self.prove_revert(ctx, VERIFY, ctx.facts.baseline, {}),
                    restarts=any(s.effect == Effect.restarts for s in self.steps)) from None
            finally:
                ctx.on_sent = None
                if not ctx.ahead:
                    sending.unwatch()

    def _close_behind(self, ctx: Context, step: Step) -> None:
        """A run whose last step is its commit releases in the commit's round trip: the release goes right
        behind the commit's batch and the agent runs it only if the whole batch succeeded (the commit
        touched exactly the shipped files). Not under on_failure: rollback, where a failure after the
        commit (a forced stop) still needs the lock to roll back."""
        lease = self._lease
        if step.effect != Effect.commits or lease is None or lease.taking is None or \
                self.playbook.model.on_failure == "rollback":
            return

        def note() -> Note | None:
            # The batch proved HEAD is the run's commit; a note behind a release that went through says the
            # run succeeded: nothing the run does after the reply can fail it on the target.
            assert self._log is not None
            return end_note(ctx, self._log, EndNote(self._log.sha256(), "successful", 0, Phase.succeeded.value),
                            "HEAD")
        lease.release_behind(ctx, note)

    def enter(self, ctx: Context, effect: Effect) -> None:
        record = ctx.record
        assert record is not None
        phase = ENTER.get(effect)
        # A check before the commit (a storm to show the symptom) moves nothing: only a commit's is verifying.
        if phase is None or (phase == Phase.verifying and record.state.phase not in PAST_COMMIT):
            return
        first_change = record.state.phase in (Phase.preparing, Phase.locked)
        record.advance(phase, utc_now())
        if first_change:
            assert self._lease is not None
            self._lease.write_intent(ctx)

    def restore(self, ctx: Context, failure: DeployerError) -> None:
        """Before the commit, after failure: every dest back to its pre-run bytes (see undo.restore)."""
        assert self._ending is not None
        undo.restore(ctx, failure, self._ending)

    def revert(self, ctx: Context, *, before: str, dests: list[str], rollback_of: str,
               verify: tuple[Effect, ...], baseline: Mapping[str, float],
               keep: Mapping[str, tuple[int, str]] | None = None) -> str:
        """A commit giving dests their content at `before`; then the playbook's restart and checks again, as
        they prove the revert (prove_revert). `keep`: the process an earlier attempt (cut, or stopped before its end)
        started on the revert for each service, kept where it still is that process and healthy (no second outage)."""
        revert = self.revert_commit(ctx, before=before, dests=dests, rollback_of=rollback_of)
        with undo.rollback_restarts([ctx]):
            self.prove_revert(ctx, verify, baseline, keep or {})
        return revert

    def revert_commit(self, ctx: Context, *, before: str, dests: list[str], rollback_of: str) -> str:
        """The commit giving dests their content at `before` (made, or found made by an earlier attempt)."""
        ctx.bus.step = "rollback"
        self._note_log_sha256(ctx)
        known = {RUN_ID: ctx.run_id, LOG_SHA256: ctx.facts.log_sha256}
        ctx.facts.log_sha256 = None
        revert = self.reverting(before, dests, rollback_of).run(ctx, {k: v for k, v in known.items() if v})
        ctx.emit("rollback", commit=revert, of_run=rollback_of, restores=before, files=dests)
        ctx.facts.rollback_commit = revert
        return revert

    def prove_revert(self, ctx: Context, verify: tuple[Effect, ...], baseline: Mapping[str, float],
                     keep: Mapping[str, tuple[int, str]]) -> None:
        """After the revert commit, the playbook's steps of effect `verify` again, as they judge the reverted build
        (run/revert_checks.py: against the run's `baseline`); a restart leaves out the services `keep` names that
        still serve the revert. A failed check leaves the revert standing: ChecksFailed, with every check's verdict
        in the facts."""
        def run(step: Step) -> object:
            ctx.bus.step = f"rollback:{step.name}"  # what a service_kept event names: a keep on the revert
            rest, kept, _ = optional.keeping(step, ctx, keep)
            if rest is None:
                return f"kept {', '.join(kept)}: already serving the revert"
            return self.run_step(ctx, rest, f"rollback:{rest.name}")

        verdicts, failure = prove(self.checks_after_revert(verify, baseline), run=run,
                                  not_run=lambda check: self.not_run(ctx, check))
        ctx.facts.rollback_checks = verdicts
        ctx.bus.step = None
        if failure is not None:
            from deployer.steps.services.co_restart import services_restarted  # a failure's: off the run's path

            revert = str(ctx.facts.rollback_commit)
            restarted = services_restarted(self.steps, ctx.host)
            left = left_down(ctx, restarted) if restarted else target_state(ctx)
            raise ChecksFailed(checks_failed_message(verdicts, failure, revert, self.host_name, left),
                               commit=revert, checks=failed_names(verdicts))

    @staticmethod
    def not_run(ctx: Context, check: NotRun) -> None:
        """A check the rollback leaves out, in the log as such (never as passed)."""
        ctx.bus.step = f"rollback:{check.name}"
        ctx.emit("step_start", kind="not_run")
        ctx.emit("step_end", status="skipped", duration_s=0.0, summary=f"not run: {check.why}")
        ctx.bus.step = None

    def past(self, ctx: Context) -> undo.Past:
        """This host of a run that failed past its commit, for undo.after_commit_failure: its revert undoes the
        run's own commit."""
        assert self._ending is not None
        return undo.Past(ctx, self._ending, lambda ctx: self.revert_commit(
            ctx, before=str(ctx.git_before), dests=ctx.dests, rollback_of=ctx.run_id))

    def reverting(self, before: str, dests: list[str], rollback_of: str) -> undo.Revert:
        """The revert commit a rollback of run `rollback_of` makes: run by revert(), shown by its plan."""
        return undo.Revert.of(self.playbook.model.name, before, dests, rollback_of)

    def checks_after_revert(self, verify: tuple[Effect, ...],
                            baseline: Mapping[str, float]) -> list[Step | NotRun]:
        """The playbook's steps a rollback runs again after its revert (a restart, and checks), as they judge the
        reverted build."""
        return self.revert_checks.choose([s for s in self.steps if s.effect in verify], baseline)
