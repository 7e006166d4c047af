"""The chain up to the commit sent whole: with the lock and preflight's reads, in the agent's first round trip.

A run that replaces tracked, clean files, and whose steps before the commit are decided on the target, sends
everything at once: the lock, preflight's reads, a premise, the uploads, the checks, the commit (and the release,
when nothing follows it). The premise (the agent's op_premise) runs only if the git dir is where this machine
guessed, the lock was taken, every dest is tracked and clean and the target has a git identity (preflight's own
reads, each told what it must print: Reads.guards). It holds only if no intent record is there and every dest is
a regular file of the work tree that does not hold its new bytes yet; then it writes the intent record, new and
durable, from what it found there (HEAD, each dest's sha256, owner and mode). Everything behind it runs only if it
held: the changes never run without their record. When it did not hold, nothing behind it ran, and the run goes
on as one that sent the reads alone (a round trip more).

What this machine judges from the target's answers (preflight's refusals) comes after the changes in such a run,
so only chains in which nothing needs those answers before the first change are sent whole (Whole.of): whole
files, no --allow-dirty, no container, only local steps before the upload, no step that reads the target to judge
the run before it changes it, unless the agent judges that inside the premise (JudgedThere: co_restart's services
answering only through deployer's process, their GPUs listed; a premise that does not find so changes nothing,
and the run judges here as any run does). A failure anywhere after the premise held restores the target as any
run does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deployer.agent.client import NeverStarted, Pending
from deployer.agent.protocol import Premise, Premised, Ready, sha256_hex
from deployer.errors import DeployerError, PythonMissing, TransportError
from deployer.run import intent
from deployer.run.ahead import Ahead
from deployer.run.lease import Lease, run_trailer
from deployer.run.preflight import Reads
from deployer.runlog import utc_now
from deployer.runstate import FileRecord, Phase, RunRecordError, ensure_headroom, git_blob_id
from deployer.steps.base import Effect, Step
from deployer.steps.context import Change, Context
from deployer.steps.gitops import HEAD, OBJECT_ID, usual_git_dir
from deployer.steps.optional import (
    judge_here,
    judged_there,
    judges,
    reads_target_first,
    runs_here,
    send_changes,
    sends_changes,
    target_decides,
)
from deployer.text import shown

# The identity the batch assumes the target has (the email read is a guard): preflight reads the real one.
ASSUMED_IDENTITY = "(the target's own)"
IDENTITY = "a git identity (user.email is empty there)"


@dataclass
class Whole:
    """One run's chain up to the commit, sent with the lock: what went, and whether its premise held."""

    chain: list[Step]
    upload: int  # the index of the step that changes files; the commit comes after the checks behind it
    commit: int
    lease: Lease
    ahead: Ahead
    premise: Pending[Premised] | None = None

    @classmethod
    def of(cls, ctx: Context, chain: list[Step], lease: Lease, ahead: Ahead, *, allow_dirty: bool) -> Whole | None:
        """The chain, when it may be sent whole (see the module's docstring); None when it goes step by step."""
        if lease.adopt_of is not None:
            return None
        # Judged as send() sends it: against the git dir the guards hold the target to (where a service's records
        # lie); preflight reads the real one.
        ctx.git_dir = usual_git_dir(ctx.repo)
        try:
            if unsent(ctx, chain, allow_dirty=allow_dirty) is not None:
                return None
        finally:
            ctx.git_dir = None
        upload = next(i for i, s in enumerate(chain) if not runs_here(s))
        return cls(chain, upload, next(i for i, s in enumerate(chain) if s.effect == Effect.commits), lease, ahead)

    def send(self, ctx: Context, reads: Reads, guards: list[Pending[Any]]) -> None:
        """Sent behind preflight's reads (before any reply): the premise behind the guards, then the changes,
        the checks and the commit behind the premise. The record here names all of it first. Nothing is sent
        when a local step judges the shipped bytes bad, or the checks cannot be decided there: the run then
        goes as one that sent the reads alone, and says why in its turn."""
        record = ctx.record
        assert record is not None
        if ctx.cancel.cancelled:  # a stop while connecting: nothing more goes
            return
        git_dir = ctx.git_dir = usual_git_dir(ctx.repo)  # the guess the guards hold it to; take() confirms it
        ctx.changes = [Change(dest=dest, path=ctx.in_repo(dest), new=new, old=None, tracked=True,
                              source=ctx.playbook.source_of(dest)) for dest, new in sorted(reads.new.items())]
        ctx.facts.identity, ctx.facts.unchanged = ASSUMED_IDENTITY, []
        rest = self.chain[self.upload + 1:self.commit]
        try:
            judged = any(judge_here(s, ctx, _no_projection) for s in self.chain[:self.upload] if judges(s))
        except DeployerError:
            judged = True  # said in its turn, as by any run
        if judged or not all(target_decides(s, ctx) for s in rest):
            self._forget(ctx)
            return
        try:
            # Room for the pre-run copies, kept once the answers are in (about the new bytes' size: a fix is small).
            ensure_headroom(record.dir.parent, 2 * sum(len(c.new) for c in ctx.changes))
            # On disk before the first change is sent, the files and the phase in one durable write.
            record.advance(Phase.changing, utc_now(),
                           files=[FileRecord(dest=c.dest, path=c.path, existed=True, tracked=True, sha256=None,
                                             new_sha256=sha256_hex(c.new), new_blob=git_blob_id(c.new))
                                  for c in ctx.changes],
                           sent_ahead=[s.name for s in self.chain[self.upload:self.commit + 1]])
        except RunRecordError:
            self._forget(ctx)
            return
        state = record.state
        there = {s.name: r for s in self.chain if (r := judged_there(s, ctx)) is not None}
        try:
            self.premise = ctx.transport.write_ahead(Premise(
                repo=ctx.repo, git_dir=git_dir, head_argv=HEAD, record=intent.path_in(git_dir),
                record_fields={"run_id": ctx.run_id, "operator": state.operator, "host": state.host,
                               "started": state.history[0].time, "trailer": run_trailer(ctx.run_id)},
                files=[{"dest": f.dest, "new_sha256": f.new_sha256, "new_blob": f.new_blob} for f in state.files],
                ready=sum(there.values(), Ready())), after=guards)
        except TransportError:
            # Refused before a byte went (the stream was already known broken, e.g. a reply read while this
            # machine was slow to get here): nothing of the chain can run there, and the record says so.
            self._back_to_locked(ctx)
            raise
        self.lease.recorded_ahead(self.premise)
        upload = self.chain[self.upload]
        changes = send_changes(upload, ctx)
        assert changes is not None, f"{upload.kind} sends whole files before its turn"  # of(): no patch
        ctx.prefetched[upload.name] = changes
        self.ahead.sent(ctx, self.upload)
        # Each request of the chain names what it runs behind; what follows (the take's own reads when it found
        # the lock held, its removal of strays) must not wait on the premise.
        ctx.transport.lift_gate()
        ctx.emit("sent_whole", steps=state.sent_ahead, guards=len(guards), judged_there=list(there))

    def premise_held(self, ctx: Context) -> bool:
        """Whether the premise held (then the target may hold any part of the chain). When it did not, nothing
        behind it ran: the record goes back to `locked`, and what was sent is forgotten."""
        if self.premise is None:
            return False
        try:
            why = self.premise.declined()
        except (PythonMissing, NeverStarted) as exc:  # no python, or an exec (kubectl's) that ended before the
            # agent ran: nothing reached the repo
            why = str(exc)
        if why is None:
            return True
        ctx.emit("sent_whole_declined", reason=why)
        self.lease.recorded_ahead(None)
        self.ahead.settle(ctx)  # each request sent whole was answered: skipped
        self.ahead.unwatch()
        ctx.ahead.clear()
        ctx.closing = None
        self.premise = None
        self._back_to_locked(ctx)
        return False

    def settle(self, ctx: Context) -> str | None:
        """The run failed, perhaps before it saw its premise's answer (the lock was not ours, the link was
        cut): when that answer says the premise did not hold, the record says nothing was changed. When no
        answer came, the record stays where it is and this says what the target may hold (None: nothing)."""
        try:
            if not self.premise_held(ctx):
                return None
            record = ctx.record
            # Taken in by the run (restored, kept, rolled back), or by its own words (an answer it refused).
            if record is None or record.state.phase != Phase.changing or record.state.git_before is not None:
                return None
            why = "its premise held"
        except TransportError as exc:
            why = f"its premise's answer was lost ({exc})"
        return (f"The chain up to the commit went to the target with the lock, and {why}: the files "
                f"{', '.join(ctx.dests)} may hold the new bytes, and HEAD may be this run's commit "
                f"({run_trailer(ctx.run_id)}). `deployer recover {ctx.run_id}` reads the target and ends it")

    def record_premised(self, ctx: Context) -> None:
        """The premise held: what it found on the target (HEAD, each dest's pre-run sha256, owner and mode) is
        what a restore needs, on disk here first. It is the target's word, checked as the intent record is;
        one that does not pass leaves the run interrupted, for recover to read the target."""
        record = ctx.record
        assert self.premise is not None and record is not None
        premised = self.premise.result()
        files, problem = [], None
        try:
            for sent, found in zip(record.state.files, premised.files, strict=True):
                rec = FileRecord.model_validate(found)
                problem = problem or intent.file_problem(rec) or (
                    None if (rec.dest, rec.path, rec.new_sha256) == (sent.dest, sent.path, sent.new_sha256) and
                    rec.existed and rec.tracked else ("dest", rec.dest, "not the dest the premise was sent"))
                files.append(rec)
        except (ValueError, TypeError) as exc:  # a pydantic ValidationError is a ValueError too
            problem = ("files", len(premised.files), f"not the files the premise was sent ({exc})")
        if problem is None and not OBJECT_ID.fullmatch(premised.head):
            problem = ("head", premised.head, "not a commit id")
        if problem is not None:
            raise DeployerError(f"the agent's answer to the premise is refused: {problem[0]} is "
                                f"{shown(problem[1])}: {problem[2]}. The run stopped with its changes sent; "
                                f"deployer recover {ctx.run_id} reads the target and ends it")
        ctx.git_before = premised.head
        record.update(files=files, git_before=premised.head, git_dir=ctx.git_dir)

    def check(self, ctx: Context) -> None:
        """After preflight read the target: it is what the batch was built on (the premise checked it there,
        under the lock: a difference means something else wrote the repo meanwhile, and the run restores)."""
        assert self.premise is not None
        premised = self.premise.result()
        wrong = [what for what, ok in (
            ("git dir", ctx.git_dir == usual_git_dir(ctx.repo)),
            ("HEAD", premised.head == ctx.git_before),
            ("tracked", all(c.tracked for c in ctx.changes)),
            ("changed", not ctx.facts.unchanged),
            (IDENTITY, bool(ctx.facts.identity)),
            ("pre-run bytes", [f.get("sha256") for f in premised.files] ==
             [None if c.old is None else sha256_hex(c.old) for c in ctx.changes]))
            if not ok]
        if wrong:
            raced = "" if wrong == [IDENTITY] else f": something else changed {ctx.repo} meanwhile"
            raise DeployerError(f"the target's answers differ from what the chain sent with the lock was built on "
                                f"({', '.join(wrong)}){raced}")

    def _forget(self, ctx: Context) -> None:
        ctx.changes, ctx.facts.identity, ctx.facts.unchanged = [], None, []
        ctx.prefetched.clear()

    def _back_to_locked(self, ctx: Context) -> None:
        """Nothing behind the premise ran: the record goes back to `locked`, naming no file."""
        record = ctx.record
        assert record is not None
        self._forget(ctx)
        record.update(files=[], sent_ahead=[])
        record.advance(Phase.locked, utc_now())


