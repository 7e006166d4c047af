"""Give the target's files their pre-run bytes, owner and mode again: the one undo before a commit.

The engine calls it when a step fails before the commit; `deployer recover` calls it for a run that was cut.
It reads what it needs from the run's record (or the target's intent record), never from process memory,
and it is idempotent: a file that already holds its pre-run bytes is left alone.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass, field

from deployer.errors import DeployerError, RollbackFailed
from deployer.runstate import FileRecord, RunRecord
from deployer.steps.context import Context
from deployer.steps.gitops import OBJECT_ID, git, head
from deployer.steps.upload import staged_temp

# A git command killed mid-way (a timeout, a cut run's agent exiting) leaves index.lock behind, and then
# every later git command that writes the index fails. It is stale when no git process works in the repo.
_STALE_INDEX_LOCK = (
    'lock=$1; repo=$(cd -- "$2" && pwd -P) || exit 1; [ -e "$lock" ] || exit 0; '
    'for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = git ] || continue; '
    'case $(readlink "$p/cwd" 2>/dev/null) in "$repo"|"$repo"/*) exit 3;; esac; done; '
    'rm -f -- "$lock" && echo removed'
)
# Every transport names its temp files `.<name>.deployer-<random>.tmp` (or `.deployer-<random>.tmp`); an
# upload that stages for remote_compile, `.<name>.deployer-staged-<sha256>.tmp` (staged_temp).
TEMP_GLOB = ".*deployer-*.tmp"


@dataclass
class Restored:
    """What a restore put back, removed, cleaned up and undid."""
    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    temps: list[str] = field(default_factory=list)
    undid_commit: str | None = None


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def run_commits(ctx: Context, before: str, trailer: str) -> list[str]:
    """The commits after `before` that carry the run's trailer, oldest first: the run's commit, then the revert
    of its own on_failure rollback, if it got that far. A commit that only quotes the trailer is not one."""
    found = ctx.run(git("log", "--reverse", "--format=%H%x1f%B%x1e", "-F", f"--grep={trailer}", f"{before}..HEAD"),
                    timeout=30)
    commits = (entry.strip().partition("\x1f") for entry in found.out.split("\x1e")) if found.ok else ()
    return [commit for commit, _, message in commits if trailer in message.splitlines()]


# How far back from HEAD recover looks for the commit of a run whose HEAD before it is not known here.
RECENT_COMMITS = 200


def parent_of_run_commit(ctx: Context, trailer: str) -> str | None:
    """The parent of the run's own commit, looked for by its trailer among HEAD's recent history: HEAD before a
    run that was cut before this machine learnt it (a chain sent whole, run/whole.py). None: no such commit."""
    # -n counts what is printed: the trailer is matched here, so that git walks no further than those commits.
    found = ctx.check(git("log", f"-n{RECENT_COMMITS}", "--format=%H%x1f%P%x1f%B%x1e", "HEAD"),
                      "cannot read the target's recent history", timeout=30)
    entries = [entry.strip().split("\x1f", 2) for entry in found.out.split("\x1e") if entry.strip()]
    ours = [(commit, parents.split()) for commit, parents, message in (e for e in entries if len(e) == 3)
            if trailer in message.splitlines()]
    if not ours:
        return None
    commit, parents = ours[-1]  # newest first: the last is the run's own; a later one is the revert of its rollback
    if len(parents) != 1 or not OBJECT_ID.fullmatch(parents[0]):
        raise DeployerError(f"the run's commit {commit[:12]} has no single parent ({' '.join(parents) or 'none'}); "
                            "recover does not know HEAD before the run. Look at the target's history by hand")
    return parents[0]


def pre_run_bytes(ctx: Context, record: RunRecord | None, before: str, rec: FileRecord) -> bytes:
    """From the run dir when this machine has it, else from git's objects (checked against the intent)."""
    kept = record.before_bytes(rec) if record is not None else None
    if kept is not None:
        return kept
    if rec.tracked:
        blob = ctx.run(git("cat-file", "blob", f"{before}:{rec.dest}"), timeout=60, quiet=True,
                       capture=None)
        if blob.ok and sha256(blob.stdout) == rec.sha256:
            return blob.stdout
    raise RollbackFailed(f"the pre-run bytes of {rec.dest} (sha256 {str(rec.sha256)[:12]}) are neither in the "
                         f"run dir nor in git's objects at {before[:12]}; the file was left as it is")


