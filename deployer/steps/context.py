"""What a step sees while it plans or runs: the host, the transport, the files, the event bus."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from deployer.agent.protocol import DEFAULT_TIMEOUT_S, ExecResult
from deployer.command import Masker, shell_line
from deployer.config.models import Host, Playbook
from deployer.errors import StepFailed, TransportError
from deployer.runstate import RunRecord
from deployer.steps.action import EVENT, Action, Bound, Kind
from deployer.steps.cancel import CancelToken
from deployer.text import visible
from deployer.transport.base import CAPTURE_BYTES, WHOLE_OUTPUT_BYTES, Transport

if TYPE_CHECKING:
    from deployer.agent.client import Pending
    from deployer.agent.protocol import BatchResult
    from deployer.diffs import DiffStat

Listener = Callable[[dict[str, Any]], None]
# Characters of a command's output kept in its run-log event, and in a failure message.
EVENT_TAIL = 1000
FAILURE_TAIL = 1500
NOTHING: Bound = MappingProxyType({})  # an action without placeholders


@dataclass
class Change:
    """One file the run changes on the target, with the bytes it had before the run."""

    dest: str  # relative to the repo
    path: str  # absolute on the target
    new: bytes
    old: bytes | None  # None: the file does not exist before the run
    tracked: bool = False
    source: str = ""  # where the new bytes come from, for people: the playbook's src path
    new_dirs: list[str] = field(default_factory=list)  # directories the upload will create
    mode: int | None = None  # permission bits, owner and group before the run (None: no file)
    uid: int | None = None
    gid: int | None = None


@dataclass
class LoadedPlaybook:
    """A playbook as loaded: its file, bytes, model and the sources it ships."""
    path: Path
    raw: bytes
    model: Playbook
    sources: dict[str, bytes]  # dest -> new bytes (files mode)

    def source_of(self, dest: str) -> str:
        for spec in self.model.files:
            if spec.dest == dest:
                return str(self.path.parent / spec.src)
        return f"{dest} (after {self.model.patch})"
    patch: bytes | None

    @classmethod
    def none(cls, name: str) -> LoadedPlaybook:
        """What a Context outside any run carries (check, logs): service managers read the target through one."""
        return cls(path=Path("(no playbook)"), raw=b"", model=Playbook.model_construct(name=name, steps=[]),
                   sources={}, patch=None)


class EventBus:
    """Masks every event once, then hands it to each listener (run log, screen)."""

    def __init__(self, masker: Masker, host: str) -> None:
        self.masker = masker
        self.host = host
        self.listeners: list[Listener] = []
        self.step: str | None = None

    def emit(self, kind: str, /, **data: Any) -> None:
        event = {"type": kind, "host": self.host, "step": self.step, **data}
        masked = self.masker.obj(event)
        assert isinstance(masked, dict)
        for listener in self.listeners:
            listener(masked)


class Facts(BaseModel):
    """What a run learns on the way, passed between steps as typed fields (and kept in its run_end)."""

    model_config = ConfigDict(validate_assignment=True)

    operator: str = "deployer"
    identity: str | None = None  # the target's git user.email ("" none); None: not read yet
    dirty: list[str] = Field(default_factory=list)  # dests with uncommitted changes before the run
    unchanged: list[str] = Field(default_factory=list)  # dests whose HEAD bytes are the shipped ones
    # Every dest already holds its shipped bytes, at HEAD and in the work tree: the run has nothing to change.
    already_applied: bool = False
    log_sha256: str | None = None  # the run log up to the running step's start (a commit anchors it)
    diffstat: str | None = None
    files: list[str] = Field(default_factory=list)  # what the run's commit holds (a rollback gives them back)
    baseline: dict[str, float] = Field(default_factory=dict)  # metric -> value before the fix
    drain: dict[str, dict[str, float | None]] = Field(default_factory=dict)  # metric -> baseline, final
    # The drains whose baseline already met their bound (metric -> that bound): their pass proves nothing.
    baseline_met: dict[str, str] = Field(default_factory=dict)
    # A rollback's drain of the reverted build, judged against the baseline: metric -> baseline, final
    rollback_drain: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    # Each check a rollback ran again on the reverted build: name -> passed | failed | not run: why
    rollback_checks: dict[str, str] = Field(default_factory=dict)
    # analysis_baseline's reads of /metrics before the restart, (time, text): the working input of `analysis`.
    analysis_before: list[tuple[float, str]] = Field(default_factory=list)
    storms: list[dict[str, int]] = Field(default_factory=list)
    pids: dict[str, dict[str, int | None]] | None = None  # service -> old, new
    rollback_pids: dict[str, dict[str, int | None]] | None = None
    restored: list[str] = Field(default_factory=list)
    unproven: str | None = None  # why a recover's checks do not prove the fix (run again without their load)
    rollback_commit: str | None = None
    placement: dict[str, Any] | None = None  # a container target: its id and where each dest lives (run/mounts.py)

    def record(self) -> dict[str, Any]:
        """The facts worth keeping in run_end (the working ones left out)."""
        return self.model_dump(exclude={"identity", "log_sha256", "analysis_before"}, exclude_defaults=True)


class Submitted:
    """An action sent to the target without waiting; recorded in the run log when its result is first read."""

    def __init__(self, ctx: Context, action: Action, bound: Bound, quiet: bool, pending: Pending[Any],
                 wait: float | None = None) -> None:
        self.ctx, self.action, self.bound, self.quiet, self.pending = ctx, action, bound, quiet, pending
        self.wait = wait  # how long to wait for the reply; None: as long as the request itself may take
        self._done = False
        self._result: Any = None

    def result(self) -> Any:
        if not self._done:
            self._result = self.pending.result(self.wait)
            self._done = True
            self.ctx.log_action(self.action, self.bound, self._result, quiet=self.quiet)
        return self._result

    def check(self, what: str) -> ExecResult:
        """A command's result, or StepFailed naming the command, its exit code and stderr tail."""
        result = self.result()
        assert isinstance(result, ExecResult)
        if not result.ok:
            raise self.ctx.failure(what, result)
        return result


