"""The demo server's scheduler: a child process that behaves at a stop as SGLang's does.

Upstream, the scheduler (and the detokenizer) are child processes of the server, and they hold the GPU.
When the server stops cleanly it takes them down with it; when it is killed they are reparented to init
and keep the GPU (sglang#23627). This child is forked after the server bound its sockets, so, like a
worker that inherited them (sglang#15165), it holds the server's ports too: while it lives, no new server
can bind. It ignores SIGTERM (a scheduler deep in a CUDA call does not act on it) and exits only when the
server tells it to, on the server's own clean stop. With SGLANG_DEMO_SCHEDULER_OWN_GROUP=1 it moves to a
process group of its own, as a launcher's child may, so signalling the server's group misses it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


class Scheduler:
    def __init__(self, pid: int, stop_fd: int) -> None:
        self.pid = pid
        self._stop_fd = stop_fd

    def stop(self) -> None:
        """The server's clean stop: tell the child, and reap it."""
        with contextlib.suppress(OSError):
            os.write(self._stop_fd, b"stop")
            os.close(self._stop_fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def fork_scheduler(mode: str, own_group: bool) -> Scheduler:
    """Fork before any thread starts: the child holds every socket the server has bound so far."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(read_fd)
        return Scheduler(pid, write_fd)
    os.close(write_fd)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if own_group:
        os.setpgid(0, 0)
    print(f"[{mode}] scheduler pid {os.getpid()} (child of {os.getppid()})", file=sys.stderr, flush=True)
    told = b""
    while True:
        chunk = os.read(read_fd, 16)
        if not chunk:
            break
        told += chunk
    # Told to stop: the server is stopping cleanly. The pipe closed untold: the server was killed, and this
    # child lives on as an orphan, holding what it holds, until someone kills it.
    while told != b"stop":
        signal.pause()
    os._exit(0)
