"""The deploy lock on a host: who holds it (`lock status`), and breaking it (`lock release --force`), the
removal recorded as a run of its own so the run log says who broke whose lock and how stale it was."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.app.setting import Setting, build_of

if TYPE_CHECKING:
    from deployer.run.lock import LockState
    from deployer.steps.context import Listener


@dataclass(frozen=True, kw_only=True)
class LockOptions(Setting):
    host: str


@dataclass(frozen=True)
class LockStatus:
    """The lock as the host shows it (None: free), and the lock directories a cut run left (the next run that
    takes the lock removes them). Held: exit 3."""

    host: str
    state: LockState | None
    strays: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 0 if self.state is None else 3

    def document(self) -> dict[str, Any]:
        return {"host": self.host, "locked": self.state is not None, "exit_code": self.exit_code,
                "holder": None if self.state is None else {**self.state.info, "stale": self.state.stale,
                                                           "heartbeat_age_s": self.state.heartbeat_age_s}}


@dataclass(frozen=True)
class LockReleased:
    """The lock removed (state: as it was; None: there was none), and the run that records it."""

    host: str
    state: LockState | None
    run_id: str | None = None
    exit_code: int = 0

    def document(self) -> dict[str, Any]:
        if self.state is None:
            return {"host": self.host, "released": None, "exit_code": 0, "error": None}
        return {"host": self.host, "released": self.state.info, "run_id": self.run_id, "exit_code": 0, "error": None}


def lock_status(options: LockOptions, *, listener: Listener | None = None) -> LockStatus:
    from deployer.run import lock as locks
    from deployer.steps import gitops

    host, transport = build_of(options, listener).connection(options.host)
    with transport:
        git_dir = gitops.git_dir(transport, host.repo)
        state = locks.read_state(transport, git_dir, host.lock_ttl_s, options.host)
        return LockStatus(options.host, state, locks.strays(transport, git_dir))


def release_lock(options: LockOptions, *, listener: Listener | None = None) -> LockReleased:
    """Remove the host's lock, stale or not: a lock that is not stale is said first (a lock_not_stale event), as
    that run may still be going."""
    from deployer.errors import LockHeld
    from deployer.run import lock as locks
    from deployer.runlog import operator_id
    from deployer.steps import gitops

    build = build_of(options, listener)
    host, transport = build.connection(options.host)
    with transport:
        git_dir = gitops.git_dir(transport, host.repo)
        state = locks.read_state(transport, git_dir, host.lock_ttl_s, options.host)
        if state is None:
            return LockReleased(options.host, None)
        if not state.stale and listener is not None:
            listener({"type": "lock_not_stale", "message": f"the lock was NOT stale: {state.describe()}; "
                                                           f"{_holder_now(build.runs_dir, state, options.host)}"})
        if not locks.force_release(transport, git_dir, state):
            raise LockHeld(f"the deploy lock changed hands while it was read (it was {state.describe()}); nothing "
                           f"was removed: `deployer lock status --host {options.host}` shows it now")
    return LockReleased(options.host, state, locks.record_forced_release(build.runs_dir, options.host, state,
                                                                         operator_id()))


def _holder_now(runs_dir: Path, state: LockState, host: str) -> str:
    """What this machine's own record says of the holder's run, judged as a refused apply judges it (run/lease.py):
    still going, or cut (then recover, not a forced release, was the way to end it)."""
    from deployer.run.unended import recorded_owner
    from deployer.runlog import is_run_id

    run_id = state.info.get("run_id")
    owner, alive = recorded_owner(runs_dir / run_id) if isinstance(run_id, str) and is_run_id(run_id) else \
        (None, None)
    if owner is not None and alive:
        return f"run {run_id} is still going on this machine (pid {owner.pid})"
    if owner is not None and alive is False:
        return (f"run {run_id} was cut (its process on this machine, pid {owner.pid}, is gone); `deployer recover "
                f"{run_id} --host {host}` still ends it and puts the target back (a forced release does neither)")
    return "that run may still be going"
