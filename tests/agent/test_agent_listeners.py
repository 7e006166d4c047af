"""Who listens on a port: the agent asks the kernel's sock_diag (as `ss` does), which walks listening sockets only,
and reads /proc/net/tcp{,6} where that is refused. Both readings are checked against real sockets of this process:
listeners on IPv4 and IPv6, and, on the same port, an accepted connection and a client's, which listen on nothing."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from deployer.agent import agent


def inode(sock: socket.socket) -> int:
    return os.stat(f"/proc/self/fd/{sock.fileno()}").st_ino


@pytest.fixture
def sockets() -> Iterator[dict[str, socket.socket]]:
    with ExitStack() as stack:
        made: dict[str, socket.socket] = {}
        for name, family, address in (("v4", socket.AF_INET, "127.0.0.1"), ("v6", socket.AF_INET6, "::1")):
            listener = stack.enter_context(socket.socket(family))
            listener.bind((address, 0))
            listener.listen()
            made[name] = listener
        client = stack.enter_context(socket.create_connection(made["v4"].getsockname()[:2]))
        accepted, _ = made["v4"].accept()
        stack.enter_context(accepted)
        made |= {"client": client, "accepted": accepted}
        yield made


def port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def test_sock_diag_and_proc_net_name_the_same_listeners_and_no_connection(
        sockets: dict[str, socket.socket]) -> None:
    by_diag = agent._diag_listeners()
    assert by_diag is not None, "this kernel answers sock_diag (as `ss` needs)"
    by_proc = agent._proc_net_listeners()
    for reading in (by_diag, by_proc):
        assert reading[inode(sockets["v4"])] == port(sockets["v4"])
        assert reading[inode(sockets["v6"])] == port(sockets["v6"])
        assert inode(sockets["accepted"]) not in reading  # on the listener's port, but a connection
        assert inode(sockets["client"]) not in reading
    # Other listeners of this namespace may come and go between the two reads: ours must be in both alike.
    ours = {inode(sockets[name]) for name in ("v4", "v6")}
    assert {i: p for i, p in by_diag.items() if i in ours} == {i: p for i, p in by_proc.items() if i in ours}


def test_only_the_ports_asked_for_are_named(sockets: dict[str, socket.socket]) -> None:
    wanted = {port(sockets["v6"])}
    assert agent._listening_inodes(wanted) == {inode(sockets["v6"]): port(sockets["v6"])}
    assert agent._listening_inodes({port(sockets["client"])}) == {}  # a client's own port listens on nothing


def test_where_sock_diag_is_refused_proc_net_still_names_the_listener(
        sockets: dict[str, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    # A sandbox that refuses netlink sockets (seccomp, an old kernel) cannot be made here without root-only
    # tools, so socket creation is refused by a patch: the one stand-in of this file.
    real = socket.socket

    def refused(family: int = -1, *args: object, **kwargs: object) -> socket.socket:
        if family == socket.AF_NETLINK:
            raise PermissionError(1, "Operation not permitted")
        return real(family, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", refused)
    assert agent._diag_listeners() is None
    wanted = {port(sockets["v4"]), port(sockets["v6"])}
    assert agent._listening_inodes(wanted) == {inode(sockets["v4"]): port(sockets["v4"]),
                                               inode(sockets["v6"]): port(sockets["v6"])}
