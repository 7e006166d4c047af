"""The run's lease on the target: the deploy lock (a cut run's taken over by its recover), the intent record
sent ahead of the first change, and their release, with the end note written behind it.

One Lease per run: the engine holds it, and nothing else reaches into the lock or the pending intent."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.agent.client import CUT_SHORT, Pending
from deployer.agent.processes import Procs
from deployer.agent.protocol import ExecResult, Get, Run
from deployer.errors import DeployerError, LockHeld, RecordRefused, RequestSkipped, TransportError
from deployer.run import intent, serving
from deployer.run.lock import DeployLock, beating_agent, force_release, read_state, wait_free
from deployer.run.preflight import Reads, send_reads
from deployer.run.unended import recorded_owner
from deployer.runlog import EVENTS, RunLogWriter, is_run_id, read_run, utc_now
from deployer.runstate import Phase, RunRecord
from deployer.steps.context import Context, EventBus, Submitted
from deployer.steps.git import EndNote, end_note_argv, seal_argv, trailers
from deployer.steps.gitops import GIT_DIR, usual_git_dir
from deployer.transport.base import Transport

AGENT_END_S = 5.0  # how long recover waits for a cut run's agent to end on the target before it refuses
AGENT_POLL_S = 0.1
Note = tuple[tuple[str, ...], str]  # the end note's argv and the repo it runs in
# Sends the chain up to the commit behind preflight's reads, to run only if each of the guards succeeded.
SendWhole = Callable[[Context, Reads, list[Pending[Any]]], None]
Released = Callable[[], bool]  # raises if the release failed or was skipped; says whether the end note was written


def run_trailer(run_id: str) -> str:
    return trailers(Deployer_Run=run_id)


def newest_commit(ctx: Context | None) -> str | None:
    """The newest commit this run made, which its end note and its seal go on (None: it made none). Recover's
    git_after is the cut run's commit, not its own: recover writes neither (see the README's run log section)."""
    if ctx is None or ctx.record is None:
        return None
    kind = ctx.record.state.kind
    return (ctx.facts.rollback_commit if kind == "apply" else None) or (ctx.git_after if kind != "recover" else None)


def end_note(ctx: Context | None, log: RunLogWriter, note: EndNote, commit: str | None = None) -> Note | None:
    """The end note for the newest commit this run made (None: it made none, or it is not settled). Its log
    hash is of the log so far, on disk first: the note may name these bytes."""
    if ctx is None or ctx.record is None:
        return None
    made = commit or newest_commit(ctx)
    if not made:
        return None
    log.sync()
    return end_note_argv(ctx, made, note), ctx.repo


def send_seal(transport: Transport, ctx: Context | None, log: RunLogWriter) -> None:
    """The seal of a run whose end note was written: the sha256 of its whole log, run_end included, on the note's
    commit. The log has ended, so nothing of the run is left to wait for it: it is sent detached, and the agent
    writes it once the connection closes (no round trip). A seal that does not land (the link went first) leaves
    the log anchored up to its end note, as `runs verify --target` then says."""
    made = newest_commit(ctx)
    if made is None or ctx is None:
        return
    with contextlib.suppress(DeployerError):
        transport.submit(Run(seal_argv(ctx, made, log.sha256()), cwd=ctx.repo, timeout=30, detached=True))


def _send_release(lock: DeployLock, transport: Transport, git_dir: str | None,
                  after: Pending[Any] | None = None, note: Note | None = None) -> Released:
    """Send the intent record's removal (with a git dir: the run is settled), the lock's release and the end
    note, to run only if `after` succeeded when given. The note runs only if the lock was removed, so a note
    on the target says the run ended as it claims; the returned check raises if the release failed or was
    skipped, and says whether the note was written."""
    cleared = intent.remove(transport, git_dir, after=after) if git_dir else None
    noting: list[Pending[Any]] = []
    then = None if note is None else (lambda removed: noting.append(
        transport.submit_run(note[0], cwd=note[1], timeout=30, after=removed)))
    released = lock.send_release(after=after, then=then)

    def check() -> bool:
        released()
        if cleared is not None:
            cleared()
        return bool(noting) and noting[0].result().ok
    return check


def _done(sent: Released | None) -> bool | None:
    """Whether a release sent behind the run's last batch wrote its end note (None: none sent, or the agent
    skipped it)."""
    if sent is None:
        return None
    try:
        return sent()
    except RequestSkipped:
        return None


@dataclass
class Lease:
    """A run's hold on its target: the lock, the intent record and their release."""
    host_name: str
    ttl_s: float
    operator: str
    adopt_of: str | None = None  # recover: the cut run whose lock (and intent record) this run takes over
    adopt_dir: Path | None = None  # its run dir here: this machine's own record of it
    lock_wait_s: float = 0.0  # --lock-wait: how long a lock another run holds is waited for before refusing
    lock: DeployLock | None = None  # the run's lock, once taken (None again when a refused record keeps it)
    _reads: Reads | None = field(default=None, repr=False)  # preflight's, sent with the lock
    _intent: Pending[Any] | None = field(default=None, repr=False)  # the intent record, sent ahead
    _released: Released | None = field(default=None, repr=False)  # see release_behind
    _taking: DeployLock | None = field(default=None, repr=False)  # the lock being taken (see taking)

    # -- taking it ---------------------------------------------------------------------------------------

    def take(self, ctx: Context, reads: bool = False, whole: SendWhole | None = None) -> DeployLock:
        """Take the lock and read the intent record (and, with `reads`, send preflight's reads right behind
        the take: the agent runs them once the lock is ours; with `whole`, the chain up to the commit behind
        them, on the target's premises). The git dir is almost always <repo>/.git: the lock is taken there in
        the same round trip that asks git, and taken again only when git says otherwise (the whole chain,
        sent behind a guess that proved wrong, was not run)."""
        guess = usual_git_dir(ctx.repo)
        if self.lock_wait_s:
            wait_free(ctx.transport, guess, self.ttl_s, self.host_name, self.lock_wait_s, ctx.cancel,
                      lambda message: ctx.emit("notice", message=message))
        # Exactly the guess, or what is sent whole behind it does not run.
        found = ctx.submit(GIT_DIR, timeout=30, expect=f"{guess}\n".encode())

        def behind(taking: Pending[ExecResult]) -> None:
            self._send_reads(ctx, clean=whole is not None)
            if whole is not None and self._reads is not None:
                whole(ctx, self._reads, [found.pending, taking, *self._reads.guards()])
        try:
            try:
                lock, raw = self._take(ctx, guess, behind if reads else None)
            except DeployerError:
                if _git_dir(ctx, found) == guess:
                    raise
                lock = None
            git_dir = _git_dir(ctx, found)
            if lock is not None and git_dir != guess:
                lock.release()
                lock = None
            if lock is None:  # the reads sent behind the wrong lock are sent again behind the right one
                lock, raw = self._take(ctx, git_dir, (lambda _: self._send_reads(ctx)) if reads else None)
        except BaseException:
            self._drop_reads()
            raise
        ctx.git_dir = git_dir
        ctx.emit("lock_acquired", path=lock.path, ttl_s=lock.ttl_s, removed_strays=lock.removed)
        try:
            pending = intent.parse(raw, git_dir, self.host_name)
        except DeployerError as exc:
            if isinstance(exc, RecordRefused) and self.adopt_of is not None:
                raise  # recover keeps the lock with the record it refuses: a person looks at both
            lock.release()
            raise LockHeld(str(exc)) from None
        if pending is not None and pending.run_id not in (ctx.run_id, self.adopt_of):
            lock.release()
            raise LockHeld(f"run {pending.run_id} of {pending.operator} was interrupted on {self.host_name} "
                           f"(started {pending.started}); this run changed nothing. End that one first with: "
                           f"deployer recover {pending.run_id} --host {self.host_name}")
        self.lock = lock
        return lock

    def sent_reads(self) -> Reads | None:
        """Preflight's reads sent behind the take, handed over once."""
        sent, self._reads = self._reads, None
        return sent

    def _send_reads(self, ctx: Context, *, clean: bool = False) -> None:
        self._drop_reads()
        self._reads = send_reads(ctx, clean=clean)

    def _drop_reads(self) -> None:
        """Reads sent behind a lock that was not taken ran all the same: log them, use nothing."""
        if self._reads is not None:
            self._reads.drain()
            self._reads = None

    def _take(self, ctx: Context, git_dir: str,
              behind: Callable[[Pending[ExecResult]], None] | None = None) -> tuple[DeployLock, bytes | None]:
        lock = self._taking = DeployLock(ctx.transport, git_dir, {"run_id": ctx.run_id, "operator": self.operator,
                                                                  "pid": os.getpid(), "host": self.host_name},
                                         self.ttl_s)
        assert ctx.record is not None
        ctx.record.advance(Phase.locked, utc_now(), git_dir=git_dir)
        # The intent record is read right after the take, in the same round trip.
        then = [Get(intent.path_in(git_dir))]
        try:
            raw, = lock.acquire(then, behind)
        except LockHeld as held:
            if not self._adopt(ctx, git_dir):
                raise LockHeld(f"{held}{self._interrupted_hint(ctx, git_dir)}") from None
            raw, = lock.acquire(then, behind)
        return lock, raw

    def _adopt(self, ctx: Context, git_dir: str) -> bool:
        """Recover takes over the lock of the run it recovers, once that run is surely gone: its heartbeat is
        older than its TTL, or (`_may_run`) this machine's own record of it shows it gone. The pid in the lock's
        info is the target's word, never proof."""
        state = read_state(ctx.transport, git_dir, self.ttl_s, self.host_name)
        holder = self._holder(state.info.get("run_id") if state is not None else None)
        if state is None or holder is None:
            return False
        who = f"run {holder.name}" + (f" (a recover of run {self.adopt_of})" if holder.name != self.adopt_of else "")
        if not state.stale and (running := self._may_run(ctx, git_dir, holder)) is not None:
            raise LockHeld(f"{who} still holds the lock and its heartbeat is fresh ({state.describe()}){running}; "
                           f"recover it once it has stopped (its heartbeat goes stale {state.ttl_s:.0f}s after its "
                           "last beat)")
        agents: list[int] = []
        if state.stale:
            # A stale heartbeat says its agent stopped beating, not that it ended: one still busy with the cut run's
            # last command (a start) would race what recover does next. Not known (none named): taken, as ever.
            with contextlib.suppress(DeployerError):
                agents = self._agents_left(ctx, self._cut_agents(ctx, git_dir, holder))
        if agents:
            raise LockHeld(f"{who}'s lock is stale ({state.describe()}), but its agent on the target "
                           f"(pid {agents[0]}) still runs {AGENT_END_S:g}s later; end it there, then recover")
        if not force_release(ctx.transport, git_dir, state):  # another run took it since it was read: theirs
            return False
        ctx.emit("lock_adopted", of_run=self.adopt_of, holder=state.info,
                 because="its heartbeat is stale" if state.stale else "its process on this machine is gone")
        return True

    def _holder(self, run_id: object) -> Path | None:
        """The run dir here of the lock's holder when recover may take its lock over: the run it recovers, or a
        recover of it that was cut in turn (its log here says so); None for any other holder."""
        if self.adopt_of is None or self.adopt_dir is None or not isinstance(run_id, str) or not is_run_id(run_id):
            return None
        if run_id == self.adopt_of:
            return self.adopt_dir
        lineage = serving.with_its_recovers(self.adopt_dir.parent, self.adopt_of)
        return self.adopt_dir.parent / run_id if run_id in {run.run_id for run in lineage} else None

    def _may_run(self, ctx: Context, git_dir: str, holder: Path) -> str | None:
        """None when the holder's record here names a process of this machine that is gone and no agent of it runs
        on the target: an agent exits once its stdin closes, as the process's death does, unless the link was
        cut so that the target never heard it close. Else what may still run, for the refusal."""
        record = RunRecord.load(holder)
        if record is None or record.state.owner is None:
            return ""
        owner = record.state.owner
        alive = owner.alive()
        if alive is not False:
            return (f"; its process on this machine (pid {owner.pid}) still runs" if alive else
                    f"; its record here names process {owner.pid} of a boot or machine this one cannot judge")
        gone = f"; its process on this machine (pid {owner.pid}) is gone, but"
        try:
            pids = self._cut_agents(ctx, git_dir, holder)
            if not pids:
                return f"{gone} neither its log here nor its lock on the target names an agent of it to look for"
            agents = self._agents_left(ctx, pids)
        except DeployerError as exc:
            return f"{gone} whether its agent on the target still runs is not known ({exc})"
        return f"{gone} its agent on the target (pid {agents[0]}) still runs {AGENT_END_S:g}s later" if agents else None

    def _cut_agents(self, ctx: Context, git_dir: str, holder: Path) -> list[int]:
        """The pids of the holder's agents on the target: those its log here names, and the one its lock's
        heartbeat names (a run killed between sending its lock's take and reading its agent's hello logged none)."""
        pids: list[int] = []
        if (holder / EVENTS).is_file():
            events = read_run(holder.parent, holder.name).events
            # An agent its container's restart ended (services/container.py) is gone: its pid, of that container's
            # old pid namespace, may well be another process's in the new one.
            ended = max((i for i, e in enumerate(events) if e.get("type") == "agent_ended"), default=-1)
            pids = [e["pid"] for e in events[ended + 1:] if e.get("type") == "agent" and isinstance(e.get("pid"), int)]
        beating = beating_agent(ctx.transport, git_dir)
        return pids if beating is None or beating in pids else [*pids, beating]

    def _agents_left(self, ctx: Context, pids: list[int]) -> list[int]:
        """Which of pids still run on the target, once each had AGENT_END_S to end: an agent ends as soon as it
        reads its client's end (a kill of deployer closes it at once), or once the command it runs then returns."""
        deadline, said = time.monotonic() + AGENT_END_S, False
        while pids:
            # By its command line: a pid read from a log may name another process by now.
            pids = [p.pid for p in ctx.transport.submit(Procs(pids=pids)).result().procs
                    if p.alive and any(CUT_SHORT in arg for arg in p.cmdline)]
            if not pids or time.monotonic() >= deadline:
                break
            if not said:
                said = True
                ctx.emit("notice", message=f"run {self.adopt_of}'s agent on the target (pid {pids[0]}) still runs: "
                                           f"waiting up to {AGENT_END_S:g}s for it to end")
            ctx.cancel.wait(AGENT_POLL_S)
        return pids

    def _interrupted_hint(self, ctx: Context, git_dir: str) -> str:
        """Recover is the way out of a held lock whose run is gone (it refuses to take a live one)."""
        holder = None
        with contextlib.suppress(DeployerError):
            pending = intent.read(ctx.transport, git_dir, self.host_name)
            state = read_state(ctx.transport, git_dir, self.ttl_s, self.host_name)
            holder = pending.run_id if pending is not None else state.info.get("run_id") if state else None
        if not holder:
            return ""
        recover = f"deployer recover {holder} --host {self.host_name}"
        # This machine's own record of that run, where it ran here, says whether it is still going.
        owner, alive = (recorded_owner(ctx.record.dir.parent / holder)
                        if ctx.record is not None and isinstance(holder, str) and is_run_id(holder) else (None, None))
        if owner is not None and alive:
            return (f"\nRun {holder} is still going on this machine (pid {owner.pid}): wait for it "
                    "(--lock-wait SECONDS waits for the lock)")
        if owner is not None and alive is False:
            return (f"\nRun {holder} was cut (its process on this machine, pid {owner.pid}, is gone): end it with: "
                    f"{recover}")
        return f"\nIf run {holder} is gone (killed, disconnected), end it with: {recover}"

    # -- the intent record ---------------------------------------------------------------------------------

    def recorded_ahead(self, sent: Pending[Any] | None) -> None:
        """The intent record was sent by a premise (run/whole.py), answered by intent_failure like any; None:
        that premise did not hold, so no record was written and it goes with the first change as usual."""
        self._intent = sent

    def write_intent(self, ctx: Context) -> None:
        """Sent with the first change, ahead of it: the agent lets no change through unless it holds."""
        record = ctx.record
        assert record is not None and ctx.git_dir is not None and ctx.git_before is not None
        self._intent = intent.write_ahead(ctx.transport, ctx.git_dir, intent.Intent(
            run_id=ctx.run_id, operator=self.operator, host=self.host_name, started=record.state.history[0].time,
            head_before=ctx.git_before, trailer=run_trailer(ctx.run_id), files=record.state.files))

    def intent_failure(self, ctx: Context) -> DeployerError | None:
        """Wait for the intent record sent ahead of the first change (None: it is on the target)."""
        sent, self._intent = self._intent, None
        if sent is None:
            return None
        ctx.transport.lift_gate()
        assert ctx.git_dir is not None
        try:
            sent.result()
        except DeployerError as exc:
            return DeployerError(f"cannot record the run's intent on the target ({exc}); the agent let none of "
                                 "the run's changes through")
        ctx.emit("intent_recorded", path=intent.path_in(ctx.git_dir))
        return None

    # -- releasing it --------------------------------------------------------------------------------------

    @property
    def taking(self) -> DeployLock | None:
        """The run's lock, or the one it is taking: a batch sent with the take may carry its release."""
        return self.lock or self._taking

    def release_behind(self, ctx: Context, note: Callable[[], Note | None]) -> None:
        """The release sent right behind the next batch (the run's last: its commit), to run only if the whole
        batch succeeded; `note` is the end note to write behind it, made once the batch is sent."""
        lock = self.taking
        assert lock is not None

        def behind(batch: Pending[Any]) -> None:
            self._released = _send_release(lock, ctx.transport, ctx.git_dir, after=batch, note=note())
        ctx.closing = behind

    def released_with_note(self) -> bool:
        """Whether the release sent behind the commit's batch ran and wrote the end note claiming success."""
        try:
            return bool(_done(self._released))
        except DeployerError:
            return False

    def keep(self, bus: EventBus) -> None:
        """A refused record keeps the lock on the target, as the refusal's message says."""
        if self.lock is not None:
            bus.emit("lock_kept", path=self.lock.path)
            self.lock = None

    def release(self, transport: Transport, bus: EventBus, settled: Context | None,
                note: Note | None = None) -> tuple[str | None, bool]:
        """Clear the intent record (once the run is settled), release the lock and write the end note behind them
        (when given): one round trip (or none, when it went behind the commit). The connection stays open for the
        run's seal (send_seal); the caller closes it.

        Never raises; says what it had to leave, and whether the end note was written. An interrupted run keeps
        its intent record on the target: it stops every later apply until `deployer recover` has ended it."""
        left, noted, lock = None, False, self.lock
        if lock is not None:
            try:
                done = _done(self._released)
                noted = _send_release(lock, transport, settled.git_dir if settled else None, note=note)() \
                    if done is None else done
                bus.emit("lock_released", path=lock.path)
            except DeployerError as exc:
                if settled is not None and isinstance(exc, TransportError):
                    # Sent, and its reply lost with the link: the release may well have run. Say that, no more.
                    bus.emit("lock_release_unknown", path=lock.path, error=str(exc))
                    left = (f"The release of the deploy lock {lock.path} and the intent record was sent, but its reply "
                            f"was lost ({exc}): whether they are still on the target is unknown. Check with: "
                            f"deployer lock status --host {bus.host}")
                else:
                    bus.emit("lock_release_failed", path=lock.path, error=str(exc))
                    # An unsettled run's lock is recover's to take over, with its intent record; a settled one's is
                    # spare.
                    left = (f"The deploy lock {lock.path} (and the intent record) stay on the target ({exc}); "
                            f"deployer recover {lock.info['run_id']} takes them over once this run's heartbeat is "
                            "stale" if settled is None else
                            f"The deploy lock {lock.path} was left on the target ({exc}); once the target is checked, "
                            f"remove it with: deployer lock release --host {bus.host} --force")
        return left, noted


def _git_dir(ctx: Context, found: Submitted) -> str:
    return found.check(f"{ctx.repo} is not a git checkout on the target").out.strip()
