"""What the target's intent record may make `recover` do, checked against the target before it does any of it.

intent.py checks the record's form; this checks what the record claims against the target's own state, so a
crafted record cannot make recover (root, with `become`) write, remove or chown anything a run could not have:
- every path is derived from the repo and the dest, and the dest resolves, without a symlink, to itself
  inside the work tree and outside the git dir;
- a run's new directories are the dest's own missing ancestors inside the work tree;
- a file that existed gets back the bytes git holds for its dest at the record's HEAD, and no other owner than
  the one it has now (or, when it is gone, the owner of the directory it goes back into);
- a file that did not exist is removed only while it holds the run's new bytes;
- the staged temps it removes are named from the vetted path and new_sha256 (steps.upload.staged_temp) and the
  listing of TEMP_GLOB beside the dests, never from a name the record carries.
"""

from __future__ import annotations

import hashlib
import posixpath

from deployer.agent.protocol import Stat, StatEntry
from deployer.errors import DeployerError, StepFailed
from deployer.run.intent import Intent, path_in, refused
from deployer.run.preflight import refuse_unsafe_dests
from deployer.runstate import FileRecord
from deployer.steps.context import Context, Submitted
from deployer.steps.gitops import git, git_dirs_argv, names


def vetted(ctx: Context, pending: Intent) -> list[FileRecord]:
    """The record's files, once each is what a run of deployer could have left; else RecordRefused."""
    assert ctx.git_dir is not None
    where = path_in(ctx.git_dir)
    paths = [ctx.in_repo(rec.dest) for rec in pending.files]
    for index, (rec, path) in enumerate(zip(pending.files, paths, strict=True)):
        if rec.path != path:
            raise refused(where, ctx.host_name, f"files[{index}].path", rec.path,
                          f"the path of dest {rec.dest!r} in this host's repo is {path!r}")
        for directory in rec.new_dirs:
            if directory not in _ancestors(ctx, rec.dest):
                raise refused(where, ctx.host_name, f"files[{index}].new_dirs", directory,
                              f"not a directory of dest {rec.dest!r} inside the work tree")
    dirs = sorted({d for rec in pending.files for d in _ancestors(ctx, rec.dest)})
    found = ctx.submit(git_dirs_argv(ctx.repo), timeout=30, quiet=True)
    stats = ctx.transport.submit(Stat((ctx.repo, *paths, *dirs), sha256=True))
    blobs: dict[str, Submitted] = {
        rec.dest: ctx.submit(git("cat-file", "blob", f"{pending.head_before}:{rec.dest}"), timeout=60, quiet=True,
                             capture=None) for rec in pending.files if rec.existed}
    git_dirs = names(found.check(f"cannot find the git dirs of {ctx.repo} on the target").out)
    entries = {entry.path: entry for entry in stats.result()}
    for index, rec in enumerate(pending.files):
        problem = _problem(ctx, rec, pending.head_before, entries, git_dirs, blobs.get(rec.dest))
        if problem is not None:
            name, value, why = problem
            raise refused(where, ctx.host_name, f"files[{index}].{name}", value, why)
    return pending.files


def _ancestors(ctx: Context, dest: str) -> list[str]:
    """The dest's directories below the repo, deepest first."""
    found = []
    parent = posixpath.dirname(dest)
    while parent:
        found.append(ctx.in_repo(parent))
        parent = posixpath.dirname(parent)
    return found


def _problem(ctx: Context, rec: FileRecord, head: str, entries: dict[str, StatEntry], git_dirs: list[str],
             blob: Submitted | None) -> tuple[str, object, str] | None:
    now = entries[rec.path]
    try:
        refuse_unsafe_dests([rec.dest], entries[ctx.repo], git_dirs, [now])
    except StepFailed as exc:
        return "dest", rec.dest, str(exc).removeprefix("step 'preflight' failed: ")
    if now.exists and now.type != "file":
        return "dest", rec.dest, f"it is a {now.type} on the target, and a run only writes regular files"
    if not rec.existed:
        if now.exists and now.sha256 != rec.new_sha256:
            return "new_sha256", rec.new_sha256, (f"{rec.dest} holds other bytes (sha256 {now.sha256}) on the "
                                                  "target: removing it would lose what is not the run's")
        return None
    assert blob is not None
    held = _blob(blob)
    if not rec.tracked or held is None or hashlib.sha256(held).hexdigest() != rec.sha256:
        return "sha256", rec.sha256, f"git does not hold these bytes for {rec.dest!r} at {head[:12]}"
    if rec.uid is not None or rec.gid is not None:
        owner = now if now.exists else next(
            (entries[d] for d in [*_ancestors(ctx, rec.dest), ctx.repo] if entries[d].exists), entries[ctx.repo])
        if (rec.uid, rec.gid) != (owner.uid, owner.gid):
            whose = "the file has" if now.exists else f"its directory {owner.path} has"
            return "uid/gid", f"{rec.uid}:{rec.gid}", (f"an owner the run could not have changed; {whose} "
                                                   f"{owner.uid}:{owner.gid} on the target")
    return None


def _blob(blob: Submitted) -> bytes | None:
    try:
        result = blob.result()
    except DeployerError:
        return None
    return bytes(result.stdout) if result.ok else None