def unsent(ctx: Context, chain: Sequence[Step], *, allow_dirty: bool) -> str | None:
    """Why the chain waits for preflight's answers before its first change (None: it goes whole, if the target's
    premises hold there)."""
    if ctx.playbook.patch is not None:
        return "the playbook ships a patch, applied here to the target's own bytes, read first"
    if allow_dirty:
        return "--allow-dirty: the pre-run bytes are in no git object, so they are read and kept here first"
    if ctx.host.container is not None:
        return "a container target: where each dest lives is read first"
    if ctx.host.transport == "kubernetes" and ctx.playbook.model.persist == "required":
        return "persist: required on a pod: where each dest lives is read first"
    if judging := [s.name for s in chain if reads_target_first(s, ctx)]:
        return f"{', '.join(judging)} reads the target to judge the run before it changes it"
    upload = next((i for i, s in enumerate(chain) if not runs_here(s)), None)
    if upload is None or chain[upload].effect != Effect.changes_files:
        return f"{chain[upload].name} reads the target before the upload" if upload is not None else \
            "nothing is uploaded"
    if not sends_changes(chain[upload]):
        return f"{chain[upload].name} sends its changes only in its turn"
    commit = next((i for i, s in enumerate(chain) if s.effect == Effect.commits), None)
    if commit is None:
        return "no commit"
    if not all(s.effect == Effect.observes for s in chain[upload + 1:commit]):
        return "a step between the upload and the commit is more than a check"
    return None


def declined(ctx: Context) -> str | None:
    """After preflight read the target: why the premise would not hold there (None: it would)."""
    problems = [*(f"{c.dest} is not tracked" for c in ctx.changes if not c.tracked),
                *(f"{d} has uncommitted changes" for d in ctx.facts.dirty),
                *(f"{d} already holds the new bytes" for d in ctx.facts.unchanged)]
    if not ctx.facts.identity:
        problems.append("the target has no git identity")
    if ctx.git_dir != usual_git_dir(ctx.repo):
        problems.append(f"the git dir is {ctx.git_dir}, not {usual_git_dir(ctx.repo)}")
    return "; ".join(problems) or None


def _no_projection() -> Any:
    raise AssertionError("a local step judges the shipped bytes alone, never the diff against the target's HEAD")
