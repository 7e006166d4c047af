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
    from deployer.transport.base import Transport


@dataclass(frozen=True, kw_only=True)
class LockOptions(Setting):
    host: str


@dataclass(frozen=True)
class LockStatus:
    """The lock as the host shows it (None: free), the lock directories a cut run left (the next run that takes
    the lock removes them), and what to do next where this machine or the target knows (a run cut mid-change:
    recover it). Held: exit 3."""

    host: str
    state: LockState | None
    strays: list[str] = field(default_factory=list)
    next: str | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.state is None else 3

    def document(self) -> dict[str, Any]:
        return {"host": self.host, "locked": self.state is not None, "exit_code": self.exit_code,
                "holder": None if self.state is None else {**self.state.info, "stale": self.state.stale,
                                                           "heartbeat_age_s": self.state.heartbeat_age_s},
                "next": self.next}


@dataclass(frozen=True)
class LockReleased:
    """The lock removed (state: as it was; None: there was none), and the run that records it."""

    host: str
    state: LockState | None
    run_id: str | None = None
    exit_code: int = 0
    next: str | None = None  # the run the lock was a cut run's, still to recover

    def document(self) -> dict[str, Any]:
        if self.state is None:
            return {"host": self.host, "released": None, "exit_code": 0, "error": None}
        return {"host": self.host, "released": self.state.info, "run_id": self.run_id, "exit_code": 0, "error": None,
                "next": self.next}


def lock_status(options: LockOptions, *, listener: Listener | None = None) -> LockStatus:
    from deployer.run import lock as locks
    from deployer.steps import gitops

    build = build_of(options, listener)
    host, transport = build.connection(options.host)
    with transport:
        git_dir = gitops.git_dir(transport, host.repo)
        state = locks.read_state(transport, git_dir, host.lock_ttl_s, options.host)
        pending = _intent_of(transport, git_dir, options.host)
        holder = holder_now(build.runs_dir, state, options.host) if state is not None else None
        return LockStatus(options.host, state, locks.strays(transport, git_dir),
                          _next(pending, holder, state is None or state.stale, options.host))


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
        holder = holder_now(build.runs_dir, state, options.host)
        if not state.stale and listener is not None:
            listener({"type": "lock_not_stale", "message": f"the lock was NOT stale: {state.describe()}; "
                                                           f"{holder.text}"})
        if not locks.force_release(transport, git_dir, state):
            raise LockHeld(f"the deploy lock changed hands while it was read (it was {state.describe()}); nothing "
                           f"was removed: `deployer lock status --host {options.host}` shows it now")
        pending = _intent_of(transport, git_dir, options.host)
    return LockReleased(options.host, state, locks.record_forced_release(build.runs_dir, options.host, state,
                                                                         operator_id()),
                        next=None if holder.going else _next(pending, holder, True, options.host))


@dataclass(frozen=True)
class Holder:
    """What this machine's own record says of the lock holder's run: its words, and whether it was cut here."""

    text: str
    run_id: str | None = None
    cut: bool = False
    going: bool = False


def holder_now(runs_dir: Path, state: LockState, host: str) -> Holder:
    """The holder's run judged as a refused apply judges it (run/lease.py): still going, or cut (then recover, not
    a forced release, is the way to end it)."""
    from deployer.run.unended import recorded_owner
    from deployer.runlog import is_run_id

    run_id = state.info.get("run_id")
    if not (isinstance(run_id, str) and is_run_id(run_id)):
        return Holder("that run may still be going")
    owner, alive = recorded_owner(runs_dir / run_id)
    if owner is not None and alive:
        return Holder(f"run {run_id} is still going on this machine (pid {owner.pid})", run_id, going=True)
    if owner is not None and alive is False:
        return Holder(f"run {run_id} was cut (its process on this machine, pid {owner.pid}, is gone); `deployer "
                      f"recover {run_id} --host {host}` still ends it and puts the target back (a forced release "
                      "does neither)", run_id, cut=True)
    return Holder("that run may still be going", run_id)


def _intent_of(transport: Transport, git_dir: str, host: str) -> str | None:
    """The run the target's intent record names: one changing files there, or cut while it did (None: none, or a
    record that cannot be read, which the next apply or recover reports)."""
    from deployer.errors import DeployerError
    from deployer.run import intent

    try:
        pending = intent.read(transport, git_dir, host)
    except DeployerError:
        return None
    return pending.run_id if pending is not None else None


def _next(mid_change: str | None, holder: Holder | None, unheld: bool, host: str) -> str | None:
    """What to do next, in one line: wait for a run still going here; recover a run cut mid-change (its intent
    record, with no live lock beside it: `unheld`, the lock free or stale, or its holder cut here; a forced release
    leaves what it changed), or one this machine saw cut."""
    if holder is not None and holder.going:
        return f"{holder.text}: wait for it (apply --lock-wait SECONDS waits for the lock)"
    if mid_change is not None and (unheld or (holder is not None and holder.cut)):
        return (f"run {mid_change} was cut while it changed files here (its intent record is on the target): end "
                f"it with: deployer recover {mid_change} --host {host} (a forced release removes only the lock)")
    if holder is not None and holder.cut:
        return f"end run {holder.run_id} with: deployer recover {holder.run_id} --host {host}"
    return None