def restore_files(ctx: Context, files: list[FileRecord], before: str, trailer: str,
                  record: RunRecord | None) -> Restored:
    """Back to `before`: drop the run's own commit, unstage, rewrite or remove each file, clear temps."""
    done = Restored()
    try:
        now = head(ctx)
        if now != before:
            done.undid_commit = _undo_own_commit(ctx, now, before, trailer)
        clear_stale_index_lock(ctx)
        staged = _staged_by_run(ctx, files)
        if staged:
            ctx.check(git("reset", "-q", "--", *staged), "cannot unstage the run's files", timeout=60)
        for rec in files:
            current = ctx.transport.get(rec.path)
            if not rec.existed:
                if current is not None:
                    ctx.check(("rm", "-f", "--", rec.path), f"cannot remove {rec.dest}", timeout=30)
                    done.removed.append(rec.dest)
            elif sha256(current) != rec.sha256:
                ctx.transport.put(pre_run_bytes(ctx, record, before, rec), rec.path, mode=rec.mode)
                if rec.uid is not None:
                    _keep_owner(ctx, rec)
                done.restored.append(rec.dest)
        done.temps = remove_temps(ctx, files)
        # After the temps: a staged one in a directory the run created would keep that directory.
        for directory in (d for rec in files if not rec.existed for d in rec.new_dirs):
            ctx.run(("rmdir", "--ignore-fail-on-non-empty", "--", directory), timeout=30)
        wrong = [f.dest for f in files if sha256(ctx.transport.get(f.path)) != f.sha256]
    except DeployerError as exc:
        if isinstance(exc, RollbackFailed):
            raise
        # Cut mid-way, the target's state is not known here: its commit may have landed (a cut in the commit's
        # batch), so say what it may hold and let recover read it.
        raise RollbackFailed(f"restoring the target failed: {exc}. The files {', '.join(f.dest for f in files)} "
                             f"may hold the new bytes, and HEAD may be this run's commit ({trailer}) on top of "
                             f"{before[:12]}. `deployer recover {ctx.run_id}` reads the target and finishes "
                             "it") from None
    if wrong:
        raise RollbackFailed(f"after the restore, {', '.join(wrong)} still differ from their pre-run bytes (did "
                             f"something else write them meanwhile?). Finish it with: deployer recover {ctx.run_id}")
    return done


def clear_stale_index_lock(ctx: Context) -> None:
    """Remove an index.lock that a killed git command of the run left, never one a live git holds."""
    assert ctx.git_dir is not None
    lock = posixpath.join(ctx.git_dir, "index.lock")
    cleared = ctx.run(("sh", "-c", _STALE_INDEX_LOCK, "deployer-index-lock", lock, ctx.repo), timeout=30)
    if cleared.exit_code == 3:
        raise RollbackFailed(f"{lock} is held by a git process still running in {ctx.repo}; wait for it, then "
                             f"finish with: deployer recover {ctx.run_id}")
    if cleared.ok and cleared.out.strip() == "removed":
        ctx.emit("index_lock_removed", path=lock)


def _staged_by_run(ctx: Context, files: list[FileRecord]) -> list[str]:
    """Dests whose index entry holds the run's new bytes: the run's `git add`, not the operator's staging."""
    listed = ctx.run(git("ls-files", "-s", "-z", "--", *(f.dest for f in files)), timeout=60)
    blobs = {}
    for entry in filter(None, listed.out.split("\0")):
        meta, _, path = entry.partition("\t")
        blobs[path] = meta.split()[1]
    return [f.dest for f in files if f.new_blob is not None and blobs.get(f.dest) == f.new_blob]


def _undo_own_commit(ctx: Context, head: str, before: str, trailer: str) -> str:
    """HEAD moved during the run: drop the commit only if it is the run's own, on top of `before`."""
    parent = ctx.run(git("rev-parse", "HEAD~1"), timeout=30).out.strip()
    message = ctx.run(git("log", "-1", "--format=%B", "HEAD"), timeout=30).out
    if parent != before or trailer not in message.splitlines():
        raise RollbackFailed(f"HEAD moved from {before} to {head} during the run, and not by this run's commit; "
                             "left as it is")
    ctx.check(git("reset", "-q", "--soft", before), "cannot undo the run's commit", timeout=60)
    return head


def _keep_owner(ctx: Context, rec: FileRecord) -> None:
    """Owner and mode as before the run, whichever path wrote the file (put, git apply, git checkout)."""
    assert rec.mode is not None
    ctx.run(("chown", f"{rec.uid}:{rec.gid}", "--", rec.path), timeout=30)
    ctx.check(("chmod", f"{rec.mode:o}", "--", rec.path), f"cannot restore the mode of {rec.dest}", timeout=30)


def remove_temps(ctx: Context, files: list[FileRecord]) -> list[str]:
    """Temp files a cut upload left beside the dests or in deployer's state dir (the ones found); only called
    under the lock. The staged temps, derived from the record, are removed whether the listing shows them or not."""
    dirs = sorted({posixpath.dirname(f.path) for f in files} | {ctx.state_dir()})
    found = ctx.run(("find", *dirs, "-maxdepth", "1", "-type", "f", "-name", TEMP_GLOB, "-print0"), timeout=30)
    temps = sorted(filter(None, found.out.split("\0")))
    if temps:
        ctx.check(("rm", "-f", "--", *temps), "cannot remove the upload's temp files", timeout=30)
    # The staged names follow from the record: gone too when the listing missed them. Unchecked: a name too
    # long for the kernel (rm says so even with -f) was never created either, and any other survivor is listed.
    ctx.run(("rm", "-f", "--", *(staged_temp(f.path, f.new_sha256) for f in files)), timeout=30)
    return temps
