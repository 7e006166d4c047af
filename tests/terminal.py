"""`python -m deployer` on a real pseudo-terminal, and what a terminal emulator (pyte) showed: every frame as the
live view redrew it, and the screen once deployer ended (with the lines scrolled off its top)."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyte


@dataclass
class Shown:
    exit_code: int
    screen: list[str]  # the final screen, after the lines scrolled off its top; right-trimmed, no empty tail
    frames: list[list[str]] = field(default_factory=list)  # the visible screen after each read of the output

    def seen(self, line: str) -> bool:
        """Whether some frame or the final screen had this line (right-trimmed)."""
        return any(line in frame for frame in [*self.frames, self.screen])


def on_a_terminal(args: list[str], cwd: Path, env: dict[str, str], *, columns: int = 100, lines: int = 60,
                  timeout: float = 120) -> Shown:
    """deployer run to its end with stdin, stdout and stderr on one pty of columns x lines."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    screen = pyte.HistoryScreen(columns, lines, history=10000)
    stream = pyte.ByteStream(screen)
    shown = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "xterm-256color"}
    process = subprocess.Popen([sys.executable, "-m", "deployer", *args], cwd=cwd, env=shown, stdin=slave,
                               stdout=slave, stderr=slave, close_fds=True, start_new_session=True)
    os.close(slave)
    frames: list[list[str]] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                process.kill()
                raise TimeoutError(f"deployer {' '.join(args)} still running after {timeout}s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every end of the pty's other side is closed
                break
            if not chunk:
                break
            stream.feed(chunk)
            frames.append(trimmed(screen.display))
    finally:
        os.close(master)
        code = process.wait(timeout=30)
    scrolled = ["".join(line[x].data for x in range(columns)) for line in screen.history.top]
    return Shown(code, trimmed([*scrolled, *screen.display]), frames)


def trimmed(rows: list[str]) -> list[str]:
    rows = [row.rstrip() for row in rows]
    while rows and not rows[-1]:
        rows.pop()
    return rows

