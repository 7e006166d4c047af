"""The agent sees a service as the process tree it is: its session, children that left its process group or
were reparented, and whoever listens on its port; and it signals only the processes it listed.

Real processes throughout: a leader in its own session whose child ignores SIGTERM, moves to a process group
of its own and holds a listening socket after the leader has exited (as SGLang's scheduler does)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ports import free_port

from deployer.agent.client import AgentClient
from deployer.agent.processes import Procs, Signal
from deployer.errors import DeployerError
from deployer.transport.local import spawn_agent

DEADLINE_S = 15.0

# argv: ready-file port family. The leader forks a child that ignores TERM, takes a process group of its
# own and listens on the port; the leader writes "LEADER CHILD" to the ready file once the child listens,
# then exits, so the child is reparented.
TREE = textwrap.dedent("""
    import os, signal, socket, sys, time
    ready, port, family = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setpgid(0, 0)
        sock = socket.socket(socket.AF_INET6 if family == "6" else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::1" if family == "6" else "127.0.0.1", port))
        sock.listen()
        os.write(w, b"x")
        while True:
            time.sleep(60)
    os.read(r, 1)
    with open(ready + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child}")
    os.rename(ready + ".tmp", ready)
""")


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE_S}s"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def ignores_term(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


class Tree:
    def __init__(self, leader: subprocess.Popen[bytes], child: int, port: int) -> None:
        self.leader, self.child, self.port = leader, child, port
        self.sid = leader.pid  # start_new_session: the leader's pid is the session id


@pytest.fixture(params=["4", "6"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tree]:
    family = request.param
    port = free_port(socket.AF_INET6 if family == "6" else socket.AF_INET)
    ready = tmp_path / "ready"
    leader = subprocess.Popen([sys.executable, "-c", TREE, str(ready), str(port), family], start_new_session=True)
    child = 0
    try:
        wait_until(ready.exists, "the tree's child listens")
        child = int(ready.read_text().split()[1])
        leader.wait(DEADLINE_S)  # the leader exits: the child is an orphan now, as after a killed server
        yield Tree(leader, child, port)
    finally:
        for pid in (child, leader.pid):
            if pid and not gone(pid):
                os.kill(pid, signal.SIGKILL)
        if child:
            wait_until(lambda: gone(child), "the child is killed")


@pytest.fixture
def client() -> Iterator[AgentClient]:
    with spawn_agent() as agent:
        yield agent


def test_a_session_lists_the_child_that_left_its_process_group_and_outlived_its_leader(
        client: AgentClient, tree: Tree) -> None:
    found = client.call(Procs(sessions=[tree.sid]))
    pids = [p.pid for p in found.procs if p.alive]
    assert pids == [tree.child]
    (child,) = (p for p in found.procs if p.pid == tree.child)
    assert child.sid == tree.sid and child.pgid == tree.child != tree.sid
    assert child.ppid != tree.sid  # reparented
    assert child.cmdline[:2] == (sys.executable, "-c")
    assert child.rss_kb > 0 and child.uid == os.getuid()
    assert client.call(Procs(groups=[tree.sid])).procs == ()  # the leader's group is empty: the group misses it


def test_the_process_listening_on_a_port_is_found_whatever_its_address_family(client: AgentClient,
                                                                               tree: Tree) -> None:
    found = client.call(Procs(ports=[tree.port]))
    assert [(p.pid, p.listens) for p in found.procs] == [(tree.child, (tree.port,))]
    assert found.unowned == ()
    assert client.call(Procs(ports=[free_port()])).procs == ()


def test_a_signal_reaches_only_the_process_that_was_listed(client: AgentClient, tree: Tree) -> None:
    (child,) = client.call(Procs(sessions=[tree.sid])).procs
    assert client.call(Signal("TERM", [(child.pid, child.start)])) == {child.pid: "signalled"}
    assert ignores_term(child.pid) and not gone(child.pid)  # delivered and discarded: it lives on
    # A pid whose start time differs is another process (the pid was recycled): never signalled.
    stale = str(int(child.start) - 1)
    assert client.call(Signal("KILL", [(child.pid, stale)])) == {child.pid: "gone"}
    assert not gone(child.pid)
    assert client.call(Signal("KILL", [(child.pid, child.start)])) == {child.pid: "signalled"}
    wait_until(lambda: gone(child.pid), "the KILLed child goes")
    assert client.call(Signal("KILL", [(child.pid, child.start)])) == {child.pid: "gone"}


def test_the_agent_never_lists_itself(client: AgentClient, tree: Tree) -> None:
    # A pid read from a cut run's lock may be the asking agent's own in a fresh pid namespace: never a cut agent.
    assert client.hello is not None
    own = client.hello.pid
    assert [p.pid for p in client.call(Procs(pids=[own, tree.child])).procs] == [tree.child]


@pytest.mark.parametrize(("request_", "refusal"), [
    (Signal("STOP", [(os.getpid(), "1")]), "sig must be one of HUP, INT, KILL, TERM"),
    (Signal("KILL", [(1, "1")]), "each of procs must be {pid: int > 1, start: str}"),
    (Procs(pids=[-3]), "pids must be a list of positive integers")], ids=["unknown-signal", "pid-1", "negative-pid"])
def test_the_agent_refuses_signals_and_selections_it_was_not_made_for(client: AgentClient, request_: Signal | Procs,
                                                                     refusal: str) -> None:
    with pytest.raises(DeployerError) as refused:
        client.call(request_)
    assert refusal in str(refused.value)
