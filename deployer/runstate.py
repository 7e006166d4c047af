"""The run's state machine and its write-ahead record (`state.json` and `before/` in the run dir).

The record is written *before* each transition's remote effect: whatever cuts the run (a kill, a lost link,
a full disk), `state.json` names the furthest point the target may have reached, and `before/` holds the
bytes, owner and mode needed to undo it without the process that started the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, Field

from deployer.errors import DeployerError
from deployer.runowner import Owner

STATE = "state.json"
BEFORE = "before"
# Room the run dir must have before anything changes: events, the state record, the pre-run copies.
HEADROOM_BYTES = 8 * 1024 * 1024


class Phase(str, Enum):
    preparing = "preparing"  # run dir made; nothing on the target yet
    locked = "locked"  # the deploy lock (and then the intent record) may be on the target
    changing = "changing"  # files may be partly written
    changed = "changed"  # every file written; not committed
    committing = "committing"  # git add/commit may have run: look for the run's trailer
    committed = "committed"  # the run's commit is HEAD
    restarting = "restarting"  # services may be down or on the new code
    verifying = "verifying"  # checks against the running services
    succeeded = "succeeded"
    # Nothing to do: every dest already held its shipped bytes at HEAD, so the run changed nothing (services
    # restarted only when asked: `apply --restart`).
    unchanged = "unchanged"
    failed_restored = "failed_restored"  # failed before the commit; files hold their pre-run bytes
    failed_committed = "failed_committed"  # failed after the commit; the commit stays (on_failure: restore)
    rolling_back = "rolling_back"  # a revert commit and a restart may be under way
    rolled_back = "rolled_back"
    interrupted = "interrupted"  # stopped in between: `deployer recover` ends it


FORWARD = (Phase.preparing, Phase.locked, Phase.changing, Phase.changed, Phase.committing, Phase.committed,
           Phase.restarting, Phase.verifying, Phase.succeeded)
TERMINAL = frozenset({Phase.succeeded, Phase.unchanged, Phase.failed_restored, Phase.failed_committed,
                      Phase.rolled_back})
# Phases in which the target may hold the run's commit: a failure there is no longer undone by a restore.
PAST_COMMIT = frozenset({Phase.committed, Phase.restarting, Phase.verifying, Phase.rolling_back})
# Pairs that may alternate: a playbook may upload twice, or verify and restart again.
_LOOPS = (frozenset({Phase.changing, Phase.changed}), frozenset({Phase.restarting, Phase.verifying}))


def git_blob_id(data: bytes) -> str:
    """The id git gives these bytes as a blob (SHA-1 object format)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def allowed(old: Phase, new: Phase) -> bool:
    if old in TERMINAL:
        return False
    if (old, new) == (Phase.changing, Phase.locked):
        # Changes sent with the lock whose premise the agent answered did not hold: it ran none of them.
        return True
    if (old, new) == (Phase.interrupted, Phase.succeeded):
        # Recover: the run ended on the target and lost the answer; its end note there says it succeeded.
        return True
    if new in FORWARD:
        if old not in FORWARD:
            return False
        return FORWARD.index(new) > FORWARD.index(old) or any({old, new} <= loop for loop in _LOOPS)
    return {
        # Any phase of a run that made no commit (a restart-only playbook restarts without one).
        Phase.failed_restored: old != Phase.rolling_back,
        Phase.failed_committed: old in PAST_COMMIT - {Phase.rolling_back} or old in (Phase.interrupted,
                                                                                   Phase.committing),
        # A rollback run of its own goes straight from locked to rolling_back.
        Phase.rolling_back: old in PAST_COMMIT or old in (Phase.interrupted, Phase.committing, Phase.locked),
        Phase.rolled_back: old == Phase.rolling_back,
        # Found already applied in preflight; with --restart, after restarting and checking the services.
        Phase.unchanged: old in (Phase.preparing, Phase.locked, Phase.restarting, Phase.verifying),
        Phase.interrupted: True,
    }[new]


class RunRecordError(DeployerError):
    """The run dir on this machine cannot be written: the run must not change the target further."""

    exit_code = 1


class FileRecord(BaseModel):
    """One dest as it was before the run, and what the run puts there."""

    dest: str
    path: str
    existed: bool
    tracked: bool
    sha256: str | None  # of the pre-run bytes; None when the file did not exist
    new_sha256: str
    new_blob: str | None = None  # git's object id of the new bytes: an index entry with it was staged by the run
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    new_dirs: list[str] = Field(default_factory=list)  # directories the run creates, deepest first
    before: str | None = None  # the copy of the pre-run bytes, relative to the run dir


