"""A target with a loopback of its own: sshd (and all it starts) in a network namespace.

Every other SSH test target shares 127.0.0.1 with the test, so a transport that skipped the
tunnel to a URL on the target's loopback would still pass. Here sshd listens on 10.231.X.2 inside
a namespace the fixture creates, reached over a veth pair from 10.231.X.1; the services it starts
bind the namespace's 127.0.0.1, which the test process cannot reach except through the connection.

Needs root and `ip netns` (iproute2). Locally a missing one skips; with CI=true it fails.
Deleting a namespace does not kill its processes: teardown kills every pid in it first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fixtures_ssh import SSHD, SshdUnavailable, _unavailable, running_sshd


@dataclass(frozen=True)
class Netns:
    name: str
    host_end: str  # our side of the veth pair
    target: str  # the namespace's side: where sshd listens

    def exec(self, *argv: str) -> list[str]:
        """argv run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def fetch(self, url: str, timeout: float = 10) -> str:
        """GET url as the target sees it (its own loopback), from inside the namespace."""
        code = ("import sys, urllib.request; "
                "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())")
        return subprocess.run(self.exec(sys.executable, "-c", code, url, str(timeout)), check=True,
                              capture_output=True, text=True, timeout=timeout + 20).stdout

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _free_subnet() -> int:
    """An X with no 10.231.X.0/30 address on this machine (parallel sessions pick different ones)."""
    taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    start = os.getpid() % 250
    for offset in range(250):
        x = (start + offset) % 250
        if f" 10.231.{x}." not in taken:
            return x
    raise SshdUnavailable("no free 10.231.X.0/30 subnet")


@contextlib.contextmanager
def network_namespace() -> Iterator[Netns]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise SshdUnavailable("network namespaces need root and iproute2's `ip`")
    tag = f"{os.getpid() % 100000}"
    x = _free_subnet()
    ns = Netns(name=f"deployer-test-{tag}", host_end=f"10.231.{x}.1", target=f"10.231.{x}.2")
    outer, inner = f"dtv{tag}h", f"dtv{tag}n"
    try:
        _ip("netns", "add", ns.name)
    except subprocess.CalledProcessError as exc:
        raise SshdUnavailable(f"ip netns add failed: {exc.stderr.strip()}") from None

    def remove() -> None:
        for pid in ns.pids():  # the namespace's processes outlive it otherwise
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", outer)  # usually gone with its peer already
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", ns.name)

    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns.name)
        _ip("addr", "add", f"{ns.host_end}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("netns", "exec", ns.name, "ip", "addr", "add", f"{ns.target}/30", "dev", inner)
        _ip("netns", "exec", ns.name, "ip", "link", "set", inner, "up")
        _ip("netns", "exec", ns.name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        remove()
        raise SshdUnavailable(f"setting up the namespace failed: {exc.cmd}: {exc.stderr.strip()}") from None
    try:
        yield ns
    finally:
        remove()


@dataclass(frozen=True)
class NetnsSSHD:
    sshd: SSHD
    netns: Netns


@pytest.fixture(scope="session")
def netns_sshd() -> Iterator[NetnsSSHD]:
    """An sshd inside its own network namespace; a skip where that cannot be set up, a failure on CI."""
    with contextlib.ExitStack() as stack:
        try:
            ns = stack.enter_context(network_namespace())
            server = stack.enter_context(running_sshd(address=ns.target, wrap=tuple(ns.exec())))
        except SshdUnavailable as exc:
            _unavailable(str(exc))
        yield NetnsSSHD(server, ns)
