"""The target's git: bound the diff the upload made, commit exactly the shipped files, revert a run."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from deployer.config.models import Strict
from deployer.diffs import DIFF_ALGORITHM, DiffStat, FileStat, parse_numstat
from deployer.errors import DeployerError, StepFailed
from deployer.steps.action import Bound as Values
from deployer.steps.base import Action, Effect, Step
from deployer.steps.context import NOTHING, Context, Submitted
from deployer.steps.gitops import HEAD, git, names, touched_argv
from deployer.steps.optional import JudgesEarly, Ordered, Prefetches, SendsAhead, sent

if TYPE_CHECKING:
    from deployer.agent.client import Pending
    from deployer.agent.protocol import BatchResult

Bound = int | tuple[int, int]
# What only the run knows, in the commit message the plan shows.
RUN_ID = "<run id>"
LOG_SHA256 = "<sha256 of the run log up to this step>"


def _check_bound(value: Bound | None) -> Bound | None:
    if isinstance(value, tuple) and not 0 <= value[0] <= value[1]:
        raise ValueError("a range is [min, max] with 0 <= min <= max")
    if isinstance(value, int) and value < 0:
        raise ValueError("must be >= 0")
    return value


class BoundsParams(Strict):
    files: Bound | None = Field(default=None, description="Files the diff changes: a count, or [min, max].")
    insertions: Bound | None = Field(default=None, description="Lines the diff inserts: a count, or [min, max].")
    deletions: Bound | None = Field(default=None, description="Lines the diff deletes: a count, or [min, max].")
    timeout_s: float = Field(default=60.0, description="Seconds the diff on the target may take.")

    _valid = field_validator("files", "insertions", "deletions")(_check_bound)


def _within(value: int, bound: Bound | None) -> bool:
    if bound is None:
        return True
    low, high = (bound, bound) if isinstance(bound, int) else bound
    return low <= value <= high


def _show(bound: Bound) -> str:
    return str(bound) if isinstance(bound, int) else f"[{bound[0]}, {bound[1]}]"


class DiffBounds(Step, Prefetches, JudgesEarly, Ordered):
    """The diff against HEAD is the size the fix should be (files, insertions, deletions); zero changes fail."""

    kind = "diff_bounds"
    Params = BoundsParams
    after = ("upload",)
    judges = "bounds"
    params: BoundsParams

    def judge_here(self, ctx: Context, projected: Callable[[], DiffStat]) -> list[str]:
        return self.judge(projected(), unchanged_dests(ctx))

    def judge(self, stat: DiffStat, unchanged: Sequence[str] = ()) -> list[str]:
        """Every bound the stat breaks; zero changes always breaks one."""
        if not stat.files or (stat.insertions == 0 and stat.deletions == 0
                              and not any(f.binary for f in stat.files)):
            if unchanged:
                return [f"zero changes against HEAD: the target already has these bytes in "
                        f"{', '.join(unchanged)} (already applied?)"]
            return ["zero changes against HEAD: the upload did not land"]
        problems = []
        for label, value, bound in (("files", len(stat.files), self.params.files),
                                    ("insertions", stat.insertions, self.params.insertions),
                                    ("deletions", stat.deletions, self.params.deletions)):
            if bound is not None and not _within(value, bound):
                problems.append(f"{label} {value} outside {_show(bound)}")
        return problems

    def within(self) -> tuple[tuple[str, tuple[int, int] | None], ...]:
        """The bounds as the agent checks a count on the target: a commit sent behind the count runs only if the
        target's own count passes them, by judge()'s rule."""
        return tuple((name, None if bound is None else (bound, bound) if isinstance(bound, int) else bound)
                     for name, bound in (("files", self.params.files), ("insertions", self.params.insertions),
                                         ("deletions", self.params.deletions)))

    def target_decides(self, ctx: Context) -> bool:
        # One count of tracked files: a new file's git prints only against /dev/null, in a command of its own.
        return bool(ctx.changes) and all(c.tracked for c in ctx.changes)

    def actions(self, ctx: Context) -> list[Action]:
        tracked = [c.dest for c in ctx.changes if c.tracked]
        count = "count the diff against HEAD"
        actions = [Action.run("numstat", count, git("diff", "--numstat", "-z", "--no-renames", DIFF_ALGORITHM, "HEAD",
                                                       "--", *tracked), ctx.repo,
                              within=self.within())] if tracked else []
        actions += [Action.run(f"numstat:{c.dest}", f"{count} (a new file)",
                               git("diff", "--no-index", "--numstat", "-z", DIFF_ALGORITHM, "--", "/dev/null", c.dest),
                               ctx.repo) for c in ctx.changes if not c.tracked]
        return actions

    def plan(self, ctx: Context) -> list[Action]:
        return self.actions(ctx)

    def prefetch(self, ctx: Context) -> list[Submitted]:
        return [ctx.send(action, timeout=self.timeout_s) for action in self.actions(ctx)]

    def run(self, ctx: Context) -> str:
        stats: list[FileStat] = []
        for action, submitted in zip(self.actions(ctx), sent(self, ctx) or self.prefetch(ctx), strict=True):
            result = submitted.result()
            no_index = "--no-index" in action.argv
            if result.timed_out or result.exit_code not in ((0, 1) if no_index else (0,)):
                raise ctx.failure("git diff failed on the target", result)
            stats += parse_numstat(result.out, [action.argv[-1]] if no_index and result.out.strip() else None)
        stat = DiffStat(tuple(stats))
        ctx.emit("diffstat", files=[vars(f) for f in stat.files], insertions=stat.insertions,
                 deletions=stat.deletions)
        ctx.facts.diffstat = stat.summary()
        problems = self.judge(stat, unchanged_dests(ctx))
        if problems:
            raise StepFailed(self.name, "; ".join(problems) + f" ({stat.summary()})")
        return stat.summary()


class CommitParams(Strict):
    message: str = Field(description="The commit message; deployer adds the trailers that name the run.")
    hooks: bool = Field(default=False, description=(
        "true: the target repo's commit hooks run (pre-commit, commit-msg, post-commit, ...)."))
    timeout_s: float = Field(default=60.0, description="Seconds the commit on the target may take.")

    @field_validator("message")
    @classmethod
    def _not_blank(cls, message: str) -> str:
        if not message.strip():
            raise ValueError("must not be blank")
        return message


def unchanged_dests(ctx: Context) -> list[str]:
    """Shipped files whose bytes HEAD already has: not in the diff, so not in the commit."""
    return list(ctx.facts.unchanged)


def changed_dests(ctx: Context) -> list[str]:
    """The shipped files the commit holds."""
    return [d for d in ctx.dests if d not in unchanged_dests(ctx)]


def identity_args(ctx: Context) -> list[str]:
    """Use the target's git identity; only where it has none, commit as the operator."""
    if ctx.facts.identity is None:  # preflight reads it with everything else; a rollback has no preflight
        has = ctx.run(git("config", "user.email"), timeout=30)
        ctx.facts.identity = has.out.strip() if has.ok else ""
    if ctx.facts.identity:
        return []
    operator = ctx.facts.operator
    return ["-c", f"user.name=deployer ({operator})", "-c", f"user.email={operator}"]


