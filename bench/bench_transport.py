"""Per-command and per-upload cost of each transport, and what one shared SSH connection saves.

The hand-made chain this tool replaces opens a new SSH connection per step; deployer keeps one
per run. This prints medians for: a local subprocess, a command on the shared connection, and a
command on a fresh connection each time (the handshake a per-step `ssh host cmd` pays).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fixtures_ssh import connect, running_sshd

from deployer.transport.local import LocalTransport

COMMANDS = 30
UPLOADS = 10
PAYLOAD = b"x" * (1 << 20)


def median_s(action: Callable[[], object], count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    local = LocalTransport()
    with running_sshd() as sshd, tempfile.TemporaryDirectory() as tmp:
        shared = connect(sshd)
        try:
            rows = {
                "command, local subprocess": median_s(lambda: local.run(["true"], timeout=30), COMMANDS),
                "command, shared SSH connection": median_s(lambda: shared.run(["true"], timeout=30), COMMANDS),
                "command, new SSH connection each": median_s(lambda: _fresh(sshd), COMMANDS // 3),
                "1 MiB upload, local": median_s(lambda: local.put(PAYLOAD, f"{tmp}/local.bin"), UPLOADS),
                "1 MiB upload, SSH (sftp + sha256 check)": median_s(lambda: shared.put(PAYLOAD, f"{tmp}/ssh.bin"),
                                                                    UPLOADS),
            }
        finally:
            shared.close()
    base = rows["command, shared SSH connection"]
    print(f"{'what':<42} {'median':>10} {'vs shared SSH command':>22}")
    for name, seconds in rows.items():
        print(f"{name:<42} {seconds * 1000:>8.1f}ms {seconds / base:>21.2f}x")


def _fresh(sshd: object) -> None:
    transport = connect(sshd)  # type: ignore[arg-type]
    try:
        transport.run(["true"], timeout=30)
    finally:
        transport.close()


if __name__ == "__main__":
    main()
