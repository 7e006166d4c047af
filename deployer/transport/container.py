"""The agent run inside a container on the host: `<engine> exec -i <name>` before the agent's bootstrap.

Not a transport kind: it wraps the exec of any kind (ssh, local), which still brings the one pipe; inside it
the same agent speaks the same protocol, so every step, the lock and the intent record (in the container's
repo) work unchanged. The transport asks for it through `Within` (transport/base.py): the argv put in front
of the bootstrap, the facts for the run log, and what a failed start means. A `kubectl exec -i` is another
`Within`.

No probe before the exec: an engine that is missing, or a container that is absent or stopped, shows as the
exec ending before the agent said anything, and what the engine (or the host's shell) wrote on stderr says
which. That is translated here into a sentence naming the container and the engine.

A container that is its own service (its main process is the server) is stopped and started by its engine on
the host, which ends the agent inside it: those commands go to a second agent beside it, on the host itself
(`beside_container`, over the host transport's own pipe), and the agent in the container is started anew once
the container runs again (Transport.reopen).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deployer.agent.client import NeverStarted
from deployer.agent.pipe import Pipe
from deployer.config.container import Container
from deployer.errors import AgentLost, PythonMissing, TransportError
from deployer.text import visible
from deployer.transport.base import Transport, TransportInfo
from deployer.transport.pipes import shell_found_no

# What docker and podman (4.x) print when the container exists but runs no process to exec into.
NOT_RUNNING = ("can only create exec sessions on running containers", "is not running", "is paused",
               "container state improper")
NO_SUCH = ("no such container", "no container with name or id")
HOST_PYTHON = "python3"  # the agent beside a container runs on the host: the inventory's python is the container's


class ContainerExec:
    """`Within` for a container: the agent is `<engine> exec -i <name> <python> ...` on the host."""

    def __init__(self, container: Container) -> None:
        self.container = container

    def prefix(self) -> list[str]:
        # -i: the exec passes our stdin through (the agent's source, then the protocol); no -t: a tty
        # would mangle the binary frames.
        return [self.container.command, "exec", "-i", self.container.name]

    def facts(self) -> dict[str, str]:
        return {"container": self.container.name, "engine": self.container.engine,
                "engine_command": self.container.command}

    def open(self, start: Callable[[Sequence[str]], Pipe], argv: Sequence[str], host: str) -> Pipe:
        """The host's transport starts argv; a start that fails here (a local engine that does not exist)
        or before the agent speaks (the exec's own error) is said as the container's problem."""
        try:
            pipe = start(argv)
        except TransportError as exc:  # the engine's command could not be executed at all
            raise AgentLost(f"{host}: {self._no_engine(str(exc).removeprefix(f'{host}: '))}") from None
        return ContainerPipe(pipe, self.explain)

    def explain(self, stderr: str) -> str:
        """What went wrong before the agent ran, from what the exec wrote on stderr."""
        engine, name, command = self.container.engine, self.container.name, self.container.command
        said = visible(stderr.strip(), multiline=False)[-500:]
        low = stderr.lower()
        if shell_found_no(command, stderr):
            return self._no_engine(stderr)
        if any(marker in low for marker in NO_SUCH):
            return f"the host has no {engine} container {name!r}: {said}"
        if any(marker in low for marker in NOT_RUNNING):
            return f"the {engine} container {name!r} is not running (start it: {command} start {name}): {said}"
        return f"{command} exec -i {name} ended before the agent started: {said}"

    def _no_engine(self, said: str) -> str:
        engine, command = self.container.engine, self.container.command
        return (f"the container engine {engine} ({command}) is not installed on the host, so container "
                f"{self.container.name!r} cannot be reached: {visible(said.strip(), multiline=False)[-500:]}")


class ContainerPipe:
    """The host transport's pipe to `<engine> exec`: the same bytes, and when the exec ended before the agent
    wrote a byte, its stderr as the sentence `explain` makes of it: the read raises it as NeverStarted (the
    client's failure begins with the container and the engine), and the stderr tail is it too."""

    def __init__(self, pipe: Pipe, explain: Callable[[str], str]) -> None:
        self._pipe = pipe
        self._explain = explain
        self._started = False

    def read(self, size: int) -> bytes:
        data = self._pipe.read(size)
        self._started = self._started or bool(data)
        if not self._started and (tail := self._pipe.stderr_tail()).strip():  # the end, before the agent ran
            raise NeverStarted(self._explain(tail))
        return data

    def write(self, data: bytes) -> None:
        try:
            self._pipe.write(data)
        except OSError:
            if self._started:
                raise
            # The exec ended before it took the agent's source: its stderr (being read as we fail) says why, all of
            # it once it ended (its first line alone, read by a starved reader, was kubectl's retry, not its reason).
            tail = self._pipe.stderr_tail(ended=True)
            if not tail.strip():
                raise
            raise NeverStarted(self._explain(tail)) from None

    def close(self, kill: bool = False) -> None:
        self._pipe.close(kill)  # the exec's group on the host: what runs inside the container is the engine's

    def stderr_tail(self, *, ended: bool = False) -> str:
        tail = self._pipe.stderr_tail(ended=ended)
        return tail if self._started or not tail.strip() else self._explain(tail)


class HostSide(Transport):
    """The host around a container, reached over the host transport's own pipe (under its sudo when it becomes):
    an agent on the host itself, beside the one in the container, for what must outlive the container's restart."""

    def __init__(self, around: Transport, python: str = HOST_PYTHON) -> None:
        super().__init__(python=python)  # become: the host_pipe it starts over says sudo already
        self.around = around
        self.info = TransportInfo(kind=around.info.kind, target=around.info.target, extra={"beside": "container"})

    def _pipe(self, argv: Sequence[str]) -> Pipe:
        return self.around.host_pipe(argv)

    def _python_missing(self, stderr: str) -> PythonMissing | None:
        # Not the inventory's `python:`, which is the container's: the host's own, for its engine's commands.
        if not shell_found_no(self.python, stderr):
            return None
        said = visible(stderr.strip(), multiline=False)[-300:]
        return PythonMissing(f"{self.info.target}: the host has no {self.python} to run the agent beside the "
                             "container that is its own service (the engine's stop ends the agent inside it, so "
                             f"the restart runs from the host): {said}; install {self.python} on the host")

    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        return self.around.forward(remote_port, remote_host)

    def _close_link(self) -> None:
        pass  # the link is the around transport's


def beside_container(transport: Transport) -> Transport:
    """The agent on the host beside the container transport's agent: one per connection, opened on first use and
    closed with it."""
    found = next((t for t in transport.beside if isinstance(t, HostSide)), None)
    if found is None:
        found = HostSide(transport)
        transport.beside.append(found)
    return found
