"""The intent record on the target: `<git dir>/deployer/inflight.json`, beside the lock.

It names the run, its operator, HEAD before the run and every dest with its pre-run sha256, owner and
mode, so an operator on another machine can see an interrupted run and recover it from git's own objects.
It is written before the first change and removed only once the target is consistent again.

Anyone who can write the repo can write this record, and `recover --host` may act on it as root (`become`):
it is read as untrusted input. Its fields are checked here for type and form; vet.py checks the rest against
the target itself before recover acts on any of it.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from deployer.agent.client import Pending
from deployer.agent.protocol import Put, PutReply
from deployer.config.models import check_repo_relative
from deployer.errors import DeployerError, RecordRefused
from deployer.runstate import FileRecord
from deployer.steps.git import trailers
from deployer.steps.gitops import OBJECT_ID
from deployer.text import printable, shown
from deployer.transport.base import Transport

NAME = "inflight.json"
# What new_run_id makes: the id also names a run dir on this machine, so nothing else may pass.
RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}\.[0-9]{3}Z-[0-9a-f]{6}")
SHA256 = re.compile(r"[0-9a-f]{64}")
TEXT_CHARS = 256
MAX_FILES = 10_000
# Permission bits only: a restore never makes a file setuid, setgid or sticky.
PERMISSIONS = 0o777
MAX_ID = 2**32 - 1


class Intent(BaseModel):
    run_id: str
    operator: str
    host: str
    started: str
    head_before: str
    trailer: str
    files: list[FileRecord]


def path_in(git_dir: str) -> str:
    return posixpath.join(git_dir, "deployer", NAME)


def write_ahead(transport: Transport, git_dir: str, intent: Intent) -> Pending[PutReply]:
    """Send the record without waiting: the changes sent after it run only once it is on the target."""
    # The pre-run copies stay on this machine; the target keeps only what names and checks them.
    shared = intent.model_copy(update={"files": [f.model_copy(update={"before": None}) for f in intent.files]})
    return transport.write_ahead(Put(path_in(git_dir), shared.model_dump_json(indent=1).encode(), mode=0o600,
                                     keep_owner=True, mkdirs=True))


def read(transport: Transport, git_dir: str, host: str) -> Intent | None:
    return parse(transport.get(path_in(git_dir)), git_dir, host)


def parse(raw: bytes | None, git_dir: str, host: str) -> Intent | None:
    """The intent record from its bytes (None: there is none); one that is malformed, or whose fields could
    make recover act outside what a run does, is refused (RecordRefused, naming the field)."""
    if raw is None:
        return None
    where = path_in(git_dir)
    try:
        found = Intent.model_validate(json.loads(raw))
    except ValidationError as exc:  # before ValueError, which it is too
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "(the whole record)"
        raise refused(where, host, field, error.get("input"), error["msg"]) from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise refused(where, host, "(the whole record)", raw, f"it is not JSON ({exc})") from None
    problem = _problem(found)
    if problem is not None:
        raise refused(where, host, *problem)
    return found


def refused(where: str, host: str, field: str, value: object, why: str) -> RecordRefused:
    return RecordRefused(
        f"the intent record {where} on the target is refused: {field} is {shown(value)}: {why}. Nothing was "
        f"changed; the record and the deploy lock are left on the target. Look at the record by hand there; "
        f"once the target is checked and no run is in flight, remove it (rm -f -- {where}) and the lock "
        f"(deployer lock release --host {host} --force)")


def _problem(found: Intent) -> tuple[str, object, str] | None:
    """The first field that is not what deployer writes: (field, value, why); None when every one is."""
    if not RUN_ID.fullmatch(found.run_id):
        return "run_id", found.run_id, "not a run id deployer makes"
    if found.trailer != trailers(Deployer_Run=found.run_id):
        return "trailer", found.trailer, f"the run's trailer is {trailers(Deployer_Run=found.run_id)!r}"
    if not OBJECT_ID.fullmatch(found.head_before):
        return "head_before", found.head_before, "not a commit id"
    for name in ("operator", "host", "started"):
        if not printable(getattr(found, name), TEXT_CHARS):
            return name, getattr(found, name), f"longer than {TEXT_CHARS} characters or not printable"
    if len(found.files) > MAX_FILES:
        return "files", len(found.files), f"more than {MAX_FILES} files"
    for index, rec in enumerate(found.files):
        if (problem := file_problem(rec)) is not None:
            name, value, why = problem
            return f"files[{index}].{name}", value, why
    return None


def file_problem(rec: FileRecord) -> tuple[str, object, str] | None:
    try:
        normal = check_repo_relative(rec.dest)
    except ValueError as exc:
        return "dest", rec.dest, str(exc)
    if normal != rec.dest:
        return "dest", rec.dest, f"not in normal form ({normal!r})"
    if rec.existed != (rec.sha256 is not None):
        return "sha256", rec.sha256, f"a pre-run sha256 goes with a file that existed (existed is {rec.existed})"
    if rec.sha256 is not None and not SHA256.fullmatch(rec.sha256):
        return "sha256", rec.sha256, "not a sha256"
    if not SHA256.fullmatch(rec.new_sha256):
        return "new_sha256", rec.new_sha256, "not a sha256"
    if rec.new_blob is not None and not OBJECT_ID.fullmatch(rec.new_blob):
        return "new_blob", rec.new_blob, "not a git object id"
    if rec.mode is not None and not 0 <= rec.mode <= PERMISSIONS:
        return "mode", oct(rec.mode), "only permission bits (0..0o777): no setuid, setgid or sticky bit"
    for name in ("uid", "gid"):
        number = getattr(rec, name)
        if number is not None and not 0 <= number <= MAX_ID:
            return name, number, "not a user or group id"
    if rec.new_dirs and rec.existed:
        return "new_dirs", rec.new_dirs, "a file that existed needed no new directories"
    if rec.before is not None:
        return "before", rec.before, "the target's record never names a copy in a run dir"
    return None


def remove(transport: Transport, git_dir: str, after: Pending[Any] | None = None) -> Callable[[], None]:
    """Send the removal now (so it can share a round trip; run only if `after` succeeded, when given); the
    returned check raises if it failed or was skipped."""
    pending = transport.submit_run(("rm", "-f", "--", path_in(git_dir)), timeout=30, after=after)

    def check() -> None:
        result = pending.result()
        if not result.ok:
            raise DeployerError(f"cannot remove the intent record {path_in(git_dir)}: {result.err.strip()}")
    return check
