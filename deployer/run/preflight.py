"""Read-only facts about the target gathered before anything changes: HEAD, the files' bytes, dirt.

Every list of paths read back from the target is NUL-delimited: one odd name must not shift the
answers for the others."""

from __future__ import annotations

import contextlib
import difflib
import functools
import posixpath
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer import diffs
from deployer.agent.client import Pending
from deployer.agent.protocol import Get, Stat, StatEntry
from deployer.config import yamlsrc
from deployer.config.models import check_repo_relative
from deployer.errors import ConfigError, DeployerError, StepFailed
from deployer.run.mounts import inspection, place_dests, refuse_layer
from deployer.run.pods import place_pod, reading, refuse_unkept
from deployer.steps.context import Change, Context, Submitted
from deployer.steps.gitops import HEAD, git, git_dirs_argv, names
from deployer.steps.optional import refusals

if TYPE_CHECKING:
    from deployer.steps.base import Step

STEP = "preflight"


@dataclass
class Reads:
    """Preflight's reads, sent and not yet answered (an apply sends them with the lock: one round trip)."""

    new: dict[str, bytes]
    paths: list[str]
    git_dirs: Submitted
    head: Submitted
    listed: Submitted
    status: Submitted
    email: Submitted
    stats: Pending[list[StatEntry]]
    olds: list[Pending[bytes | None]]

    def drain(self) -> None:
        """Read what was sent and never used (the lock was not taken): it ran, so it is logged."""
        for sent in (self.git_dirs, self.head, self.listed, self.status, self.email):
            with contextlib.suppress(DeployerError):
                sent.result()


    def guards(self) -> list[Pending[Any]]:
        """Every read whose failure fails preflight, sent with `clean` so that it fails by the agent's rule too
        (the listing and the status succeed only if every dest is tracked and clean, the identity read only if
        the target has one): a batch sent behind them runs only when preflight can pass."""
        return [self.git_dirs.pending, self.head.pending, self.listed.pending, self.status.pending,
                self.email.pending, *self.olds]


def send_reads(ctx: Context, *, clean: bool = False) -> Reads:
    """Send every read preflight needs, without waiting for one. With `clean`, the listing and the status
    succeed only if every dest is tracked and clean (Reads.guards): they are read here all the same."""
    new = _new_bytes(ctx)
    dests = sorted(new)
    paths = [ctx.in_repo(d) for d in dests]
    parents = sorted({posixpath.dirname(p) for p in paths} - {ctx.repo})
    inspection(ctx)  # a container target: its inspect runs on the host meanwhile (run/mounts.py)
    reading(ctx)  # a pod's: kubectl get pod runs where kubectl runs meanwhile (run/pods.py)

    def read(argv: tuple[str, ...], expect: bytes | None = None, quiet: bool = False) -> Submitted:
        return ctx.submit(argv, timeout=30, quiet=quiet, expect=expect if clean else None, guard=clean)
    return Reads(
        new=new, paths=paths,
        git_dirs=read(git_dirs_argv(ctx.repo), quiet=True),
        head=read(HEAD),
        # git lists paths in bytewise order: the order of sorted str (UTF-8 keeps code point order).
        listed=read(git("ls-files", "-z", "--", *dests), b"".join(d.encode() + b"\0" for d in dests)),
        # --no-optional-locks: a plain `git status` may rewrite .git/index, and a dry run writes nothing.
        status=read(git("--no-optional-locks", "status", "--porcelain=v1", "-z", "--no-renames",
                        "--untracked-files=all", "--", *dests), b""),
        email=read(git("config", "user.email")),
        stats=ctx.transport.submit(Stat((ctx.repo, *paths, *parents))),
        olds=[ctx.transport.submit(Get(path)) for path in paths])


def projected_stat(ctx: Context, head: dict[str, bytes | None],
                   known: Mapping[str, diffs.FileStat] | None = None) -> diffs.DiffStat:
    """The diff the run will make, from preflight's reads: counted against HEAD as diff_bounds and the commit
    count it (under --allow-dirty the work tree differs); git diff lists no file whose bytes are already
    there, nor does this. The counts not `known` already (the plan's, per file) come from one local
    `git diff --no-index`."""
    known = known or {}
    shipped = [c for c in ctx.changes if c.dest not in ctx.facts.unchanged]
    counted = iter(diffs.numstats([(c.dest, head[c.dest], c.new) for c in shipped if c.dest not in known]))
    return diffs.DiffStat(tuple(known[c.dest] if c.dest in known else next(counted) for c in shipped))


def lazy_projection(ctx: Context, head: dict[str, bytes | None]) -> Callable[[], diffs.DiffStat]:
    """projected_stat, counted the first time a step asks for it (only diff_bounds does): an apply without
    bounds spawns no local git for it."""
    return functools.cache(lambda: projected_stat(ctx, head))


