"""The ranks of one server spanning nodes (``--nnodes 2 --node-rank N --dist-init-addr HOST:PORT``).

Upstream, every rank runs the same launch command and waits at the rendezvous (torch.distributed on
``--dist-init-addr``) until all have joined; only rank 0 then serves HTTP, so the other ranks' liveness is
their process. Here the rendezvous is a loopback TCP socket: rank 0 listens on it and binds its HTTP port only
once every other rank connected; a rank > 0 connects (retrying while rank 0 is not up yet) and then lives
until it is stopped. When one rank fails, rank 0 does not exit (sglang#3099): it waits on.
"""

from __future__ import annotations

import contextlib
import socket
import sys

from sglang.srt.demo_http import StopFlag, require_loopback

CONNECT_RETRY_S = 0.1


def address(spec: str) -> tuple[str, int]:
    host, _, port = spec.rpartition(":")
    host = host.strip("[]")
    require_loopback(host, "--dist-init-addr")
    if not port.isdigit():
        raise SystemExit(f"--dist-init-addr {spec!r}: not HOST:PORT")
    return host, int(port)


def gather(spec: str, nnodes: int, stop: StopFlag) -> list[socket.socket] | None:
    """Rank 0: wait until ranks 1..nnodes-1 joined (their sockets, kept open), or None once stopped."""
    host, port = address(spec)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(nnodes)
    listener.settimeout(0.05)
    joined: list[socket.socket] = []
    print(f"[rank 0] waiting at {spec} for {nnodes - 1} more rank(s)", flush=True)
    try:
        while len(joined) < nnodes - 1:
            if stop.requested:
                return None
            with contextlib.suppress(TimeoutError):
                conn, _ = listener.accept()
                joined.append(conn)
                print(f"[rank 0] rank joined ({len(joined)} of {nnodes - 1})", flush=True)
    finally:
        listener.close()
    return joined


def follow(spec: str, rank: int, crash_s: float | None, stop: StopFlag) -> int:
    """Rank > 0: join rank 0's rendezvous, then live until stopped (no HTTP port: the process is the rank)."""
    host, port = address(spec)
    if crash_s is not None:  # fails before it joins: rank 0 waits on at the rendezvous
        if stop.sleep(crash_s):
            return 0
        print(f"[rank {rank}] RuntimeError: NCCL init failed before the rendezvous (demo crash knob)",
              file=sys.stderr, flush=True)
        return 1
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=1.0)
            break
        except OSError:
            if stop.sleep(CONNECT_RETRY_S):  # rank 0 is not listening yet
                return 0
    print(f"[rank {rank}] joined the rendezvous at {spec}", flush=True)
    stop.wait()
    print(f"[rank {rank}] stopping", flush=True)
    conn.close()
    return 0
