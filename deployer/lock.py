"""The deploy lock on the target: an atomic mkdir inside the repo's .git directory.

The directory holds `info.json` (who, which run, since when) and `heartbeat`, whose
mtime the running apply refreshes. Ages are measured with the target's own clock, so a
skewed operator clock cannot make a live lock look stale.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import threading
from dataclasses import dataclass
from datetime import datetime, timezone

from deployer.errors import DeployerError, LockHeld
from deployer.transport.base import Transport

LOCK_NAME = "deployer.lock"
_AGE_SCRIPT = 'date +%s; stat -c %Y -- "$1" 2>/dev/null || echo missing'


@dataclass(frozen=True)
class LockState:
    path: str
    info: dict[str, object]
    heartbeat_age_s: float | None
    ttl_s: float

    @property
    def stale(self) -> bool:
        return self.heartbeat_age_s is None or self.heartbeat_age_s > self.ttl_s

    def describe(self) -> str:
        info = self.info
        since = info.get("started", "?")
        age = "unknown" if self.heartbeat_age_s is None else f"{self.heartbeat_age_s:.0f}s ago"
        text = (f"held by run {info.get('run_id', '?')} of {info.get('operator', '?')} (pid {info.get('pid', '?')}) "
                f"since {since}; last heartbeat {age}")
        if self.stale:
            text += (f" — STALE (older than the {self.ttl_s:.0f}s TTL); if that run is really gone, "
                     "remove it with: deployer lock release --host HOST --force")
        return text


def lock_path(git_dir: str) -> str:
    return posixpath.join(git_dir, LOCK_NAME)


def read_state(transport: Transport, git_dir: str, ttl_s: float) -> LockState | None:
    path = lock_path(git_dir)
    raw = transport.get(posixpath.join(path, "info.json"))
    exists = raw is not None or transport.run(("test", "-d", path), timeout=30).ok
    if not exists:
        return None
    try:
        info = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        info = {}
    out = transport.run(("sh", "-c", _AGE_SCRIPT, "sh", posixpath.join(path, "heartbeat")), timeout=30).out.split()
    age = float(out[0]) - float(out[1]) if len(out) == 2 and out[1].isdigit() else None
    return LockState(path, info, age, float(str(info.get("ttl_s", ttl_s))))


class DeployLock:
    """Held for one run; refreshes its heartbeat from a thread until released."""

    def __init__(self, transport: Transport, git_dir: str, info: dict[str, object], ttl_s: float) -> None:
        self.transport = transport
        self.path = lock_path(git_dir)
        self.info = {**info, "ttl_s": ttl_s,
                     "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self.ttl_s = ttl_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        made = self.transport.run(("mkdir", "--", self.path), timeout=30)
        if not made.ok:
            if not self.transport.run(("test", "-d", self.path), timeout=30).ok:
                # Not held: mkdir failed for another reason (a file in the way, permissions, a full disk).
                raise DeployerError(f"cannot create the deploy lock {self.path}: {made.err.strip()}")
            state = read_state(self.transport, posixpath.dirname(self.path), self.ttl_s)
            if state is None:  # released between our mkdir and our read: say so rather than retry silently
                raise LockHeld(f"the deploy lock {self.path} was busy a moment ago; try again")
            raise LockHeld(f"the deploy lock {self.path} is {state.describe()}")
        try:
            self.transport.put(json.dumps(self.info, indent=1).encode(), posixpath.join(self.path, "info.json"),
                               mode=0o600)
            self._beat()
        except BaseException:
            with contextlib.suppress(DeployerError):  # never leave a lock nobody holds, if we still can
                self.transport.run(("rm", "-rf", "--", self.path), timeout=30)
            raise
        self._thread = threading.Thread(target=self._loop, name="deployer-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self.transport.run(("touch", "--", posixpath.join(self.path, "heartbeat")), timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(max(self.ttl_s / 4, 0.5)):
            # A missed beat only makes the lock look older; the next one may get through.
            with contextlib.suppress(DeployerError):
                self._beat()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=35)
        # Only remove the lock if it is still ours (a forced release may have handed it on).
        current = self.transport.get(posixpath.join(self.path, "info.json"))
        try:
            holder = json.loads(current).get("run_id") if current is not None else None
        except json.JSONDecodeError:
            holder = None  # not ours to judge: leave it for `lock status` to show
        if holder == self.info.get("run_id"):
            self.transport.run(("rm", "-rf", "--", self.path), timeout=30)


def force_release(transport: Transport, git_dir: str) -> bool:
    path = lock_path(git_dir)
    if not transport.run(("test", "-d", path), timeout=30).ok:
        return False
    result = transport.run(("rm", "-rf", "--", path), timeout=30)
    if not result.ok:
        raise DeployerError(f"cannot remove {path}: {result.err.strip()}")
    return True
