"""The deploy lock on the target, inside the repo's .git directory, never seen half-taken.

A run writes its whole lock (`info.json`: who, which run, since when; `heartbeat`, whose mtime
the running apply refreshes) into a directory of its own, `deployer.run.lock.<run id>`, and only
then publishes it by creating the symlink `deployer.run.lock -> deployer.run.lock.<run id>`. Creating a
symlink is atomic and fails whatever already sits at that name (a live lock, an older
deployer's lock directory, a stray file), where rename(2) would silently replace an empty
directory. So the lock is either absent or complete. A run cut between the two leaves only a
`deployer.run.lock.<run id>` directory that no link names; `lock status` shows it and the next run
that takes the lock removes it.

Ages are measured with the target's own clock, so a skewed operator clock cannot make a live
lock look stale. A lock whose info cannot be read (an older deployer still writing it) is
"being taken" until the lock's own mtime is a TTL old.

The info is the target's word: its fields are checked for type and size, and nothing in it that is not
plain printable text is shown. Of what the target shows, liveness is the heartbeat alone, never the pid it names
(recover also reads this machine's own record of its runs: run/lease.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer import runlog
from deployer.agent.protocol import ExecResult
from deployer.errors import DeployerError, LockHeld
from deployer.text import printable, shown
from deployer.transport.base import Transport

if TYPE_CHECKING:
    from deployer.agent.client import Pending
    from deployer.agent.protocol import Request
    from deployer.steps.cancel import CancelToken

LOCK_NAME = "deployer.run.lock"
TIMEOUT_S = 30.0
WAIT_POLL_S = 0.5  # --lock-wait: how often a held lock is read again
# Exit codes of _TAKE beyond 0 (taken) and 1 (failed; its stderr says why).
HELD, VANISHED = 3, 4
# $1 lock path, $2 the run's lock directory, $3 its name relative to the lock's parent; info on stdin.
_TAKE = (
    'lock=$1; dir=$2; name=$3; umask 077; '
    'mkdir -- "$dir" && cat > "$dir/info.json" && : > "$dir/heartbeat" || { rm -rf -- "$dir"; exit 1; }; '
    # -T: an existing directory at $lock is in the way, never a place to put the link into.
    'ln -s -T -- "$name" "$lock" || { rm -rf -- "$dir"; '
    f'{{ [ -e "$lock" ] || [ -L "$lock" ]; }} && exit {HELD}; exit 1; }}; '
    # Our directory was removed as another run's leftover before the link went up: take it down again.
    f'[ -f "$lock/info.json" ] || {{ rm -f -- "$lock"; exit {VANISHED}; }}'
)
# Prints the target's clock, then the heartbeat's and the lock's own mtime (`-` when missing), then the
# directory the link names (`-`: an older deployer's lock directory). `stat` without -L: a link's own mtime is
# when the lock was taken. Only a link or a directory is a lock; anything else there is in the way, not held.
_AGE_SCRIPT = ('date +%s; stat -c %Y -- "$1/heartbeat" 2>/dev/null || echo -; '
               '{ [ -L "$1" ] || [ -d "$1" ]; } && stat -c %Y -- "$1" || echo -; '
               'readlink -- "$1" 2>/dev/null || echo -')
# Lock directories beside the lock that the lock does not name: cut-off attempts or releases.
_STRAYS = ('cd -- "$1" || exit 1; target=$(readlink -- deployer.run.lock 2>/dev/null); '
           'for d in deployer.run.lock.*; do [ -d "$d" ] && [ ! -L "$d" ] && [ "$d" != "$target" ] '
           '&& printf "%s\\0" "$d"; done; exit 0')
# Removes the lock ($1): the link first (atomic: from then on the lock is free), then what it named.
_REMOVE = ('lock=$1; if [ -L "$lock" ]; then target=$(readlink -- "$lock"); rm -f -- "$lock" || exit 1; '
           'case $target in deployer.run.lock.*) rm -rf -- "$(dirname -- "$lock")/$target";; esac; '
           'else rm -rf -- "$lock"; fi')
# The same, only while the lock is still ours ($2: our directory's name): a forced release may have handed it on.
_REMOVE_OURS = '[ "$(readlink -- "$1")" = "$2" ] || exit 0; ' + _REMOVE
# A forced removal of the lock that was read ($2: the directory its link named then): one that changed hands since
# is another run's, and stays (exit CHANGED_HANDS).
CHANGED_HANDS = 3
_REMOVE_READ = f'[ "$(readlink -- "$1")" = "$2" ] || exit {CHANGED_HANDS}; ' + _REMOVE
# The fields of info.json and the longest text each may hold; any other key is dropped.
_TEXT_FIELDS = {"run_id": 128, "operator": 256, "host": 256, "started": 64}
MAX_TTL_S = 7 * 24 * 3600.0
MAX_PID = 2**31 - 1


@dataclass(frozen=True)
class LockState:
    """The target's lock as read: its holder, age and TTL, or why it cannot be read."""
    path: str
    info: dict[str, object]
    age_s: float | None  # since the last heartbeat, else since the lock was made
    ttl_s: float
    host: str  # the inventory's name for the target: what a command to run against it names
    taking: bool = False  # the lock exists but its info cannot be read (yet)
    invalid: str | None = None  # why the info that was read is not shown (a field of the wrong type or size)
    link: str | None = None  # the directory the lock's link named when read (None: a directory lock, or unread)

    @property
    def stale(self) -> bool:
        return self.age_s is not None and self.age_s > self.ttl_s

    @property
    def heartbeat_age_s(self) -> float | None:
        return self.age_s

    def describe(self) -> str:
        age = "unknown" if self.age_s is None else f"{self.age_s:.0f}s ago"
        if self.taking:
            text = f"being taken (its info is not readable yet; made {age})"
            if self.stale:
                text += (f" — STALE: abandoned while being taken, older than the {self.ttl_s:.0f}s TTL; remove it "
                         f"with: deployer lock release --host {self.host} --force")
            return text
        info = self.info
        if self.invalid is not None:
            text = f"held, but its info.json is not deployer's ({self.invalid}); last heartbeat {age}"
        else:
            text = (f"held by run {info.get('run_id', '?')} of {info.get('operator', '?')} "
                    f"(pid {info.get('pid', '?')}) since {info.get('started', '?')}; last heartbeat {age}")
        if self.stale:
            text += (f" — STALE (older than the {self.ttl_s:.0f}s TTL); if that run is really gone, "
                     f"remove it with: deployer lock release --host {self.host} --force")
        return text


