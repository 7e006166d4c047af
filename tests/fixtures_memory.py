"""A target without sshd or an agent subprocess: the real agent served on a thread of this process.

The agent is deployer/agent/agent.py, the very program sent to targets, and it reads its own source off the
stream as the bootstrap does (so the client's hello check is the real one); the client, the framing, the
Transport and the Context above it are the ones a run uses. Only the agent's process is this one: its
commands (git, the target's python) are still real processes, its files real files in a temp repo.
So a step's plan() and run() are unit-tested in milliseconds per round trip.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import ORIGINAL_A, ORIGINAL_B, init_repo

from deployer.agent import agent
from deployer.agent.client import agent_code, agent_source, bootstrap_argv
from deployer.agent.pipe import CHUNK
from deployer.command import Masker
from deployer.config.models import FileSpec, Host, Playbook
from deployer.run.preflight import preflight
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Context, EventBus, LoadedPlaybook
from deployer.transport.local import LocalTransport

CLOSE_WAIT_S = 5.0


class ThreadAgent(agent.Agent):
    def shutdown(self, code: int) -> None:
        # The real one ends its process (os._exit) once its stdin closes; this process is pytest, so only
        # the serving ends. What it still runs is killed all the same.
        with self._groups_lock:
            groups = list(self._groups)
        for pgid in groups:
            agent._kill_group(pgid)


class MemoryPipe:
    """A socketpair: our end is the Pipe the AgentClient speaks over, the other end the agent's stdin/stdout."""

    def __init__(self) -> None:
        self._ours, theirs = socket.socketpair()
        self._served = threading.Thread(target=self._serve, args=(theirs,), name="memory-agent", daemon=True)
        self._served.start()

    @staticmethod
    def _serve(theirs: socket.socket) -> None:
        with theirs, theirs.makefile("rb") as proto_in, theirs.makefile("wb") as proto_out:
            # What the bootstrap does: read exactly the source off stdin (and our bytecode of it), then run it.
            source = proto_in.read(len(agent_source()))
            proto_in.read(len(agent_code()))
            ThreadAgent(source, proto_in, proto_out).serve()

    def read(self, size: int) -> bytes:
        return self._ours.recv(min(size, CHUNK))

    def write(self, data: bytes) -> None:
        self._ours.sendall(data)

    def close(self, kill: bool = False) -> None:  # kill: the agent is a thread here, no process to kill
        with contextlib.suppress(OSError):  # already shut: a second close
            self._ours.shutdown(socket.SHUT_WR)  # the agent's EOF: it stops serving
        self._served.join(CLOSE_WAIT_S)
        self._ours.close()

    def stderr_tail(self, *, ended: bool = False) -> str:
        return ""  # the agent shares this process's stderr: pytest shows what it wrote

    @property
    def serving(self) -> bool:
        return self._served.is_alive()


class MemoryTransport(LocalTransport):
    """LocalTransport whose pipe is a MemoryPipe instead of a subprocess: every line above the pipe is shared."""

    def __init__(self, name: str = "memory") -> None:
        super().__init__(name)
        self.pipes: list[MemoryPipe] = []

    def _pipe(self, argv: Any) -> MemoryPipe:
        assert list(argv) == bootstrap_argv(self.python), "the transport asked for another program than the agent"
        self.pipes.append(MemoryPipe())
        return self.pipes[-1]


@dataclass
class MemoryTarget:
    """A temp git repo as the target, and Contexts on it over the in-memory agent; `events` is what they emitted."""

    root: Path
    repo: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    transports: list[MemoryTransport] = field(default_factory=list)

    def context(self, files: dict[str, bytes] | None = None, *, patch: bytes | None = None,
                **host: Any) -> Context:
        """A Context shipping `files` (dest -> new bytes) or `patch`, prepared by the real preflight."""
        model = Playbook(name="unit", files=[FileSpec(src=Path(d).name, dest=d, create=not (self.repo / d).exists())
                                             for d in files or {}],
                         patch=None if patch is None else "fix.diff", steps=["upload"])
        playbook = LoadedPlaybook(path=self.root / "fix.yaml", raw=b"", model=model, sources=dict(files or {}),
                                  patch=patch)
        bus = EventBus(Masker(), "memory")
        bus.listeners.append(self.events.append)
        transport = MemoryTransport()
        self.transports.append(transport)
        ctx = Context(run_id="20260101T000000.000Z-memory", host_name="memory",
                      host=Host.model_validate({"repo": str(self.repo), "python": sys.executable,
                                                "transport": "local", **host}),
                      transport=transport, playbook=playbook, bus=bus, cancel=CancelToken())
        preflight(ctx, allow_dirty=False)
        return ctx

    def of(self, kind: str, where: Callable[[dict[str, Any]], bool] = lambda e: True) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind and where(e)]


@pytest.fixture
def memory_target(tmp_path: Path) -> Iterator[MemoryTarget]:
    repo = tmp_path / "repo"
    init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B,
                     "README": "target repo\n"})
    target = MemoryTarget(root=tmp_path, repo=repo)
    yield target
    for transport in target.transports:
        transport.close()
        assert not any(pipe.serving for pipe in transport.pipes), "an in-memory agent outlived its transport"
