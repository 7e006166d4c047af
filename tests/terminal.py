"""`python -m deployer` on a real pseudo-terminal, and what a terminal emulator (pyte) showed: every frame as the
live view redrew it, and the screen once deployer ended (with the lines scrolled off its top)."""

from __future__ import annotations

import fcntl
import os
import re
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
    # The visible screen each time the program was about to erase some of what it drew (a redraw begins so), and
    # after each read of its output: every frame the live view drew, however the reads cut its output.
    frames: list[list[str]] = field(default_factory=list)

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
    drawn = False  # text was written since the last frame was kept
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
            for piece in ERASE.split(chunk):
                if not ERASE.fullmatch(piece):
                    drawn = drawn or bool(INVISIBLE.sub(b"", piece))
                elif drawn:  # about to wipe what it drew: that frame first (however the reads cut the output)
                    frames.append(trimmed(screen.display))
                    drawn = False
                stream.feed(piece)
            if drawn:
                frames.append(trimmed(screen.display))
                drawn = False
    finally:
        os.close(master)
        code = process.wait(timeout=30)
    scrolled = ["".join(line[x].data for x in range(columns)) for line in screen.history.top]
    return Shown(code, trimmed([*scrolled, *screen.display]), frames)


# Erase in line or in display: a redraw wipes the frame before it with these. An erase cut in two by a read is
# not matched, but pyte applies no half-read sequence, so the frame kept at the end of that read still shows it.
ERASE = re.compile(rb"(\x1b\[[0-2]?[JK])")
# What draws nothing: escape sequences (cursor moves, colours, erases) and control characters.
INVISIBLE = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x1f\x7f]")


def trimmed(rows: list[str]) -> list[str]:
    rows = [row.rstrip() for row in rows]
    while rows and not rows[-1]:
        rows.pop()
    return rows