def lock_path(git_dir: str) -> str:
    return posixpath.join(git_dir, LOCK_NAME)


def read_state(transport: Transport, git_dir: str, ttl_s: float, host: str) -> LockState | None:
    """The lock as the target shows it (None: there is none); `host` names the target in advice."""
    path = lock_path(git_dir)
    out = transport.run(("sh", "-c", _AGE_SCRIPT, "sh", path), timeout=TIMEOUT_S).out.removesuffix("\n").split("\n")
    if len(out) < 4 or out[2] == "-":
        return None  # nothing at the lock's name (a dangling link still has its own mtime)
    # Compared, never shown or run: whatever name the link holds, only that same name is removed by it.
    link = "\n".join(out[3:])
    named = None if link == "-" else link
    raw = transport.get(posixpath.join(path, "info.json"), timeout=TIMEOUT_S)
    try:
        info = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        info = None
    since = out[1] if out[1] != "-" and info is not None else out[2]
    age = float(out[0]) - float(since) if since.isdigit() and out[0].isdigit() else None
    if not isinstance(info, dict):
        return LockState(path, {}, age, ttl_s, host, taking=True, link=named)
    invalid = _invalid(info)
    if invalid is not None:
        return LockState(path, {}, age, ttl_s, host, invalid=invalid, link=named)
    known = {key: info[key] for key in (*_TEXT_FIELDS, "pid", "ttl_s") if key in info}
    own_ttl = info.get("ttl_s", ttl_s)
    assert isinstance(own_ttl, int | float)  # _invalid said so
    return LockState(path, known, age, float(own_ttl), host, link=named)


def beating_agent(transport: Transport, git_dir: str) -> int | None:
    """The pid of the agent that beats the lock's heartbeat, as its first beat wrote it (None: none written, or not
    a pid). The target's word: a pid to look for (by its command line too), never proof that anything runs."""
    raw = transport.get(posixpath.join(lock_path(git_dir), "heartbeat"), timeout=TIMEOUT_S)
    text = raw.decode("ascii", "replace").strip() if raw else ""
    pid = int(text) if text.isdigit() and len(text) <= 10 else 0
    return pid if 0 < pid <= MAX_PID else None