def commit_argv(message: str, dests: Sequence[str], *, hooks: bool, identity: Sequence[str] = ()) -> tuple[str, ...]:
    verify = () if hooks else ("--no-verify",)
    return git(*identity, "commit", "-q", *verify, "-m", message, "--", *dests, hooks=hooks)


def commit_actions(ctx: Context, dests: Sequence[str], message: str, *, hooks: bool = False,
                   add: bool = False) -> list[Action]:
    """A commit of exactly dests, and the reads that prove it: what the plan shows and what the run sends,
    from this one place."""
    staging = [Action.run("add", "stage the shipped files", git("add", "-A", "--", *dests), ctx.repo,
                          failure="git add failed")] if add else []
    return [*staging,
            Action.run("commit", "commit exactly those files",
                       commit_argv(message, dests, hooks=hooks, identity=identity_args(ctx)), ctx.repo,
                       failure="git commit failed"),
            Action.run("head", "read the new HEAD", HEAD, ctx.repo, failure="cannot read HEAD"),
            # Exactly the dests, in git's (bytewise) order, or the batch stops here: checked on the target, so
            # what is sent behind the batch (the release of a run that ends here) never follows a wrong commit.
            Action.run("files", "list the files the commit holds", touched_argv("HEAD"), ctx.repo,
                       failure="cannot list the commit's files",
                       expect=b"".join(dest.encode() + b"\0" for dest in sorted(dests)))]


