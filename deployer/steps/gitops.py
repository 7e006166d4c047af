"""Every git command deployer runs on a target is built here, hardened once: fsmonitor off, hooks off unless
asked for, literal pathspecs. The reads several rooms share (HEAD, the git dir, a commit's files) live here too,
so a caller cannot build them without the hardening."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from deployer.errors import ConfigError

if TYPE_CHECKING:
    from deployer.steps.context import Context
    from deployer.transport.base import Transport


OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a commit's or blob's id: SHA-1 or SHA-256 object format


def git(*args: str, hooks: bool = False) -> tuple[str, ...]:
    """argv of a git command on the target.

    The repo's config can name programs that git runs as a side effect (core.fsmonitor, hooks);
    deployer must not run them by surprise, so fsmonitor is always off and hooks are off unless asked
    for. Pathspecs are literal: a dest like `pkg/*.py` names one file, never a pattern."""
    no_hooks = () if hooks else ("-c", "core.hooksPath=/dev/null")
    return ("git", "-c", "core.fsmonitor=false", *no_hooks, "--literal-pathspecs", *args)


def names(out: str) -> list[str]:
    """The paths of a `-z` listing."""
    return [name for name in out.split("\0") if name]


HEAD = git("rev-parse", "HEAD")
GIT_DIR = git("rev-parse", "--absolute-git-dir")
# The real paths of the git dir and of the common git dir (a linked worktree's), NUL-terminated.
_GIT_DIRS = 'cd -- "$1" && shift && realpath -z -- "$("$@" --absolute-git-dir)" "$("$@" --git-common-dir)"'


def usual_git_dir(repo: str) -> str:
    """Where the git dir of repo almost always is: a run takes its lock there before git has said so."""
    return posixpath.join(repo, ".git")


def git_dirs_argv(repo: str) -> tuple[str, ...]:
    """argv that prints the real git dir and common git dir of repo (a dest inside either is refused)."""
    return ("sh", "-c", _GIT_DIRS, "deployer-git-dirs", repo, *git("rev-parse"))


def head(ctx: Context, timeout: float = 30.0) -> str:
    """The target's HEAD, or StepFailed."""
    return ctx.check(HEAD, "cannot read HEAD", timeout=timeout).out.strip()


def git_dir(transport: Transport, repo: str) -> str:
    """repo's absolute git dir on the target, or ConfigError: it is not a git checkout."""
    result = transport.run(GIT_DIR, cwd=repo, timeout=30)
    if not result.ok:
        raise ConfigError(f"{repo} is not a git checkout on the target: {result.err.strip()}")
    return result.out.strip()


def touched_argv(commit: str) -> tuple[str, ...]:
    """argv listing the files commit changed (-z; a rename is its two paths, never one guessed move)."""
    return git("diff-tree", "--no-commit-id", "--name-only", "--no-renames", "-r", "-z", commit)


def touched_by(ctx: Context, commit: str, timeout: float = 60.0) -> list[str]:
    out = ctx.check(touched_argv(commit), "cannot list the commit's files", timeout=timeout).out
    return sorted(names(out))


def differ_argv(commit: str, other: str | None, files: Sequence[str]) -> tuple[str, ...]:
    """argv listing which of files differ between commit and other (None: the work tree), -z, renames as their
    two paths."""
    return git("diff", "--name-only", "--no-renames", "-z", commit, *((other,) if other else ()), "--", *files)


def exists_argv(name: str) -> tuple[str, ...]:
    """argv that succeeds only when the object git names so (`<commit>^{commit}`, `<commit>:<path>`) exists."""
    return git("cat-file", "-e", name)


def format_patch_argv(commit: str) -> tuple[str, ...]:
    """argv printing commit as one mail-formatted patch on stdout (`git am` applies it), the same whatever the
    repo's config says: the standard a/ b/ prefixes (diff.noprefix), no base-commit line (format.useAutoBase,
    which fails without an upstream), renames as a delete and an add (as touched_argv lists them), binary files
    whole. On stdout, so no patch file is left on the target."""
    return git("format-patch", "-1", "--stdout", "--no-base", "--no-renames", "--src-prefix=a/", "--dst-prefix=b/",
               "--binary", commit, "--")
