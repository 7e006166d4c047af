"""Read-only facts about the target gathered before anything changes: HEAD, the files' bytes, dirt."""

from __future__ import annotations

import posixpath
import subprocess
import tempfile
from pathlib import Path

from deployer.config import check_repo_relative
from deployer.context import Change, Context
from deployer.errors import ConfigError, StepFailed

STEP = "preflight"


def preflight(ctx: Context, *, allow_dirty: bool) -> None:
    """Fill ctx.git_before, ctx.git_dir and ctx.changes; refuse what would lose work."""
    if ctx.git_dir is None:
        ctx.git_dir = ctx.check(("git", "rev-parse", "--absolute-git-dir"),
                                f"{ctx.repo} is not a git checkout on the target", timeout=30).out.strip()
    ctx.git_before = ctx.check(("git", "rev-parse", "HEAD"), "cannot read HEAD", timeout=30).out.strip()
    new = _new_bytes(ctx)
    dests = sorted(new)
    _refuse_escapes(ctx, dests)
    tracked = set(filter(None, ctx.check(("git", "ls-files", "-z", "--", *dests), "git ls-files failed",
                                         timeout=30).out.split("\0")))
    # --no-optional-locks: a plain `git status` may rewrite .git/index, and a dry run writes nothing.
    status = ctx.check(("git", "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all",
                        "--", *dests), "git status failed", timeout=30).out
    dirty = sorted({entry[3:] for entry in status.split("\0") if len(entry) > 3})
    ctx.facts["dirty"] = dirty
    if dirty and not allow_dirty:
        raise StepFailed(STEP, f"the target has uncommitted changes in {', '.join(dirty)}; nothing was "
                         "changed. Commit or discard them there, or pass --allow-dirty")
    ctx.changes = []
    for dest in dests:
        path = ctx.in_repo(dest)
        old = ctx.transport.get(path)
        change = Change(dest=dest, path=path, new=new[dest], old=old, tracked=dest in tracked,
                        source=ctx.playbook.source_of(dest))
        if old is None:
            change.new_dirs = _missing_dirs(ctx, dest)
        ctx.changes.append(change)
    ctx.emit("preflight", head=ctx.git_before, git_dir=ctx.git_dir, dirty=dirty, files=[
        {"dest": c.dest, "exists": c.old is not None, "tracked": c.tracked} for c in ctx.changes])


def _new_bytes(ctx: Context) -> dict[str, bytes]:
    if ctx.playbook.patch is None:
        return dict(ctx.playbook.sources)
    return apply_patch_here(ctx, ctx.playbook.patch)


def _refuse_escapes(ctx: Context, dests: list[str]) -> None:
    """A dest that resolves outside the repo through a symlink on the target is refused."""
    paths = [ctx.repo, *(ctx.in_repo(d) for d in dests)]
    out = ctx.check(("realpath", "-m", "--", *paths), "cannot resolve the target paths", timeout=30).out
    resolved = out.splitlines()
    root = resolved[0].rstrip("/") + "/"
    for dest, real in zip(dests, resolved[1:], strict=False):
        if not real.startswith(root):
            raise StepFailed(STEP, f"{dest} resolves to {real} on the target, outside the repo "
                             "(a symlink); refusing to write through it")


def _missing_dirs(ctx: Context, dest: str) -> list[str]:
    missing = []
    parent = posixpath.dirname(dest)
    while parent:
        if ctx.run(("test", "-d", ctx.in_repo(parent)), timeout=30).ok:
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
        _git_apply(["-"], patch, tmp, failure=f"{ctx.playbook.model.patch} does not apply to the "
                                               "target's current files")
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
