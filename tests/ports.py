"""Ports for the servers a test starts, never handed to another test worker.

A port from bind(("127.0.0.1", 0)) is free only until the socket closes: a test on another xdist worker can be
handed the same one before our server binds it, and a co_restart then found the other test's http.server
answering its health URL ("answers 200, but no process deployer started runs prefill"). So each worker takes
ports from its own slice, below the kernel's ephemeral range where the system has room for it (bind(0) and
outgoing connections take theirs from that range), and only one that binds now.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

BASE = 10000
MOST_PER_WORKER = 2000


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_slice() -> range:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    low = ephemeral_low()
    top = low if low - BASE >= count * 100 else 65535
    span = min(MOST_PER_WORKER, (top - BASE) // count)
    return range(BASE + index * span, BASE + (index + 1) * span)


_SLICE = worker_slice()
# Started anywhere in the slice: two processes of one worker (a test and a helper it runs) rarely meet.
_NEXT = itertools.islice(itertools.cycle(_SLICE), random.randrange(len(_SLICE)), None)


def binds(port: int, family: int) -> bool:
    with socket.socket(family) as sock:
        try:
            sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(family: int = socket.AF_INET) -> int:
    for _ in range(len(_SLICE)):
        port = next(_NEXT)
        if binds(port, family):
            return port
    raise RuntimeError(f"no free port in this worker's slice {_SLICE.start}-{_SLICE.stop - 1}")


def free_ports(n: int) -> list[int]:
    """n distinct free ports."""
    return [free_port() for _ in range(n)]


def demo_ports(units: int = 1) -> list[dict[str, int]]:
    """The demo's ports for `units` units (deployer.demo.run.unit_ports), from this worker's slice."""
    from deployer.demo.run import PORT_NAMES, unit_ports

    return unit_ports(units, free_ports(units * len(PORT_NAMES)))
