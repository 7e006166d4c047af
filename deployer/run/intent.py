"""The intent record on the target: `<git dir>/deployer/inflight.json`, beside the lock.

It names the run, its operator, HEAD before the run and every dest with its pre-run sha256, owner and
mode, so an operator on another machine can see an interrupted run and recover it from git's own objects.
It is written before the first change and removed only once the target is consistent again.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from deployer.agent.client import Pending, Put, PutReply
from deployer.errors import DeployerError
from deployer.run.state import FileRecord
from deployer.transport.base import Transport

NAME = "inflight.json"


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


def read(transport: Transport, git_dir: str) -> Intent | None:
    return parse(transport.get(path_in(git_dir)), git_dir)


def parse(raw: bytes | None, git_dir: str) -> Intent | None:
    """The intent record from its bytes (None: there is none)."""
    if raw is None:
        return None
    try:
        return Intent.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise DeployerError(f"the intent record {path_in(git_dir)} on the target cannot be read ({exc}); "
                            "look at it by hand before removing it") from None


def remove(transport: Transport, git_dir: str, after: Pending[Any] | None = None) -> Callable[[], None]:
    """Send the removal now (so it can share a round trip; run only if `after` succeeded, when given); the
    returned check raises if it failed or was skipped."""
    pending = transport.submit_run(("rm", "-f", "--", path_in(git_dir)), timeout=30, after=after)

    def check() -> None:
        result = pending.result()
        if not result.ok:
            raise DeployerError(f"cannot remove the intent record {path_in(git_dir)}: {result.err.strip()}")
    return check