def wait_free(transport: Transport, git_dir: str, ttl_s: float, host: str, wait_s: float, cancel: CancelToken,
              say: Callable[[str], None]) -> None:
    """`--lock-wait S`: poll the lock until it is free, at most wait_s; each holder waited for is said once. Still
    held at the deadline: LockHeld, as a run that did not wait. A run that took the lock first once it was free
    still wins (its take is atomic): then this run is refused as without the wait."""
    deadline = time.monotonic() + wait_s
    said: set[object] = set()
    while (state := read_state(transport, git_dir, ttl_s, host)) is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LockHeld(f"the deploy lock {state.path} is {state.describe()}; still held after waiting "
                           f"{wait_s:g}s for it (--lock-wait)")
        if (holder := state.info.get("run_id")) not in said:
            said.add(holder)
            say(f"{host}: waiting up to {left:.0f}s for the deploy lock, {state.describe()}")
        cancel.wait(min(WAIT_POLL_S, left))


def _invalid(info: dict[str, object]) -> str | None:
    """Why a lock's info cannot be shown or believed (None: every field it has is of deployer's form)."""
    for key, limit in _TEXT_FIELDS.items():
        if key in info and not printable(info[key], limit):
            return f"field {key!r} is {shown(info[key])}, not text of at most {limit} printable characters"
    pid = info.get("pid")
    if "pid" in info and not (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid <= MAX_PID):
        return f"field 'pid' is {shown(pid)}, not a process id"
    ttl = info.get("ttl_s")
    if "ttl_s" in info and not (isinstance(ttl, int | float) and not isinstance(ttl, bool) and math.isfinite(ttl)
                                and 0 < ttl <= MAX_TTL_S):
        return f"field 'ttl_s' is {shown(ttl)}, not a number of seconds above 0 and at most {MAX_TTL_S:.0f}"
    return None


def strays(transport: Transport, git_dir: str) -> list[str]:
    """Lock directories the lock does not name: left by a run cut while taking or releasing it."""
    return stray_paths(git_dir, transport.run(("sh", "-c", _STRAYS, "sh", git_dir), timeout=TIMEOUT_S))


def stray_paths(git_dir: str, listed: ExecResult) -> list[str]:
    if not listed.ok:
        raise DeployerError(f"cannot list {git_dir}: {listed.err.strip()}")
    return [posixpath.join(git_dir, name) for name in listed.out.split("\0") if name]


