"""Open the transport an inventory host asks for (now, or on a thread of its own while the run sets up)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from deployer.agent.client import agent_code
from deployer.config.models import Host
from deployer.transport.base import Transport
from deployer.transport.container import ContainerExec
from deployer.transport.kinds import Emitter, opener
from deployer.waiting import joined

if TYPE_CHECKING:
    from deployer.agent.protocol import Hello


def open_transport(name: str, host: Host, bus: Emitter, *, accept_new_host_key: bool = False) -> Transport:
    transport = opener(host.transport)(name, host, bus, accept_new_host_key)
    if host.container is not None:  # over whichever kind reached the host: its exec, wrapped
        transport.run_within(ContainerExec(host.container))

    def started(hello: Hello) -> None:
        # Which agent ran, by the sha256 of its source, as whom and under which python.
        bus.emit("agent", sha256=hello.sha256, version=hello.version, python=hello.python,
                 executable=hello.executable, pid=hello.pid, uid=hello.uid, euid=hello.euid,
                 bytecode=hello.bytecode)

    transport.on_agent = started
    return transport


class Opening:
    """A host's transport opened, and its agent started, on a thread of its own: a far target's handshake
    round trips overlap the rest of the set-up here. What it emits before the run's bus exists is held
    and handed on when the run claims it (as a Connector). Claimed once; a second claim opens anew."""

    def __init__(self, name: str, host: Host, *, accept_new_host_key: bool = False) -> None:
        self._args = (name, host, accept_new_host_key)
        self._lock = threading.Lock()
        self._held: list[tuple[str, dict[str, Any]]] = []
        self._bus: Emitter | None = None
        self._outcome: Transport | BaseException | None = None
        self._claimed = False
        opener(host.transport)  # its module imported here, so the thread spends its time waiting, not importing
        self._thread = threading.Thread(target=self._open, name=f"open-{name}", daemon=True)
        self._thread.start()

    def emit(self, kind: str, /, **data: Any) -> None:
        with self._lock:
            bus = self._bus
            if bus is None:
                self._held.append((kind, data))
                return
        bus.emit(kind, **data)

    def _open(self) -> None:
        name, host, accept = self._args
        try:
            transport = open_transport(name, host, self, accept_new_host_key=accept)
            transport.agent()  # the exec and the agent's source go out; its hello is read with the first reply
            self._outcome = transport
        except BaseException as exc:  # handed to the run that claims it, as if it had connected itself
            self._outcome = exc

    def __call__(self, bus: Emitter) -> Transport:
        if self._claimed:
            name, host, accept = self._args
            return open_transport(name, host, bus, accept_new_host_key=accept)
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
        """The run never claimed it (its set-up failed first): close what was opened, if it is done."""
        if not self._claimed and not self._thread.is_alive() and isinstance(self._outcome, Transport):
            self._outcome.close()
