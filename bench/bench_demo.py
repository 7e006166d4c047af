"""`deployer demo` wall time, against the 60 s target for a 2-core machine."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

RUNS = 3
TARGET_S = 60.0


def main() -> None:
    times = []
    for _ in range(RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "deployer", "demo", "--workdir", f"{tmp}/demo", "--json"],
                                  capture_output=True, text=True, timeout=300)
            times.append(time.perf_counter() - started)
            if done.returncode != 0:
                print(done.stdout, done.stderr, file=sys.stderr)
                raise SystemExit(f"demo failed with exit {done.returncode}")
    median = statistics.median(times)
    print(f"{'deployer demo':<16} median {median:6.1f}s  (runs: {', '.join(f'{t:.1f}' for t in times)})")
    print(f"{'target':<16}        {TARGET_S:6.1f}s  ratio median/target = {median / TARGET_S:.2f}")


if __name__ == "__main__":
    main()