class DeployLock:
    """Held for one run; the agent on the target touches its heartbeat until released.

    The beat runs in the agent, not here: it is never queued behind a long command, costs no round
    trip, and stops by itself when the run's connection is gone, so a dead run's lock turns stale."""

    def __init__(self, transport: Transport, git_dir: str, info: dict[str, object], ttl_s: float) -> None:
        self.transport = transport
        self.git_dir = git_dir
        self.path = lock_path(git_dir)
        self.info = {**info, "ttl_s": ttl_s,
                     "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self.name = f"{LOCK_NAME}.{info['run_id']}"
        self.dir = posixpath.join(git_dir, self.name)
        self.ttl_s = ttl_s
        self.host = str(info["host"])
        self.removed: list[str] = []  # strays cleared after taking the lock
        self.heartbeat = posixpath.join(self.dir, "heartbeat")

    def acquire(self, then: Sequence[Request[Any]] = (),
                behind: Callable[[Pending[ExecResult]], None] | None = None) -> list[Any]:
        """Take the lock, start its heartbeat and look for strays: one round trip. The heartbeat and the
        listing are harmless when the take fails (our directory is gone, the listing only reads).

        `then` are reads to run right after the take in the same round trip; their results are returned.
        `behind` sends more before this waits for any reply (read-only, or run on the target only if the take,
        which it is handed, succeeded); its caller reads them."""
        from deployer.agent.protocol import Beat

        try:
            taking = self.transport.submit_run(("sh", "-c", _TAKE, "deployer-lock", self.path, self.dir, self.name),
                                               stdin=json.dumps(self.info, indent=1).encode(), timeout=TIMEOUT_S)
            beating = self.transport.submit(Beat(self.heartbeat, max(self.ttl_s / 4, 0.5)))
            listing = self.transport.submit_run(("sh", "-c", _STRAYS, "sh", self.git_dir), timeout=TIMEOUT_S)
            reads = [self.transport.submit(request) for request in then]
            if behind is not None:
                behind(taking)
            taken = taking.result()
            beating.result()
            listed = listing.result()
        except DeployerError as exc:  # a hello that never came back too: the take may have run all the same
            raise self._cut(str(exc)) from exc
        if taken.timed_out:
            raise self._cut(f"taking the deploy lock did not finish within {TIMEOUT_S:g}s, killed")
        if taken.exit_code == HELD:
            state = read_state(self.transport, self.git_dir, self.ttl_s, self.host)
            if state is None:
                if self.transport.run(("test", "-e", self.path), timeout=TIMEOUT_S).ok:
                    raise DeployerError(f"cannot create the deploy lock {self.path}: something that is not a "
                                        "lock is in the way; move it aside")
                # Released between our attempt and our read: say so rather than retry silently.
                raise LockHeld(f"the deploy lock {self.path} was busy a moment ago; try again")
            raise LockHeld(f"the deploy lock {self.path} is {state.describe()}")
        if taken.exit_code == VANISHED:
            raise LockHeld(f"the deploy lock {self.path} was contended while taking it; try again")
        if not taken.ok:
            raise DeployerError(f"cannot create the deploy lock {self.path}: {taken.err.strip()}")
        try:
            found = stray_paths(self.git_dir, listed)
            if found:
                self.transport.run(("rm", "-rf", "--", *found), timeout=TIMEOUT_S)
                self.removed.extend(found)
            return [pending.result() for pending in reads]
        except BaseException:
            with contextlib.suppress(DeployerError):  # never leave a lock nobody holds, if we still can
                self._remove()
            raise

    def _cut(self, why: str) -> DeployerError:
        return DeployerError(
            f"{why}; cut while taking the deploy lock: the target holds either no lock or this run's complete "
            f"lock {self.path} (-> {self.name}), plus at most the directory {self.dir}. `deployer lock status` "
            "says which; the next run that takes the lock removes that directory")

    def _remove(self) -> None:
        self.transport.run(("sh", "-c", _REMOVE, "deployer-unlock", self.path), timeout=TIMEOUT_S)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still ours: one round trip."""
        self.send_release()()

    def send_release(self, after: Pending[Any] | None = None,
                     then: Callable[[Pending[Any]], None] | None = None) -> Callable[[], None]:
        """Send the release now (run only if `after` succeeded, when given); the returned check raises
        if it failed or was skipped. `then` sends more right behind the lock's removal, given its reply."""
        from deployer.agent.protocol import Beat

        stopped = self.transport.submit(Beat(self.heartbeat, 0), after=after)
        removed = self.transport.submit_run(("sh", "-c", _REMOVE_OURS, "deployer-unlock", self.path, self.name),
                                            timeout=TIMEOUT_S, after=after)
        if then is not None:
            then(removed)

        def check() -> None:
            stopped.result()
            if not removed.result().ok:
                raise DeployerError(f"cannot remove the deploy lock {self.path}: {removed.result().err.strip()}")
        return check


def force_release(transport: Transport, git_dir: str, read: LockState | None = None) -> bool:
    """Remove the lock, held or not; with `read`, only while it is still the lock that was read (its link names
    the same directory): one taken by another run since stays, and this says False. False too when none is there."""
    path = lock_path(git_dir)
    if read is None and read_state(transport, git_dir, 0, "") is None:
        return False
    named = read.link if read is not None else None  # None: a directory lock, or no read to hold it to
    argv = ("sh", "-c", _REMOVE, "deployer-unlock", path) if named is None else \
        ("sh", "-c", _REMOVE_READ, "deployer-unlock", path, named)
    result = transport.run(argv, timeout=TIMEOUT_S)
    if named is not None and result.exit_code == CHANGED_HANDS:
        return False
    if not result.ok:
        raise DeployerError(f"cannot remove {path}: {result.err.strip()}")
    return True


def record_forced_release(runs_dir: Path, host: str, state: LockState, operator: str) -> str:
    """A forced release as a run of its own, so the run log says who broke whose lock and how stale it was."""
    return runlog.record_run(runs_dir, host, "lock_release", operator, [
        {"type": "lock_force_released", "holder": state.info, "heartbeat_age_s": state.heartbeat_age_s,
         "stale": state.stale}])