class Transition(BaseModel):
    phase: Phase
    time: str


class RunState(BaseModel):
    run_id: str
    host: str
    operator: str
    kind: str = "apply"  # apply | rollback | recover | restart
    # The process of this machine running the run, on disk before it takes the lock: recover's proof that a run of
    # this machine is gone (None: not recorded, or not judged on this system).
    owner: Owner | None = None
    phase: Phase = Phase.preparing
    repo: str
    git_dir: str | None = None
    git_before: str | None = None
    git_after: str | None = None
    trailer: str | None = None  # the line the run's commit carries: how recovery finds it
    rollback_of: str | None = None
    rollback_commit: str | None = None
    checks_failed: list[str] = Field(default_factory=list)  # rolled_back, but the reverted build failed these
    files: list[FileRecord] = Field(default_factory=list)
    # Steps sent with the changes, behind the checks before them (a commit): on the target they may have run
    # before their turn, even when the run stopped before it (recover looks for the commit by its trailer).
    sent_ahead: list[str] = Field(default_factory=list)
    history: list[Transition] = Field(default_factory=list)
    error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL


class RunRecord:
    """The state of one run, kept on disk: every change is durable before the caller goes on."""

    def __init__(self, run_dir: Path, state: RunState, before_write: Callable[[], None] | None = None) -> None:
        self.dir = run_dir
        self.state = state
        self._before_write = before_write  # the run log's sync: no record gets ahead of the log

    @classmethod
    def load(cls, run_dir: Path) -> RunRecord | None:
        path = run_dir / STATE
        if not path.is_file():
            return None
        return cls(run_dir, RunState.model_validate_json(path.read_bytes()))

    def advance(self, phase: Phase, now: str, **fields: object) -> None:
        """Move to phase (and set fields) on disk first; refuses a transition the machine does not have."""
        if phase != self.state.phase and not allowed(self.state.phase, phase):
            raise ValueError(f"run {self.state.run_id}: no transition {self.state.phase.value} -> {phase.value}")
        updated = self.state.model_copy(update={**fields, "phase": phase})
        if phase != self.state.phase:
            updated.history = [*self.state.history, Transition(phase=phase, time=now)]
        self._write(STATE, updated.model_dump_json(indent=1).encode())
        self.state = updated

    def update(self, **fields: object) -> None:
        """Record facts without a transition (the commit's hash, the files' pre-run state)."""
        updated = self.state.model_copy(update=fields)
        self._write(STATE, updated.model_dump_json(indent=1).encode())
        self.state = updated

    def keep_before(self, index: int, data: bytes) -> str:
        name = f"{BEFORE}/{index}"
        (self.dir / BEFORE).mkdir(mode=0o700, exist_ok=True)
        self._write(name, data)
        return name

    def before_bytes(self, record: FileRecord) -> bytes | None:
        """The kept pre-run bytes, if present and intact."""
        if record.before is None:
            return None
        try:
            data = (self.dir / record.before).read_bytes()
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == record.sha256 else None

    def _write(self, name: str, data: bytes) -> None:
        """temp, fsync, rename, fsync the dir: a reader sees the old record or the new one, never half."""
        path = self.dir / name
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            if self._before_write is not None:
                self._before_write()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise RunRecordError(f"cannot write the run record {path}: {exc.strerror or exc}") from None


def ensure_headroom(runs_dir: Path, need: int, left: str = "nothing was changed") -> None:
    """Refuse to start a run whose record could not be kept: the runs dir must be writable with room. `left`
    says what the target holds then."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
        probe = runs_dir / f".probe-{os.getpid()}-{threading.get_ident()}"  # a fleet runs hosts in threads
        probe.write_bytes(b"x")
        probe.unlink()
        free = shutil.disk_usage(runs_dir).free
    except OSError as exc:
        raise RunRecordError(f"the runs dir {runs_dir} is not writable ({exc.strerror or exc}); {left}. Pass "
                             "--runs-dir or set DEPLOYER_RUNS_DIR") from None
    wanted = need + HEADROOM_BYTES
    if free < wanted:
        raise RunRecordError(f"the runs dir {runs_dir} has {free // 1024} KiB free, and this run needs "
                             f"{wanted // 1024} KiB to keep its record and the files' pre-run bytes; {left}. "
                             "Free some space or pass --runs-dir")