def preflight(ctx: Context, *, allow_dirty: bool, sent: Reads | None = None) -> dict[str, bytes | None]:
    """Fill ctx.git_before, ctx.git_dir and ctx.changes; refuse what would lose work.

    Everything it reads is sent at once and costs one round trip (two when dirty files need HEAD's bytes),
    none of its own when `sent` went with the lock. Returns each dest's bytes at HEAD (None: not tracked),
    what diffs and bounds count against."""
    reads = sent or send_reads(ctx)
    dests = sorted(reads.new)

    resolved = names(reads.git_dirs.check(f"{ctx.repo} is not a git checkout on the target").out)
    if len(resolved) != 2:
        raise StepFailed(STEP, f"cannot find the git dirs of {ctx.repo} on the target")
    ctx.git_dir = ctx.git_dir or resolved[0]
    ctx.git_before = reads.head.check("cannot read HEAD").out.strip()
    tracked = set(names(reads.listed.check("git ls-files failed").out))
    dirty = sorted({entry[3:] for entry in names(reads.status.check("git status failed").out) if len(entry) > 3})
    ctx.facts.identity = reads.email.result().out.strip() if reads.email.result().ok else ""
    entries = {entry.path: entry for entry in reads.stats.result()}
    refuse_unsafe_dests(dests, entries[ctx.repo], resolved, [entries[p] for p in reads.paths])
    ctx.facts.dirty = dirty
    if dirty and not allow_dirty:
        raise StepFailed(STEP, f"the target has uncommitted changes in {', '.join(dirty)}; nothing was "
                         "changed. Commit or discard them there, or pass --allow-dirty")
    ctx.changes = []
    for dest, path, pending in zip(dests, reads.paths, reads.olds, strict=True):
        old, seen = pending.result(), entries[path]
        change = Change(dest=dest, path=path, new=reads.new[dest], old=old, tracked=dest in tracked,
                        source=ctx.playbook.source_of(dest), mode=seen.mode, uid=seen.uid, gid=seen.gid)
        if old is None:
            change.new_dirs = _missing_dirs(ctx, dest, entries)
        ctx.changes.append(change)
    refuse_layer(ctx, place_dests(ctx, dests))  # a container's: where each dest lives, and `persist: required`
    refuse_unkept(ctx, place_pod(ctx, dests))  # a pod's: the same, and which pod and container it is
    _refuse_untracked(ctx)
    dirty_heads = {c.dest: ctx.submit(git("cat-file", "blob", f"HEAD:{c.dest}"), timeout=30, quiet=True,
                                      capture=None) for c in ctx.changes if c.tracked and c.dest in dirty}
    head_bytes = {c.dest: c.old for c in ctx.changes if c.tracked}
    for dest, shown in dirty_heads.items():  # HEAD has no such file when it is staged as new
        head_bytes[dest] = shown.result().stdout if shown.result().ok else None
    # "Already applied" is HEAD's business: a work-tree file that has the bytes uncommitted still needs the commit.
    ctx.facts.unchanged = [c.dest for c in ctx.changes if c.tracked and head_bytes[c.dest] == c.new]
    ctx.emit("preflight", head=ctx.git_before, git_dir=ctx.git_dir, dirty=dirty, files=[
        {"dest": c.dest, "exists": c.old is not None, "tracked": c.tracked} for c in ctx.changes])
    return {c.dest: head_bytes.get(c.dest) for c in ctx.changes}


def refuse_unready(ctx: Context, steps: Sequence[Step]) -> None:
    """What a step needs the target to offer and it lacks (Refuses.refusals), before anything changes."""
    problems = [f"{s.where}: {s.name}: {p}" if s.where else f"{s.name}: {p}" for s in steps for p in refusals(s, ctx)]
    if problems:
        raise StepFailed(STEP, "; ".join(problems) + " (nothing on the target was changed)")


def _new_bytes(ctx: Context) -> dict[str, bytes]:
    if ctx.playbook.patch is None:
        return dict(ctx.playbook.sources)
    return apply_patch_here(ctx, ctx.playbook.patch)


def refuse_unsafe_dests(dests: list[str], repo: StatEntry, git_dirs: list[str], seen: list[StatEntry]) -> None:
    """Each dest must be its own real path in the repo's work tree: not in the git dir, not through a symlink."""
    if repo.realpath is None:
        raise StepFailed(STEP, f"the repo {repo.path} does not exist on the target")
    root = repo.realpath
    for dest, entry in zip(dests, seen, strict=True):
        real = entry.realpath
        if real is None:
            raise StepFailed(STEP, f"cannot resolve {entry.path} on the target: {entry.error}")
        inside = next((g for g in git_dirs if real == g or real.startswith(g.rstrip("/") + "/")), None)
        if inside is not None:
            raise StepFailed(STEP, f"{dest} resolves to {real} on the target, inside the git dir {inside} "
                             "(through a symlink); refusing to write git's own files")
        if not real.startswith(root.rstrip("/") + "/"):
            raise StepFailed(STEP, f"{dest} resolves to {real} on the target, outside the repo "
                             "(a symlink); refusing to write through it")
        if real != posixpath.join(root, dest):
            real_dest = real[len(root.rstrip("/")) + 1:]
            raise StepFailed(STEP, f"{dest} is or goes through a symlink on the target (it resolves to {real_dest}); "
                             f"refusing to replace a link or write through one. Ship {real_dest} instead")