def commit_staged(ctx: Context, dests: Sequence[str], message: str, timeout: float, *, hooks: bool = False,
                  add: bool = False, bound: Values = NOTHING, sent: Pending[BatchResult] | None = None) -> str:
    """Commit dests as the index has them (`git commit -- paths`), and prove the commit touched exactly them.

    One round trip: add, commit, and the reads that prove it run as one batch that stops at a failure (sent
    already, with the changes, when given)."""
    actions = commit_actions(ctx, dests, message, hooks=hooks, add=add)
    *_, head_out, touched = ctx.act_all([(action, bound) for action in actions], timeout=timeout, sent=sent)
    made = str(head_out.out).strip()
    files = sorted(names(touched.out))
    if set(files) != set(dests):
        raise StepFailed(ctx.bus.step or "commit", f"commit {made[:12]} touched {', '.join(files)} "
                         f"instead of exactly {', '.join(sorted(dests))}")
    return made


def trailers(**pairs: str) -> str:
    return "\n".join(f"{key.replace('_', '-')}: {value}" for key, value in pairs.items())


NOTES_REF = "deployer"  # refs/notes/deployer: the end anchors, one note on the newest commit of each run
_END_NOTE = re.compile(r"deployer-end sha256:([0-9a-f]{64}) status=([a-z_]+) exit_code=(\d+) phase=([a-z_]+)\n?")
# refs/notes/deployer-seal: the sha256 of a run's whole log through its run_end, on the same commit as its end note
SEAL_REF = "deployer-seal"
_SEAL = re.compile(r"deployer-seal sha256:([0-9a-f]{64})\n?")


@dataclass(frozen=True)
class EndNote:
    """What a run's note on its newest commit says: the sha256 of its log when the release was sent, and the
    end the release proves (the note is written only behind a release that went through)."""

    log_sha256: str
    status: str
    exit_code: int
    phase: str

    def text(self) -> str:
        return (f"deployer-end sha256:{self.log_sha256} status={self.status} exit_code={self.exit_code} "
                f"phase={self.phase}\n")

    @classmethod
    def parse(cls, text: str) -> EndNote | None:
        """None when the target's note is not of this form (it is the target's word: checked, never trusted)."""
        found = _END_NOTE.fullmatch(text)
        return cls(found[1], found[2], int(found[3]), found[4]) if found else None


def end_note_argv(ctx: Context, commit: str, note: EndNote) -> tuple[str, ...]:
    """The note that anchors a run's end in the target's own storage (a commit of refs/notes/deployer, made
    with the commit's identity). Never -f: a note already there is another run's, and stays."""
    return git(*identity_args(ctx), "notes", "--ref", NOTES_REF, "add", "-m", note.text(), commit)


def read_end_note(ctx: Context, commit: str, ref: str = NOTES_REF) -> str | None:
    """The raw note on commit under refs/notes/<ref> (the end note's by default); None when it has none."""
    shown = ctx.run(git("notes", "--ref", ref, "show", commit), timeout=30)
    return shown.out if shown.ok else None


def seal_argv(ctx: Context, commit: str, log_sha256: str) -> tuple[str, ...]:
    """The seal on commit: the sha256 of the run's whole log through its run_end (never -f, as the end note)."""
    return git(*identity_args(ctx), "notes", "--ref", SEAL_REF, "add", "-m", f"deployer-seal sha256:{log_sha256}\n",
               commit)


def parse_seal(text: str) -> str | None:
    """The log sha256 a seal names; None when the target's note is not of this form."""
    found = _SEAL.fullmatch(text)
    return found[1] if found else None


