"""The run's artifacts: an append-only, hash-chained JSONL event log, and its reader.

Every line carries the sha256 of the line before it, so an edited, removed or reordered
line breaks the chain; a run that ends writes `run_end`, so a truncated log is detectable.
Files are 0600 in a 0700 directory: the log holds commands and output from production hosts.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from deployer.errors import ConfigError, DeployerError

GENESIS = "0" * 64
EVENTS = "events.jsonl"
# Disk held for the log's end from the run's start (RunLogWriter.keep_room): a run_end (its facts, an error)
# is a few KiB; the rest lets the run record's last write go through with it.
END_ROOM = ".end-room"
END_ROOM_BYTES = 256 * 1024


def new_run_id(now: datetime | None = None) -> str:
    # Milliseconds, so ids sort in start order (runs list, "newest run") even within one second.
    moment = now or datetime.now(timezone.utc)
    return f"{moment:%Y%m%dT%H%M%S}.{moment.microsecond // 1000:03d}Z-{secrets.token_hex(3)}"


def is_run_id(text: str) -> bool:
    """Shaped like new_run_id's ids: a name read from a target must be one before it names a run dir."""
    return re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{6}", text) is not None


def operator_id() -> str:
    """Who runs deployer, as each run log and lock records it."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Where runs were kept before one history per user: relative to the cwd, so each directory had its own.
CWD_RUNS_DIR = Path(".deployer/runs")


def user_runs_dir() -> Path:
    """This user's one history, the same from any directory (XDG's state dir: it outlives a cache)."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "deployer" / "runs"


def runs_dir_from(explicit: str | None, cwd_notice: Callable[[str], object] | None = None) -> Path:
    """--runs-dir, else $DEPLOYER_RUNS_DIR, else the cwd's .deployer/runs where there is one (its runs stay
    found where they were made; cwd_notice is told so), else this user's history."""
    chosen = explicit or os.environ.get("DEPLOYER_RUNS_DIR")
    if chosen:
        return Path(chosen)
    if CWD_RUNS_DIR.is_dir():
        found = CWD_RUNS_DIR.absolute()
        if cwd_notice is not None:
            cwd_notice(f"using ./{CWD_RUNS_DIR}, this directory's run history; deployer's default is now one history "
                       f"per user, found from any directory ({user_runs_dir()}): move these runs there and remove "
                       f"./{CWD_RUNS_DIR} to use it")
        return found
    return user_runs_dir()


def _line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def seal(record: dict[str, Any]) -> bytes:
    """The line for record, ending in the sha256 of everything before it: the last line is covered too."""
    body = json.dumps(record).encode()
    return body[:-1] + b', "line_sha256": "' + _line_hash(body).encode() + b'"}'


def _seal_intact(line: bytes, event: dict[str, Any]) -> bool:
    unsealed = {k: v for k, v in event.items() if k != "line_sha256"}
    return "line_sha256" in event and seal(unsealed) == line


