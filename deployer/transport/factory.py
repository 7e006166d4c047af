"""Open the transport an inventory host asks for (now, or on a thread of its own while the run sets up)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deployer.agent.client import agent_code
from deployer.transport.base import Transport
from deployer.transport.kinds import Emitter, opener
from deployer.transport.ssh.params import SshParams
from deployer.waiting import joined

if TYPE_CHECKING:
    from deployer.agent.protocol import Hello
    from deployer.config.models import Host


def open_transport(name: str, host: Host, bus: Emitter, *, accept_new_host_key: bool = False) -> Transport:
    return finished(opener(host.transport)(name, host, bus, accept_new_host_key), host, bus)


def finished(transport: Transport, host: Host, bus: Emitter) -> Transport:
    """transport with what its host adds to any kind: its container's exec, and the agent's report on bus."""
    if host.container is not None:  # over whichever kind reached the host: its exec, wrapped
        from deployer.transport.container import ContainerExec  # its model's module imports pydantic: not early

        transport.run_within(ContainerExec(host.container))

    def started(hello: Hello) -> None:
        # Which agent ran, by the sha256 of its source, as whom and under which python.
        bus.emit("agent", sha256=hello.sha256, version=hello.version, python=hello.python,
                 executable=hello.executable, pid=hello.pid, uid=hello.uid, euid=hello.euid,
                 bytecode=hello.bytecode)

    transport.on_agent = started
    transport.python_at = host.python_at
    return transport


class Opening:
    """A host's transport opened, and its agent started, on a thread of its own: a far target's handshake
    round trips overlap the rest of the set-up here. What it emits before the run's bus exists is held
    and handed on when the run claims it (as a Connector). Claimed once; a second claim opens anew.

    An early one (transport/early.py) connects before its host's model exists; its agent starts once `release`
    gives that host or, where the record says the host has neither `become` nor a container, as soon as the login
    is in, idle until its first request; `discard` closes it unused."""

    def __init__(self, name: str, connect: Callable[[Emitter], Transport], host: Host | None, *,
                 accept_new_host_key: bool = False, params: SshParams | None = None,
                 agent_ahead: bool = False) -> None:
        self.name = name
        self.params = params  # an early one's: what it connected with
        self.agent_ahead = agent_ahead  # an early one's agent, started before the release
        self._connect = connect
        self._accept = accept_new_host_key
        self._host = host
        self._go = threading.Event()  # the host is known (or, with none, the opening is dropped)
        if host is not None:
            self._go.set()
        self._lock = threading.Lock()
        self._held: list[tuple[str, dict[str, Any]]] = []
        self._bus: Emitter | None = None
        self._outcome: Transport | BaseException | None = None
        self._claimed = False
        self._discarded = False
        self._thread = threading.Thread(target=self._open, name=f"open-{name}", daemon=True)
        self._thread.start()

    @classmethod
    def of(cls, name: str, host: Host, *, accept_new_host_key: bool = False) -> Opening:
        """host's connection and agent, opened now, its config loaded and checked."""
        kind = opener(host.transport)  # its module imported here, so the thread spends its time waiting, not importing
        return cls(name, lambda bus: kind(name, host, bus, accept_new_host_key), host,
                   accept_new_host_key=accept_new_host_key)

    @classmethod
    def early(cls, name: str, params: SshParams, *, agent_ahead: bool = False) -> Opening:
        """An SSH connection to name opened now, with params, before the config that gives them is loaded;
        agent_ahead (never under `become`): its agent started too, on the host itself, idle until the release."""
        # Imported here, before the thread starts: imported by it, paramiko's import shares the GIL (and module
        # locks) with the main thread's load of the config, and the connection's first byte waits for both.
        from deployer.transport.ssh.transport import connect_host

        agent_ahead = agent_ahead and not params.become  # a sudo is a privilege asked for: only once checked

        def connect(bus: Emitter) -> Transport:
            transport = connect_host(name, params, bus, False)
            if agent_ahead:  # its interpreter's start (most of the agent's) off the run's path: it reads, runs nothing
                transport.agent()
            else:
                transport.open_ahead()  # the agent's channel, opened while the config loads: it runs nothing yet
            return transport

        return cls(name, connect, None, params=params, agent_ahead=agent_ahead)

    def fits(self, name: str, host: Host) -> bool:
        """An early opening that connected as the checked config's host says to: its name and its params (and,
        for one whose agent went ahead, a host whose agent runs on the host itself: no container)."""
        from deployer.config.models import SshHost  # loaded by now: the host is its

        return (self.params is not None and name == self.name and isinstance(host, SshHost)
                and SshParams.of(name, host) == self.params
                and not (self.agent_ahead and host.container is not None))

    def release(self, host: Host) -> None:
        """The config is loaded and checked here, and gives this host: the agent may start."""
        self._host = host
        self._go.set()

    def emit(self, kind: str, /, **data: Any) -> None:
        with self._lock:
            bus = self._bus
            if bus is None:
                self._held.append((kind, data))
                return
        bus.emit(kind, **data)

    def _open(self) -> None:
        try:
            transport = self._connect(self)
        except BaseException as exc:  # handed to the run that claims it, as if it had connected itself
            self._outcome = exc
            return
        self._go.wait()  # at once, but for an early opening: on this thread, not the main one (which handles signals)
        if self._host is None:  # discarded before its release: nothing ran on the host
            with contextlib.suppress(Exception):
                transport.close()
            return
        if self.params is not None:  # the run log says so: this login came before the config was loaded again
            transport.info.extra["opened"] = "early"
        if self.agent_ahead:  # and its agent with it
            transport.info.extra["agent"] = "ahead"
        try:
            finished(transport, self._host, self).agent()  # the exec and the agent's source go out; its hello is read
        except BaseException as exc:                          # with the first reply
            with contextlib.suppress(Exception):  # no one claims a transport whose agent never started
                transport.close()
            self._outcome = exc
            return
        with self._lock:  # one of this and discard() sees the other's mark: the transport is closed exactly once
            self._outcome, discarded = transport, self._discarded
        if discarded:  # the run gave up on it while it was opening
            with contextlib.suppress(Exception):
                transport.close()

    def __call__(self, bus: Emitter) -> Transport:
        assert self._host is not None, "claimed before its release"
        if self._claimed:
            return open_transport(self.name, self._host, bus, accept_new_host_key=self._accept)
        self._claimed = True
        # The agent's bytecode, made while the thread waits on the handshake (not by it before its exec); here, not
        # at the thread's start: making it holds the GIL, and the connect's first byte must not wait for it.
        agent_code()
        joined(self._thread)
        with self._lock:
            self._bus, held, self._held = bus, self._held, []
        for kind, data in held:
            bus.emit(kind, **data)
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None
        return self._outcome

    def discard(self) -> None:
        """The run never claimed it (its set-up failed first, or an early one did not fit): close what was opened,
        now if it is done, else by the thread once it is. An early one never released starts no agent."""
        self._go.set()
        if self._claimed:
            return
        with self._lock:
            self._discarded, outcome = True, self._outcome
        if isinstance(outcome, Transport):
            outcome.close()