def outcome(result: Any) -> str:
    """What one doing of an action came to, in a word or two: equal outcomes of a poll are counted together."""
    from deployer.agent.processes import Processes
    from deployer.agent.protocol import HttpResult

    if isinstance(result, ExecResult):
        return "timed out" if result.timed_out else f"exit {result.exit_code}"
    if isinstance(result, HttpResult):
        return "no answer" if result.status is None else str(result.status)
    if isinstance(result, bytes):
        return "present"
    if isinstance(result, Processes):
        return f"{len(result.procs)} processes" if result.procs else "none"
    return "absent" if result is None else "done"


@dataclass
class Tally:
    """A repeated action's record: how often it was done and what each time came to, in order."""

    action: Action
    bound: Bound
    last: Any = None
    outcomes: list[list[Any]] = field(default_factory=list)  # [outcome, times in a row]

    def add(self, result: Any) -> None:
        self.last = result
        said = outcome(result)
        if self.outcomes and self.outcomes[-1][0] == said:
            self.outcomes[-1][1] += 1
        else:
            self.outcomes.append([said, 1])

    @property
    def count(self) -> int:
        return sum(times for _, times in self.outcomes)


class Poll:
    """Rounds of the same actions (a wait, a drain): each round is one batch, one round trip. A poll may run
    hundreds of rounds, so each action is recorded once, when the poll ends: how often it was done, what each
    time came to (equal outcomes in a row counted together), and the last result in full."""

    def __init__(self, ctx: Context, timeout: float) -> None:
        self.ctx, self.timeout = ctx, timeout
        self.tallies: dict[tuple[str, tuple[tuple[str, str], ...]], Tally] = {}

    def round(self, calls: Sequence[tuple[Action, Bound]]) -> list[Any]:
        results = self.ctx.batch(calls, timeout=self.timeout)
        for (action, bound), result in zip(calls, results, strict=True):
            tally = self.tallies.setdefault((action.key, tuple(sorted(bound.items()))), Tally(action, bound))
            tally.add(result)
        return results

    def __enter__(self) -> Poll:
        return self

    def __exit__(self, *exc: object) -> None:
        for tally in self.tallies.values():
            self.ctx.log_action(tally.action, tally.bound, tally.last, quiet=True, count=tally.count,
                            outcomes=tally.outcomes)