class RunLogWriter:
    """Appends events; each write is one os.write of a whole line.

    A killed deployer loses nothing written (the kernel holds it). What a machine crash could lose is bounded
    by sync(): the engine makes the log durable before every run-state record (so the record never gets ahead
    of the log), before a commit names the log's hash in its trailer, and at close. An fsync per event cost
    a run ~60 of them, up to tens of milliseconds on a busy disk."""

    def __init__(self, runs_dir: Path, run_id: str) -> None:
        self.run_id = run_id
        self.dir = runs_dir / run_id
        runs_dir.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700)
        os.chmod(self.dir, 0o700)  # the umask may have narrowed or widened mkdir's mode
        self._fd = os.open(self.dir / EVENTS, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._seq = 0
        self._prev = GENESIS
        self._sha256 = hashlib.sha256()  # of every byte written: the commit's Deployer-Log trailer
        self._synced = True

    @classmethod
    def reopen(cls, runs_dir: Path, run_id: str) -> RunLogWriter:
        """Continue an ended (or cut) run's chain (to end it, or link it to a later run); the chain stays
        verifiable. A last line a kill cut short was never a whole event: it is cut off, and the first line
        written after says how many bytes it had and their sha256 (appended to, it would make the line
        after it unreadable too, and the log never verify)."""
        writer = cls.__new__(cls)
        writer.run_id, writer.dir = run_id, runs_dir / run_id
        data = (writer.dir / EVENTS).read_bytes()
        whole = data[:data.rfind(b"\n") + 1]
        torn = data[len(whole):]
        lines = whole.splitlines()
        writer._fd = os.open(writer.dir / EVENTS, os.O_WRONLY | os.O_APPEND)
        writer._seq, writer._prev = len(lines), _line_hash(lines[-1]) if lines else GENESIS
        writer._sha256 = hashlib.sha256(whole)
        writer._synced = True
        if torn:
            os.ftruncate(writer._fd, len(whole))
            writer.write({"type": "torn_line_dropped", "bytes": len(torn), "sha256": hashlib.sha256(torn).hexdigest(),
                          "why": "the run was killed while it wrote this line: it never held a whole event"})
        return writer

    def write(self, event: dict[str, Any]) -> None:
        record = {"seq": self._seq, "time": utc_now(), "run": self.run_id, **event, "prev": self._prev}
        line = seal(json.loads(json.dumps(record, default=str)))
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(line + b"\n")
            while view:  # a full disk may take part of a line: write the rest, or fail
                view = view[os.write(self._fd, view):]
        except OSError:
            with contextlib.suppress(OSError):  # no torn line: the log ends with the last whole event
                os.ftruncate(self._fd, start)
            raise
        self._sha256.update(line + b"\n")
        self._prev = _line_hash(line)
        self._seq += 1
        self._synced = False

    def sync(self) -> None:
        """Every event written so far on disk (see the class)."""
        if not self._synced:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise DeployerError(f"the run log {self.dir} could not be flushed to disk "
                                    f"({exc.strerror or exc})") from None
            self._synced = True

    def sha256(self) -> str:
        """The sha256 of the log as written so far."""
        return self._sha256.hexdigest()

    def keep_room(self) -> None:
        """Hold END_ROOM_BYTES of the runs dir's disk until free_room: a disk that fills while the run goes on
        (once the commit is sent, nothing may stop it) still takes the run's end, so the log never says less than
        the target holds. Without that room (a file-size limit) the run still goes: its end may then not fit,
        and the run says so (engine.execute)."""
        with contextlib.suppress(OSError):
            fd = os.open(self.dir / END_ROOM, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, END_ROOM_BYTES)
            finally:
                os.close(fd)

    def free_room(self) -> None:
        """Give back the room kept for the end: right before the end is written."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.dir / END_ROOM)

    def attach(self, name: str, data: bytes) -> None:
        """Store an artifact (playbook copy, diff) beside the log; its hash goes into the chain."""
        path = self.dir / name
        # Whole or absent: recover reads a run's playbook copy, and a run killed before it kept one (right after
        # its run_start) had not reached the target; a half-written copy would stop that recover.
        partial = self.dir / f".{name}.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.link(partial, path)  # fails, as the O_EXCL open did, where the artifact exists already
        os.unlink(partial)
        self.write({"type": "artifact", "name": name, "sha256": hashlib.sha256(data).hexdigest(),
                    "size": len(data)})

    def close(self) -> None:
        try:
            self.sync()
        finally:
            os.close(self._fd)


def record_run(runs_dir: Path, host: str, kind: str, operator: str, events: list[dict[str, Any]]) -> str:
    """A run of its own for an act outside any apply (a forced lock release): start, the events, end."""
    run_id = new_run_id()
    log = RunLogWriter(runs_dir, run_id)
    try:
        log.write({"type": "run_start", "host": host, "operator": operator, "kind": kind})
        for event in events:
            log.write({**event, "host": host})
        log.write({"type": "run_end", "host": host, "status": "successful", "exit_code": 0, "git": {}})
    finally:
        log.close()
    return run_id


@dataclass
class Run:
    """A run as its log tells it."""

    run_id: str
    dir: Path
    events: list[dict[str, Any]] = field(default_factory=list)

    def first(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("type") == kind), None)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    @property
    def start(self) -> dict[str, Any]:
        return self.first("run_start") or {}

    @property
    def end(self) -> dict[str, Any] | None:
        """run_end, as the target's end note proved it when the run lost its answer and recover found the note
        (its recovered_by line says so: `end`, and how it learnt it)."""
        end = self.first("run_end")
        proved = [link["end"] for link in self.all("recovered_by") if isinstance(link.get("end"), dict)]
        return {**end, **proved[-1]} if end is not None and proved else end

    @property
    def status(self) -> str:
        end = self.end
        return str(end["status"]) if end else "incomplete"

    @property
    def git(self) -> dict[str, Any]:
        end = self.end
        if end:
            git = dict(end.get("git") or {})
            # Cut while committing, the run never learnt its commit's hash (cut before its chain sent whole was
            # answered, not even HEAD before it); the recover that found them says.
            links = self.all("recovered_by")
            for key, found in (("after", "commit"), ("before", "before")):
                known = [link[found] for link in links if link.get(found)]
                if known and not git.get(key):
                    git[key] = known[-1]
            return git
        # A killed run has no run_end; its preflight still says where HEAD was.
        preflight = self.first("preflight")
        commit = self.first("commit")
        return {"before": preflight.get("head") if preflight else None,
                "after": commit.get("commit") if commit else None}


    @property
    def commits(self) -> list[str]:
        """Every commit the run made on its target, in order: its own (the fix), and a revert (a rollback's, an
        on_failure rollback's, a recover's)."""
        made = [self.git.get("after"), *(e.get("commit") for e in self.all("commit")),
                *(e.get("commit") for e in self.all("rollback"))]
        return list(dict.fromkeys(str(c) for c in made if c))


def read_run(runs_dir: Path, run_id: str) -> Run:
    path = runs_dir / run_id / EVENTS
    if not path.is_file():
        raise ConfigError(f"no run {run_id!r} in {runs_dir} (see 'deployer runs list')")
    return Run(run_id, path.parent, _events(path.read_bytes()))


def list_runs(runs_dir: Path) -> list[Run]:
    if not runs_dir.is_dir():
        return []
    return [read_run(runs_dir, p.name) for p in sorted(runs_dir.iterdir()) if (p / EVENTS).is_file()]


def verify(runs_dir: Path, run_id: str) -> list[str]:
    """Every problem with the run's log and artifacts; an empty list means it verifies."""
    path = runs_dir / run_id / EVENTS
    if not path.is_file():
        raise ConfigError(f"no run {run_id!r} in {runs_dir}")
    data = path.read_bytes()
    problems: list[str] = []
    if data and not data.endswith(b"\n"):
        problems.append("the last line is cut short (truncated)")
    prev = GENESIS
    saw_end = False
    for index, line in enumerate(data.splitlines()):
        number = index + 1
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"line {number}: not valid JSON")
            prev = _line_hash(line)
            continue
        if event.get("seq") != index:
            problems.append(f"line {number}: sequence number {event.get('seq')} where {index} was expected "
                            "(a line was removed or inserted)")
        if not _seal_intact(line, event):
            problems.append(f"line {number}: its content does not match its own hash (edited line)")
        if event.get("prev") != prev:
            problems.append(f"line {number}: does not chain to the line before it (edited or removed line)")
        if event.get("run") != run_id:
            problems.append(f"line {number}: belongs to run {event.get('run')!r}")
        if event.get("type") == "artifact":
            problems.extend(_check_artifact(path.parent, event))
        saw_end = saw_end or event.get("type") == "run_end"
        prev = _line_hash(line)
    if not saw_end:
        problems.append("no run_end event: the log was truncated, or the run was killed before it ended (then "
                        "`deployer recover` with this run's id ends it)")
    return problems + _check_links(runs_dir, run_id, data)


