"""A target that is a directory on this machine: the agent runs as a local subprocess.

The same agent as over SSH, so local runs (the demo, most tests) exercise the code SSH runs."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from deployer.agent.client import AgentClient, bootstrap_argv
from deployer.agent.pipe import Pipe
from deployer.agent.protocol import IO_TIMEOUT_S
from deployer.transport.base import Transport, TransportInfo
from deployer.transport.kinds import Row
from deployer.transport.pipes import local_pipe

if TYPE_CHECKING:
    from deployer.config.models import LocalHost
    from deployer.transport.kinds import Emitter


def open_host(name: str, host: LocalHost, bus: Emitter, accept_new_host_key: bool) -> LocalTransport:
    """The registry's opener for `transport: local` (transport/kinds.py): no link, no host key."""
    return LocalTransport(name, python=host.python, become=host.become)


def rows(transport: Transport, host: LocalHost, dests: list[str]) -> list[Row]:
    """The kind's rows of `check` (transport/kinds.py): nothing to connect to."""
    return [Row("host key", "ok", "local host: no SSH"), Row("auth", "ok", "local host: no SSH")]


def spawn_agent(python: str = sys.executable, *, name: str = "local", timeout: float = IO_TIMEOUT_S) -> AgentClient:
    """The agent as a local subprocess, spoken to directly (no Transport around it)."""
    return AgentClient(local_pipe(bootstrap_argv(python), name), name=name).start(timeout)


class LocalTransport(Transport):
    def __init__(self, name: str = "local", *, python: str = sys.executable, become: bool = False) -> None:
        super().__init__(python=python, become=become)
        self.info = TransportInfo(kind="local", target=name)

    def _pipe(self, argv: Sequence[str]) -> Pipe:
        return local_pipe(argv, self.info.target)

    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        # The target's loopback is ours: nothing to tunnel.
        return remote_port

    def reach(self, url: str) -> str:
        return url if self.ports is None else super().reach(url)

    def _close_link(self) -> None:
        pass
