"""The target's git: bound the diff the upload made, commit exactly the shipped files, revert a run."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import field_validator

from deployer.config import Strict
from deployer.context import Context
from deployer.diffs import DIFF_ALGORITHM, DiffStat, FileStat, parse_numstat
from deployer.errors import StepFailed
from deployer.steps.base import Action, Effect, Step

Bound = int | tuple[int, int]


def _check_bound(value: Bound | None) -> Bound | None:
    if isinstance(value, tuple) and not 0 <= value[0] <= value[1]:
        raise ValueError("a range is [min, max] with 0 <= min <= max")
    if isinstance(value, int) and value < 0:
        raise ValueError("must be >= 0")
    return value


class BoundsParams(Strict):
    files: Bound | None = None
    insertions: Bound | None = None
    deletions: Bound | None = None
    timeout_s: float = 60.0

    _valid = field_validator("files", "insertions", "deletions")(_check_bound)


def _within(value: int, bound: Bound | None) -> bool:
    if bound is None:
        return True
    low, high = (bound, bound) if isinstance(bound, int) else bound
    return low <= value <= high


def _show(bound: Bound) -> str:
    return str(bound) if isinstance(bound, int) else f"[{bound[0]}, {bound[1]}]"


class DiffBounds(Step):
    kind = "diff_bounds"
    Params = BoundsParams
    after = ("upload",)
    params: BoundsParams

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

    def commands(self, ctx: Context) -> list[tuple[str, ...]]:
        tracked = [c.dest for c in ctx.changes if c.tracked]
        cmds = [("git", "diff", "--numstat", DIFF_ALGORITHM, "HEAD", "--", *tracked)] if tracked else []
        cmds += [("git", "diff", "--no-index", "--numstat", DIFF_ALGORITHM, "--", "/dev/null", c.dest)
                 for c in ctx.changes if not c.tracked]
        return cmds

    def plan(self, ctx: Context) -> list[Action]:
        return [Action("count the diff against HEAD", argv, ctx.repo) for argv in self.commands(ctx)]

    def run(self, ctx: Context) -> str:
        stats: list[FileStat] = []
        for argv in self.commands(ctx):
            result = ctx.run(argv, timeout=self.timeout_s)
            no_index = "--no-index" in argv
            if result.timed_out or result.exit_code not in ((0, 1) if no_index else (0,)):
                raise ctx.failure("git diff failed on the target", result)
            stats += parse_numstat(result.out, [argv[-1]] if no_index and result.out.strip() else None)
        stat = DiffStat(tuple(stats))
        ctx.emit("diffstat", files=[vars(f) for f in stat.files], insertions=stat.insertions,
                 deletions=stat.deletions)
        ctx.facts["diffstat"] = stat.summary()
        problems = self.judge(stat, unchanged_dests(ctx))
        if problems:
            raise StepFailed(self.name, "; ".join(problems) + f" ({stat.summary()})")
        return stat.summary()


class CommitParams(Strict):
    message: str
    timeout_s: float = 60.0

    @field_validator("message")
    @classmethod
    def _not_blank(cls, message: str) -> str:
        if not message.strip():
            raise ValueError("must not be blank")
        return message


def unchanged_dests(ctx: Context) -> list[str]:
    return [c.dest for c in ctx.changes if c.tracked and c.old == c.new]


def identity_args(ctx: Context) -> list[str]:
    """Use the target's git identity; only where it has none, commit as the operator."""
    has = ctx.run(("git", "config", "user.email"), timeout=30)
    if has.ok and has.out.strip():
        return []
    operator = str(ctx.facts.get("operator", "deployer"))
    return ["-c", f"user.name=deployer ({operator})", "-c", f"user.email={operator}"]


def commit_files(ctx: Context, dests: Sequence[str], message: str, timeout: float) -> str:
    """Commit exactly dests (never -a), prove the commit touched exactly them, return its hash."""
    ctx.check(("git", "add", "-A", "--", *dests), "git add failed", timeout=timeout)
    ctx.check(("git", *identity_args(ctx), "commit", "-q", "-m", message, "--", *dests),
              "git commit failed", timeout=timeout)
    head = ctx.check(("git", "rev-parse", "HEAD"), "cannot read HEAD", timeout=timeout).out.strip()
    touched = ctx.check(("git", "diff-tree", "--no-commit-id", "--name-only", "-r", "-z", "HEAD"),
                        "cannot list the commit's files", timeout=timeout).out
    files = sorted(filter(None, touched.split("\0")))
    if set(files) != set(dests):
        raise StepFailed(ctx.bus.step or "commit", f"commit {head[:12]} touched {', '.join(files)} "
                         f"instead of exactly {', '.join(sorted(dests))}")
    return head


def trailers(**pairs: str) -> str:
    return "\n".join(f"{key.replace('_', '-')}: {value}" for key, value in pairs.items())


class Commit(Step):
    kind = "commit"
    effect = Effect.commits
    Params = CommitParams
    after = ("upload",)
    params: CommitParams

    def message(self, ctx: Context) -> str:
        return f"{self.params.message.rstrip()}\n\n{trailers(Deployer_Run=ctx.run_id)}\n"

    def plan(self, ctx: Context) -> list[Action]:
        return [Action("stage the shipped files", ("git", "add", "-A", "--", *ctx.dests), ctx.repo),
                Action("commit exactly them", ("git", "commit", "-q", "-m", self.message(ctx), "--", *ctx.dests),
                       ctx.repo)]

    def run(self, ctx: Context) -> str:
        # A shipped file that already had these bytes is not in the diff, so not in the commit.
        unchanged = unchanged_dests(ctx)
        changed = [d for d in ctx.dests if d not in unchanged]
        if not changed:
            raise StepFailed(self.name, f"nothing to commit: the target already has these bytes in "
                             f"{', '.join(unchanged)}")
        ctx.git_after = commit_files(ctx, changed, self.message(ctx), self.timeout_s)
        ctx.facts["files"] = changed  # what a rollback of this run gives back
        ctx.emit("commit", commit=ctx.git_after, parent=ctx.git_before, files=changed, unchanged=unchanged)
        note = f" ({', '.join(unchanged)} already up to date)" if unchanged else ""
        return f"commit {ctx.git_after[:12]}{note}"


def revert_files(ctx: Context, before: str, dests: Sequence[str], message: str, timeout: float = 60.0) -> str:
    """A new commit that gives dests their content at `before` (removing those absent there).

    When HEAD already has that content (an interrupted rollback got that far), HEAD is returned."""
    if ctx.run(("git", "diff", "--quiet", before, "HEAD", "--", *dests), timeout=timeout).ok:
        return ctx.check(("git", "rev-parse", "HEAD"), "cannot read HEAD", timeout=timeout).out.strip()
    existed = [d for d in dests
               if ctx.run(("git", "cat-file", "-e", f"{before}:{d}"), timeout=timeout).ok]
    absent = [d for d in dests if d not in existed]
    if existed:
        ctx.check(("git", "checkout", before, "--", *existed), "cannot restore the files from git", timeout=timeout)
    if absent:
        ctx.check(("git", "rm", "-q", "-f", "--", *absent), "cannot remove the run's new files", timeout=timeout)
    return commit_files(ctx, dests, message, timeout)