def anchored_lines(data: bytes, sha256: str) -> int | None:
    """How many first lines of a log hash to sha256 (a commit's Deployer-Log), or None when no beginning does.

    A log rewritten wholesale verifies on its own (every hash recomputed); the target's commit still
    holds the hash of what the log said when the commit was made."""
    digest = hashlib.sha256()
    for count, line in enumerate([b"", *data.splitlines(keepends=True)]):
        digest.update(line)
        if digest.hexdigest() == sha256:
            return count
    return None


def _check_links(runs_dir: Path, run_id: str, data: bytes) -> list[str]:
    """Lines after run_end (rollback links) have no later line to vouch for them; the rollback runs do."""
    linked = {str(e.get("by")) for e in _events(data) if e.get("type") == "rolled_back_by"}
    return [f"run {run.run_id} rolled this run back, but the rolled_back_by line for it is missing "
            "(removed from the end of the log?)"
            for run in list_runs(runs_dir)
            if run.start.get("rollback_of") == run_id and run.end is not None and run.run_id not in linked]


def _events(data: bytes) -> list[dict[str, Any]]:
    events = []
    for number, line in enumerate(data.splitlines(), 1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            # A torn last line (the process was killed mid-write) must not hide the rest.
            events.append({"type": "unparseable", "line": number})
    return events


def _check_artifact(directory: Path, event: dict[str, Any]) -> list[str]:
    name = str(event.get("name"))
    artifact = directory / name
    if not artifact.is_file():
        return [f"artifact {name} is missing"]
    if hashlib.sha256(artifact.read_bytes()).hexdigest() != event.get("sha256"):
        return [f"artifact {name} was changed after the run recorded it"]
    return []