@dataclass
class Context:
    """What every step of one run works with: the target, the playbook, the run's facts and events."""
    run_id: str
    host_name: str
    host: Host
    transport: Transport
    playbook: LoadedPlaybook
    bus: EventBus
    cancel: CancelToken
    changes: list[Change] = field(default_factory=list)
    git_before: str | None = None
    git_after: str | None = None
    git_dir: str | None = None
    facts: Facts = field(default_factory=Facts)
    record: RunRecord | None = None  # the run's write-ahead state; None in a dry run
    # Commands read-only steps sent ahead of their turn, by step name (see Step.prefetch).
    prefetched: dict[str, list[Submitted]] = field(default_factory=dict)
    # Sent right behind the next batch, to run only if it succeeds: the release, when that batch is the run's last act.
    closing: Callable[[Pending[Any]], None] | None = None
    on_sent: Callable[[], None] | None = None  # told when a step has sent its changes, before it waits
    # A commit sent with the changes, behind every check before it (see Step.send_ahead), by step name.
    ahead: dict[str, tuple[Pending[BatchResult], Bound]] = field(default_factory=dict)
    projected: Callable[[], DiffStat] | None = None  # the diff the run will make, counted here (preflight)

    def sent(self) -> None:
        """A step has sent what it changes: the read-only steps after it may send theirs now (same round trip)."""
        if self.on_sent is not None:
            self.on_sent()

    @property
    def repo(self) -> str:
        return self.host.repo

    @property
    def dests(self) -> list[str]:
        return [c.dest for c in self.changes]

    def in_repo(self, dest: str) -> str:
        return posixpath.join(self.host.repo, dest)

    def state_dir(self) -> str:
        """Deployer's own files on the target live in .git, out of the work tree."""
        assert self.git_dir is not None, "preflight sets git_dir"
        return posixpath.join(self.git_dir, "deployer")

    def emit(self, kind: str, /, **data: Any) -> None:
        self.bus.emit(kind, **data)

    def run(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
            timeout: float = DEFAULT_TIMEOUT_S, stdin: bytes | None = None,
            quiet: bool = False, capture: int | None = CAPTURE_BYTES) -> ExecResult:
        """Run on the target (in the repo unless told otherwise) and log the command."""
        result = self.submit(argv, cwd=cwd, env=env, timeout=timeout, stdin=stdin, quiet=quiet,
                             capture=capture).result()
        assert isinstance(result, ExecResult)
        return result

    def submit(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
               timeout: float = DEFAULT_TIMEOUT_S, stdin: bytes | None = None,
               quiet: bool = False, capture: int | None = CAPTURE_BYTES, expect: bytes | None = None,
               guard: bool = False) -> Submitted:
        """run() without waiting: send a phase's commands together, then read their results (one round trip).
        A command no step planned (preflight's, a restore's): the run log records it without an action key.
        With `expect` (its exact output) or `guard`, it fails by the agent's rule unless it printed that and
        exited 0: a request sent `after` it then does not run. Its result is read here all the same."""
        action = Action.run("", "", tuple(argv), self.repo if cwd is None else cwd, env=tuple((env or {}).items()),
                            expect=expect, failure="a guard" if guard else "")
        return self.send(action, timeout=timeout, stdin=stdin, quiet=quiet, capture=capture)

    def act(self, action: Action, bound: Bound = NOTHING, *, timeout: float = DEFAULT_TIMEOUT_S,
            stdin: bytes | None = None, data: bytes | None = None, quiet: bool = False,
            capture: int | None = CAPTURE_BYTES) -> Any:
        """Do one planned action, its placeholders bound; the run log records it under the action's key.
        An action that says what its failure means raises StepFailed (naming it) when it fails."""
        submitted = self.send(action, bound, timeout=timeout, stdin=stdin, data=data, quiet=quiet, capture=capture)
        result = submitted.result()
        if action.failure and isinstance(result, ExecResult) and not result.ok:
            raise self.failure(action.failure, result)
        return result

    def send(self, action: Action, bound: Bound = NOTHING, *, timeout: float = DEFAULT_TIMEOUT_S,
             stdin: bytes | None = None, data: bytes | None = None, quiet: bool = False,
             capture: int | None = CAPTURE_BYTES, after: Submitted | None = None) -> Submitted:
        """act() without waiting (pipelining): the agent does requests in the order sent (after: only if that
        one succeeded)."""
        request = action.bind(bound).request(timeout=timeout, stdin=stdin, data=data,
                                             capture=capture or WHOLE_OUTPUT_BYTES)
        # A command or an HTTP request carries its own timeout; a read or a write is bounded by this one.
        wait = None if action.kind in (Kind.run, Kind.http) else timeout
        pending = self.transport.submit(request, wait, after=None if after is None else after.pending)
        return Submitted(self, action, bound, quiet, pending, wait)

    def send_batch(self, calls: Sequence[tuple[Action, Bound]], *, timeout: float,
                   after: Sequence[Pending[Any]] | None = None) -> Pending[BatchResult]:
        """Send actions to be done in order in one round trip (after: only if each of those succeeded)."""
        from deployer.agent.protocol import Batch

        requests = [action.bind(bound).request(timeout=timeout, capture=CAPTURE_BYTES) for action, bound in calls]
        pending = self.transport.submit(Batch(requests), after=after)
        if self.closing is not None:  # the run's last act: what ends the run goes right behind it
            closing, self.closing = self.closing, None
            closing(pending)
        return pending

    def batch(self, calls: Sequence[tuple[Action, Bound]], *, timeout: float,
              sent: Pending[BatchResult] | None = None) -> list[Any]:
        """The results of actions done in order in one round trip (sent already, when given), not recorded
        (act_all and Poll record them). It stops at the first action whose failure fails the step: the
        results end there."""
        from deployer.agent.protocol import OpFailure

        results = (sent or self.send_batch(calls, timeout=timeout)).result().results
        for (action, bound), result in zip(calls, results, strict=False):
            if isinstance(result, OpFailure):
                raise TransportError(f"{action.what}: the agent could not do {self.shown_action(action, bound)}: "
                                     f"{result.message}")
        return results

    def poll(self, timeout: float) -> Poll:
        return Poll(self, timeout)

    def act_all(self, calls: Sequence[tuple[Action, Bound]], *, timeout: float,
                sent: Pending[BatchResult] | None = None) -> list[Any]:
        """act() for each, in order, in one round trip (sent already, when given); the first that fails stops
        the rest and is raised."""
        results = self.batch(calls, timeout=timeout, sent=sent)
        for (action, bound), result in zip(calls, results, strict=False):
            self.log_action(action, bound, result)
            if action.failure and isinstance(result, ExecResult) and not result.ok:
                raise self.failure(action.failure, result)
        return results

    def log_action(self, action: Action, bound: Bound, result: Any, *, quiet: bool = False, count: int | None = None,
                   outcomes: list[list[Any]] | None = None, event: str | None = None,
                   extra: Mapping[str, Any] = NOTHING) -> None:
        """The run-log event of an action done: one per kind, naming the planned action (`action`) and the values
        the run bound (`bound`); a repeated one says how often (`count`) and what each time came to (`outcomes`)."""
        data: dict[str, Any] = {}
        if isinstance(result, ExecResult):
            data = dict(command=self.shown_action(action, bound), exit_code=result.exit_code,
                        timed_out=result.timed_out, duration_s=round(result.duration_s, 3),
                        stdout_tail="" if quiet else self.bus.masker.tail(result.out_stream.text, EVENT_TAIL),
                        stderr_tail=self.bus.masker.tail(result.err_stream.text, EVENT_TAIL))
        elif action.kind == Kind.http:
            data = dict(method=action.method, url=action.bind(bound).target)
            if action.body is not None:  # what was sent (a storm's and a canary's request), as plan shows it
                data["body"] = action.bind(bound).body
            if result is not None:
                data.update(status=result.status, error=result.error)
        elif action.kind == Kind.get:
            data = dict(path=action.bind(bound).target, exists=result is not None,
                        size=None if result is None else len(result))
        elif action.kind == Kind.put:
            data = dict(path=result.dest, sha256=result.sha256, size=result.size)
        elif action.kind == Kind.procs:
            data = dict(line=self.shown_action(action, bound), procs=[
                {"pid": p.pid, "sid": p.sid, "pgid": p.pgid, "state": p.state, "listens": list(p.listens),
                 "cmdline": visible(shell_line(p.cmdline), multiline=False)} for p in result.procs],
                unowned=list(result.unowned))
        elif action.kind == Kind.signal:
            data = dict(line=self.shown_action(action, bound), signalled={str(k): v for k, v in result.items()})
        elif action.kind == Kind.local:
            data = dict(what=action.what)
        if action.key:
            data["action"] = action.key
        used = {k: v for k, v in bound.items() if k in action.placeholders()}
        if used:
            data["bound"] = used
        if count is not None:
            data["count"] = count
        if outcomes is not None:
            data["outcomes"] = outcomes
        self.emit(event or EVENT[action.kind], **data, **extra)

    def shown_action(self, action: Action, bound: Bound = NOTHING) -> str:
        """An action's line as people may see it: secrets masked before quoting, so quoting cannot hide them."""
        return action.bind(bound).mapped(self.bus.masker).line()

    def shown(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> str:
        """The command as people may see it: secrets masked before quoting, so quoting cannot hide them."""
        mask = self.bus.masker
        return shell_line([mask(a) for a in argv], cwd=cwd, env={k: mask(v) for k, v in (env or {}).items()})

    def check(self, argv: Sequence[str], what: str, **kwargs: Any) -> ExecResult:
        """Run and raise StepFailed (naming command, exit code and stderr tail) unless it succeeded."""
        result = self.run(argv, **kwargs)
        if not result.ok:
            raise self.failure(what, result)
        return result

    def failure(self, what: str, result: ExecResult) -> StepFailed:
        detail = result.err_stream if result.err_stream.kept.strip() else result.out_stream
        if result.timed_out:
            what = f"{what}: did not finish within {result.duration_s:.0f}s, killed"
        return StepFailed(self.bus.step or "?", self.bus.masker(what),
                          command=self.shown(result.argv), exit_code=result.exit_code,
                          stderr_tail=self.bus.masker.tail(detail.text, FAILURE_TAIL), timed_out=result.timed_out)