def _refuse_untracked(ctx: Context) -> None:
    """A dest git does not track is created only when the playbook says so (a typo must not make a new file).

    A patch says so itself when it creates the file; a patch cannot change an untracked file that exists."""
    marks: yamlsrc.Document | None = None
    for change in ctx.changes:
        if change.tracked:
            continue
        if ctx.playbook.patch is not None:
            if change.old is None:
                continue
            where, why = f"{ctx.playbook.model.patch}", "the patch changes a file git does not track there"
        else:
            index = next(i for i, f in enumerate(ctx.playbook.model.files) if f.dest == change.dest)
            if ctx.playbook.model.files[index].create:
                continue
            marks = marks or yamlsrc.load(ctx.playbook.path)
            where = f"{marks.mark(('files', index, 'dest'))}: files.{index}.dest"
            why = "git does not track it there; add `create: true` to this entry to create a new file"
        listed = names(ctx.check(git("ls-files", "-z"), "git ls-files failed", timeout=60, quiet=True).out)
        guess = closest(change.dest, listed)
        hint = f"; did you mean {guess}?" if guess else ""
        raise ConfigError(f"{where}: {change.dest} on {ctx.host_name}: {why}{hint} (nothing was changed)")


def closest(dest: str, tracked: list[str]) -> str | None:
    """The tracked path a mistyped dest most likely meant: one that ends with it (a missing leading
    directory), else the most similar name."""
    ends = [path for path in tracked if path.endswith("/" + dest)]
    if len(ends) == 1:
        return ends[0]
    found = difflib.get_close_matches(dest, ends or tracked, n=1, cutoff=0.8)
    return found[0] if found else None


def _missing_dirs(ctx: Context, dest: str, entries: dict[str, StatEntry]) -> list[str]:
    missing = []
    parent = posixpath.dirname(dest)
    while parent:
        entry = entries.get(ctx.in_repo(parent))
        if entry is not None and entry.type == "dir":
            break
        # Above the dest's own directory (missing too): ask the target.
        if entry is None and ctx.run(("test", "-d", ctx.in_repo(parent)), timeout=30).ok:
            break
        missing.append(ctx.in_repo(parent))
        parent = posixpath.dirname(parent)
    return missing  # deepest first: the order to remove them in


def apply_patch_here(ctx: Context, patch: bytes) -> dict[str, bytes]:
    """Apply the patch to copies of the target's files here, to learn the exact new bytes."""
    with tempfile.TemporaryDirectory(prefix="deployer-patch-") as tmp:
        try:
            listed = _git_apply(["--numstat", "-z", "-"], patch, tmp)
        except StepFailed as exc:  # not a patch at all: the playbook's input is wrong, not the target
            raise ConfigError(f"{ctx.playbook.model.patch}: not a patch git can read: "
                              f"{exc.stderr_tail.strip()}") from None
        paths = [entry.split("\t", 2)[2] for entry in listed.split("\0") if entry.count("\t") == 2]
        if not paths:
            raise ConfigError(f"{ctx.playbook.model.patch}: the patch changes no files")
        for dest in paths:
            try:
                check_repo_relative(dest)
            except ValueError as exc:
                raise ConfigError(f"{ctx.playbook.model.patch}: {dest}: {exc}") from None
            current = ctx.transport.get(ctx.in_repo(dest))
            if current is not None:
                Path(tmp, dest).parent.mkdir(parents=True, exist_ok=True)
                Path(tmp, dest).write_bytes(current)
        try:
            _git_apply(["-"], patch, tmp, failure=f"{ctx.playbook.model.patch} does not apply to the "
                                                   "target's current files")
        except StepFailed as refused:
            # Already applied: its reverse applies, so the files already hold what it makes (an apply of it then
            # ends `unchanged` when HEAD holds them too). Anything else that does not apply stays refused.
            try:
                _git_apply(["--reverse", "--check", "-"], patch, tmp)
            except StepFailed:
                raise refused from None
        result = {}
        for dest in paths:
            target = Path(tmp, dest)
            if not target.exists():
                raise ConfigError(f"{ctx.playbook.model.patch}: deletes {dest}; deleting files is not supported")
            result[dest] = target.read_bytes()
        return result


def _git_apply(args: list[str], patch: bytes, cwd: str, failure: str = "invalid patch") -> str:
    proc = subprocess.run(["git", "apply", *args], input=patch, cwd=cwd, capture_output=True,
                          timeout=60, check=False)
    if proc.returncode != 0:
        raise StepFailed(STEP, failure, command="git apply " + " ".join(args) + "  (run here, on copies of the "
                         "target's files)", exit_code=proc.returncode,
                         stderr_tail=proc.stderr.decode(errors="replace"))
    return proc.stdout.decode(errors="replace")
