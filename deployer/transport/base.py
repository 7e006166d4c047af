"""The interface every transport implements: a pipe to the agent, and the calls made through it."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from deployer.agent.client import AgentClient, Pending, bootstrap_argv
from deployer.agent.pipe import Pipe
from deployer.agent.protocol import (
    DEFAULT_TIMEOUT_S,
    Cancel,
    ExecResult,
    Get,
    Hello,
    Http,
    HttpResult,
    Put,
    PutResult,
    Request,
    Run,
)
from deployer.errors import PythonMissing
from deployer.text import visible
from deployer.transport.pipes import shell_found_no

T = TypeVar("T")
# What each output stream of a command may hold before only its tail is kept (memory stays bounded
# whatever a command prints); a caller that needs more says so with run(capture=...).
CAPTURE_BYTES = 8 << 20
# capture=None: everything, up to what one agent reply carries.
WHOLE_OUTPUT_BYTES = 32 << 20


@dataclass
class TransportInfo:
    """Facts about the connection worth recording in the run log."""

    kind: str
    target: str
    host_key_fingerprint: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class Within(Protocol):
    """Where on the host the agent runs when not on the host itself (transport/container.py: a container's
    exec): what goes in front of its bootstrap, the facts for the run log, and the pipe that says a failed
    start in its own terms."""

    def prefix(self) -> list[str]: ...

    def facts(self) -> dict[str, str]: ...

    def open(self, start: Callable[[Sequence[str]], Pipe], argv: Sequence[str], host: str) -> Pipe: ...


class Ports(Protocol):
    """Where the target's loopback ports are reached from this machine when the link's own forward does not reach
    them (transport/kubernetes.py: a pod's loopback is its own, reached by `kubectl port-forward`)."""

    def forward(self, remote_port: int, remote_host: str) -> int: ...

    def said(self, local_port: int) -> str: ...

    def close(self) -> None: ...


class Transport(ABC):
    """One target, driven through the agent (deployer/agent/agent.py) that the transport starts there.

    A transport only provides a byte pipe to a Python on the target (`_pipe`) and port forwards; every
    command, upload, read, stat and HTTP check is a request to that one agent, the same code on every
    target. The agent starts on first use, over one channel, and exits when that channel closes.
    Paths are absolute paths on the target."""

    info: TransportInfo
    # The agent's source kept on the target by its hash (agent/client.py, bootstrap_argv(cached=True)): where
    # sending it costs (a far link), not a pipe on this machine.
    caches_agent = False

    def __init__(self, *, python: str, become: bool = False) -> None:
        self.python = python
        self.become = become
        self._agent: AgentClient | None = None
        self._agent_lock = threading.Lock()
        # Told when the agent starts (the run log records which agent ran, by its sha256).
        self.on_agent: Callable[[Hello], None] | None = None
        self._gate: Pending[Any] | None = None  # see write_ahead
        self._gated: list[Pending[Any]] = []  # sent behind the gate (see gated)
        self._within: Within | None = None
        self.python_at: str | None = None  # where the inventory names the python (file:line:col), when known
        self._beats: dict[str, Request[Any]] = {}  # the agent's heartbeats, by path: reopen's agent keeps them
        self.beside: list[Transport] = []  # over this one's link (an agent beside its container): closed with it
        self.ports: Ports | None = None  # what reach() goes through instead of forward() (a pod's port-forward)

    def run_within(self, within: Within) -> None:
        """Start the agent inside `within` (a container on the host) rather than on the host itself."""
        assert self._agent is None, "the agent already runs on the host"
        self._within = within
        self.info.extra.update(within.facts())

    @abstractmethod
    def _pipe(self, argv: Sequence[str]) -> Pipe:
        """Start argv on the target with its stdin and stdout as a byte pipe."""

    def host_pipe(self, argv: Sequence[str]) -> Pipe:
        """argv on the host itself, beside the agent (which may run in a container there), on a pipe of its own."""
        return self._pipe(self._on_host(argv))

    def _on_host(self, argv: Sequence[str]) -> list[str]:
        """argv as the host runs it for this connection: under `sudo -n` when the host says become."""
        return ["sudo", "-n", "--", *argv] if self.become else list(argv)

    @abstractmethod
    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        """A local port that reaches remote_host:remote_port as seen from the target."""

    @abstractmethod
    def _close_link(self) -> None:
        """Release the connection and any forwards."""

    def agent(self) -> AgentClient:
        """The target's agent, started on first use (sudo -n when the host says become)."""
        with self._agent_lock:
            # Started once: a dead agent (a lost link) fails every later call, never a silent second start.
            if self._agent is None:
                within = self._within
                # On the host: sudo runs the container's engine, not a sudo inside it.
                argv = self._on_host(bootstrap_argv(self.python, within.prefix() if within else (),
                                                    cached=self.caches_agent))
                pipe = self._pipe(argv) if within is None else within.open(self._pipe, argv, self.info.target)
                agent = AgentClient(pipe, name=self.info.target)
                agent.on_hello = lambda hello: self.on_agent(hello) if self.on_agent is not None else None
                if within is None:  # in a container, the engine's exec says what it could not run (container.py)
                    agent.why_never_ran = self._python_missing
                # The hello is checked when the first reply is read: it shares the first requests' round trip.
                self._agent = agent.start(wait=False, source_ahead=not self.caches_agent)
            return self._agent

    def _python_missing(self, stderr: str) -> PythonMissing | None:
        """The host's shell found no python where the inventory says it is: a config problem, not a lost link."""
        if not shell_found_no(self.python, stderr):
            return None
        named = f"`python: {self.python}` ({self.python_at})" if self.python_at else \
            f"python {self.python} (the default: the host names no `python:`)"
        said = visible(stderr.strip(), multiline=False)[-300:]
        return PythonMissing(f"{self.info.target}: the host has no {named}: {said}; set the host's `python:` to an "
                             "interpreter it has (`command -v python3` there says where one is)")

    def reopen(self) -> None:
        """The agent's pipe was ended on purpose (the container it ran in was restarted from its host): start a new
        agent the same way, which keeps the heartbeats the old one kept. Raises what its start met."""
        with self._agent_lock:
            agent, self._agent = self._agent, None
        if agent is not None:
            agent.close()
        if self._gate is not None:  # the old agent answered the record (else this raises): the new one needs no gate
            self._gate.result()
            self.lift_gate()
        for beat in [self.submit(beat) for beat in list(self._beats.values())]:
            beat.result()

    def call(self, request: Request[T], timeout: float | None = None) -> T:
        return self.submit(request, timeout).result(timeout)

    def submit(self, request: Request[T], timeout: float | None = None,
               after: Pending[Any] | Sequence[Pending[Any]] | None = None) -> Pending[T]:
        """Send without waiting for the reply (pipelining): a phase's requests cost one round trip. With
        `after`, the agent runs it only if that request (each of those) succeeded."""
        if request.op == "beat":  # a lock's heartbeat (agent.protocol.Beat): a reopened agent keeps it too
            beat = request.fields()
            self._beats.pop(beat["path"], None)
            if beat["interval_s"]:
                self._beats[beat["path"]] = request
        pending = self.agent().submit(request, timeout, after=after or self._gate)
        if self._gate is not None:
            self._gated.append(pending)
        return pending

    def gated(self) -> list[Pending[Any]]:
        """The write-ahead record and every request sent behind it so far: a commit sent after all of them
        runs only if the record holds and each change and check went through."""
        return [*([self._gate] if self._gate is not None else []), *self._gated]

    def skip(self, pending: Pending[Any]) -> None:
        """Have the agent skip that request if it has not started (see AgentClient.skip)."""
        self.agent().skip(pending)

    def write_ahead(self, request: Request[T], after: Sequence[Pending[Any]] | None = None) -> Pending[T]:
        """Send a record the target must hold before any change, without waiting for it: the agent runs
        every request sent after it only if it succeeded (until lift_gate), so the record and the
        changes share a round trip and a failed record lets no change through. With `after`, the record
        itself is written only if each of those succeeded."""
        pending = self.submit(request, after=after)
        self._gate, self._gated = pending, []
        return pending

    def lift_gate(self) -> None:
        """The write-ahead record was answered (held, or failed and the run is undoing): send freely again."""
        self._gate, self._gated = None, []

    def run(self, argv: Sequence[str], *, cwd: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            stdin: bytes | None = None, capture: int | None = CAPTURE_BYTES) -> ExecResult:
        """Run argv (no shell) in its own process group; on timeout the whole group is killed.

        Keeps the last `capture` bytes of stdout and of stderr (None: all of them, up to the agent's
        frame limit) and counts every byte."""
        return self.submit_run(argv, cwd=cwd, env=env, timeout=timeout, stdin=stdin, capture=capture).result()

    def submit_run(self, argv: Sequence[str], *, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                   stdin: bytes | None = None, capture: int | None = CAPTURE_BYTES,
                   after: Pending[Any] | None = None) -> Pending[ExecResult]:
        """run() without waiting: the agent runs requests in the order sent, so a phase's commands
        can all be sent at once and cost one round trip."""
        return self.submit(Run(tuple(argv), cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                               tail=capture or WHOLE_OUTPUT_BYTES), after=after)

    def put(self, data: bytes, dest: str, *, mode: int | None = None,
            timeout: float = DEFAULT_TIMEOUT_S) -> PutResult:
        """Atomically replace dest: temp file beside it, fsync, sha256 checked there, owner and mode
        kept (mode=None: the replaced file's, 0644 for a new one), rename; missing directories made."""
        return self.call(Put(dest, data, mode=mode, keep_owner=True, mkdirs=True), timeout)

    def get(self, path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> bytes | None:
        """The bytes of path, or None when it does not exist."""
        return self.call(Get(path), timeout)

    def http(self, url: str, *, timeout: float = 5.0) -> HttpResult:
        """GET on the target's own loopback (health, /metrics): no tunnel, one round trip."""
        return self.call(Http(url, timeout=timeout, check=False))

    def cancel(self) -> int:
        """Kill whatever the agent runs now (an interrupted step's command), so the requests of a restore
        are not queued behind it; how many commands it killed. Nothing to do before the agent started."""
        with self._agent_lock:
            agent = self._agent
        return 0 if agent is None else agent.call(Cancel(), timeout=10.0)

    def reach(self, url: str) -> str:
        """The URL under which this machine reaches `url` as the target sees it (a tunnel when remote)."""
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"not an absolute URL: {url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        local_port = (self.ports or self).forward(port, parts.hostname)
        return urlunsplit((parts.scheme, f"127.0.0.1:{local_port}", parts.path, parts.query, ""))

    def close(self) -> None:
        """Stop the agent (its stdin closes), then release the connection and any forwards."""
        with self._agent_lock:
            agent, self._agent = self._agent, None
        if agent is not None:
            agent.close()
        for other in self.beside:
            other.close()
        if self.ports is not None:
            self.ports.close()
        self._close_link()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