class Commit(Step, SendsAhead, Ordered):
    """Commit the change on the target, under a trailer naming the run: what a rollback reverts."""

    kind = "commit"
    effect = Effect.commits
    Params = CommitParams
    after = ("upload",)
    params: CommitParams

    def message(self) -> str:
        """With placeholders for what only the run knows: its id, and the sha256 of its log so far."""
        anchor = trailers(Deployer_Run=RUN_ID, Deployer_Log=f"sha256:{LOG_SHA256}")
        return f"{self.params.message.rstrip()}\n\n{anchor}\n"

    def plan(self, ctx: Context) -> list[Action]:
        changed = changed_dests(ctx)
        if not changed:
            return [Action("nothing to commit: the target already has these bytes (the step fails)")]
        return commit_actions(ctx, changed, self.message(), hooks=self.params.hooks, add=True)

    @staticmethod
    def bound(ctx: Context) -> Values:
        """The commit message's placeholders bound to what the run knows by now (its id, its log so far)."""
        known = {RUN_ID: ctx.run_id, LOG_SHA256: ctx.facts.log_sha256}
        return {k: v for k, v in known.items() if v is not None}

    def send_ahead(self, ctx: Context, after: Sequence[Pending[Any]]) -> bool:
        if not changed_dests(ctx):
            return False
        bound = self.bound(ctx)
        actions = commit_actions(ctx, changed_dests(ctx), self.message(), hooks=self.params.hooks, add=True)
        ctx.ahead[self.name] = ctx.send_batch([(a, bound) for a in actions], timeout=self.timeout_s,
                                              after=after), bound
        return True

    def run(self, ctx: Context) -> str:
        # A shipped file that already had these bytes is not in the diff, so not in the commit.
        unchanged, changed = unchanged_dests(ctx), changed_dests(ctx)
        if not changed:
            raise StepFailed(self.name, f"nothing to commit: the target already has these bytes in "
                             f"{', '.join(unchanged)}")
        # Kept in ctx.ahead until answered: a forced stop while it runs takes in what it did (Ahead.settle).
        try:
            self._made(ctx, ctx.ahead.get(self.name))
        finally:
            ctx.ahead.pop(self.name, None)
        note = f" ({', '.join(unchanged)} already up to date)" if unchanged else ""
        return f"commit {str(ctx.git_after)[:12]}{note}"

    def settle(self, ctx: Context) -> None:
        """A run stopping before this step's turn: the commit it sent with the changes may have run on the
        target all the same; if it did, the run holds it (ctx.git_after) and undoes it as a commit."""
        sent = ctx.ahead.get(self.name)
        if sent is not None:
            with contextlib.suppress(DeployerError):
                self._made(ctx, sent)
            ctx.ahead.pop(self.name, None)  # not on a forced stop while waiting: Ahead.settle kills it, then asks again

    def _made(self, ctx: Context, sent: tuple[Pending[BatchResult], Values] | None) -> None:
        unchanged, changed = unchanged_dests(ctx), changed_dests(ctx)
        pending, bound = sent or (None, self.bound(ctx))
        # Exactly the shipped files (never -a), proven by what the commit holds.
        ctx.git_after = commit_staged(ctx, changed, self.message(), self.timeout_s, hooks=self.params.hooks,
                                      add=True, bound=bound, sent=pending)
        ctx.facts.files = changed  # what a rollback of this run gives back
        ctx.emit("commit", commit=ctx.git_after, parent=ctx.git_before, files=changed, unchanged=unchanged)


Ownership = tuple[int, int, int]  # uid, gid, permission bits


def ownership(ctx: Context, dests: Sequence[str], timeout: float = 60.0) -> dict[str, Ownership]:
    """Owner and mode of those dests that exist (NUL-delimited: a name cannot shift the answers)."""
    out = ctx.run(("stat", "--printf", "%u %g %a %n\\0", "--", *dests), timeout=timeout).out
    found = {}
    for record in names(out):
        uid, gid, mode, name = record.split(" ", 3)
        found[name] = (int(uid), int(gid), int(mode, 8))
    return found


@contextmanager
def owner_and_mode_kept(ctx: Context, dests: Sequence[str], timeout: float = 60.0) -> Iterator[None]:
    """git writes files anew (apply, checkout): give them back the owner and mode they had.

    The executable bits are git's to decide (a patch may set them); the rest comes from the old file."""
    before = ownership(ctx, dests, timeout)
    yield
    after = ownership(ctx, list(before), timeout)
    for dest, (uid, gid, mode) in before.items():
        if dest not in after:
            continue
        now_uid, now_gid, now_mode = after[dest]
        if (now_uid, now_gid) != (uid, gid):
            # Only root may give a file away; like an upload, a refusal leaves the file as git made it.
            ctx.run(("chown", f"{uid}:{gid}", "--", dest), timeout=timeout)
        wanted = (mode & ~0o111) | (now_mode & 0o111)
        if wanted != now_mode:
            ctx.check(("chmod", f"{wanted:o}", "--", dest), f"cannot give {dest} back its mode", timeout=timeout)
