"""What a far target costs: `deployer apply` vs the same chain by hand vs the floor, at added RTTs.

A real sshd on 127.0.0.1 sits behind a relay that adds a round-trip time (bench/rtt_relay.py).
The sequence is "2 files: local compile, upload, remote compile, diff bounds, commit" on a
scratch repo (bench/scratch_target.py), shipped three ways:

  deployer   `python -m deployer apply` of that playbook (this tree, via PYTHONPATH)
  by hand    py_compile here && scp both files && ssh '... py_compile && git diff --numstat && git commit'
  floor      py_compile here, then ONE connection and ONE exec: the files as a tar on stdin
  agent      bench/agent_sketch.py: one paramiko connection, the agent on one exec, 4 batches
             (preflight, upload+compile+numstat, commit, release): what the agent alone costs

Each cell is the median wall time of --runs runs and the round trips the relay counted in
them. Every run is checked: the fix must be committed on top of the first commit.

    python bench/bench_rtt.py [--rtt-ms 0,10,50] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench"), str(ROOT)]

from fixtures_ssh import SSHD, running_sshd  # noqa: E402
from rtt_relay import LatencyRelay  # noqa: E402
from scratch_target import (  # noqa: E402
    FIXED,
    MESSAGE,
    ScratchTarget,
    byte_compiled,
    fix_tar,
    floor_line,
    make_scratch,
    remote_chain,
)
from scratch_target import ssh_options as scratch_ssh_options  # noqa: E402

TIMEOUT_S = 300
HELP_RUNS = 7


@dataclass
class Cell:
    seconds: list[float] = field(default_factory=list)
    round_trips: list[int] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def trips(self) -> int:
        return int(statistics.median(self.round_trips))


def ssh_options(sshd: SSHD, target: ScratchTarget) -> list[str]:
    return scratch_ssh_options(sshd.client_key, target.known_hosts)


def check(done: subprocess.CompletedProcess[bytes], what: str) -> None:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed with exit {done.returncode}:\n"
                         f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}")


def run(argv: list[str], what: str, **kwargs: object) -> None:
    check(subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, **kwargs), what)  # type: ignore[call-overload]


def by_deployer(sshd: SSHD, target: ScratchTarget, port: int) -> None:
    run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", target.host_name],
        "deployer apply", cwd=target.root, env=target.deployer_env(str(ROOT)), stdin=subprocess.DEVNULL)


def by_hand(sshd: SSHD, target: ScratchTarget, port: int) -> None:
    where = f"{sshd.user}@127.0.0.1"
    local = [str(target.fix_dir / Path(rel).name) for rel in FIXED]
    run([sys.executable, "-m", "py_compile", *local], "py_compile here")
    run(["scp", "-q", "-P", str(port), *ssh_options(sshd, target), *local, f"{where}:{target.repo}/pkg/"], "scp")
    run(["ssh", "-p", str(port), *ssh_options(sshd, target), where, remote_chain(target.repo)], "ssh chain")


def floor(sshd: SSHD, target: ScratchTarget, port: int) -> None:
    local = [str(target.fix_dir / Path(rel).name) for rel in FIXED]
    run([sys.executable, "-m", "py_compile", *local], "py_compile here")
    run(["ssh", "-p", str(port), *ssh_options(sshd, target), f"{sshd.user}@127.0.0.1", floor_line(target.repo)],
        "floor", input=fix_tar(target.fix_dir))


def agent_sketch(sshd: SSHD, target: ScratchTarget, port: int) -> None:
    run([sys.executable, str(ROOT / "bench" / "agent_sketch.py"), str(port), sshd.user, sshd.client_key,
         str(target.known_hosts), str(target.repo), str(target.fix_dir), MESSAGE, *FIXED],
        "agent sketch", env={**os.environ, "PYTHONPATH": str(ROOT)})


WAYS: dict[str, Callable[[SSHD, ScratchTarget, int], None]] = {
    "deployer apply": by_deployer,
    "by hand: py_compile && scp && ssh": by_hand,
    "floor: 1 connection, 1 exec, tar": floor,
    "agent sketch: 1 exec, 4 batches": agent_sketch,
}


def measure(sshd: SSHD, target: ScratchTarget, relay: LatencyRelay, rtts_ms: list[int],
            runs: int) -> dict[tuple[str, int], Cell]:
    cells: dict[tuple[str, int], Cell] = {}
    for rtt_ms in rtts_ms:
        relay.rtt_s = rtt_ms / 1000
        # Interleaved, so a noisy minute on the shared machine hits every way alike.
        for _ in range(runs):
            for name, way in WAYS.items():
                target.reset()
                relay.reset_counts()
                started = time.perf_counter()
                way(sshd, target, relay.port)
                elapsed = time.perf_counter() - started
                if not target.deployed():
                    raise SystemExit(f"{name} at {rtt_ms} ms reported success but the fix is not committed")
                cell = cells.setdefault((name, rtt_ms), Cell())
                cell.seconds.append(elapsed)
                cell.round_trips.append(relay.round_trips)
    return cells


def cold_start(*args: str) -> float:
    """Median wall time of a fresh `python *args` (no site-packages surprises from the caller's env)."""
    times = []
    for _ in range(HELP_RUNS):
        started = time.perf_counter()
        run([sys.executable, *args], " ".join(args), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def render(cells: dict[tuple[str, int], Cell], rtts_ms: list[int], runs: int) -> str:
    width = max(map(len, WAYS)) + 2
    head = f"{'':<{width}}" + "".join(f"{f'{rtt} ms':>20}" for rtt in rtts_ms)
    lines = [f"median of {runs} runs; each cell: seconds / round trips the relay counted", head]
    for name in WAYS:
        row = "".join(f"{f'{cells[name, rtt].median:.2f} s / {cells[name, rtt].trips} rt':>20}" for rtt in rtts_ms)
        lines.append(f"{name:<{width}}{row}")
    deployer, hand, low, sketch = WAYS
    for label, mine, other in (("deployer / hand", deployer, hand), ("deployer / floor", deployer, low),
                               ("agent sketch / hand", sketch, hand), ("agent sketch / floor", sketch, low)):
        row = "".join(f"{cells[mine, rtt].median / cells[other, rtt].median:>19.2f}x" for rtt in rtts_ms)
        lines.append(f"{label:<{width}}{row}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtt-ms", default="0,10,50", help="comma-separated added round-trip times")
    parser.add_argument("--runs", type=int, default=5, help="runs per cell (the median is shown)")
    args = parser.parse_args()
    rtts_ms = [int(v) for v in args.rtt_ms.split(",")]
    if not 1 <= args.runs <= 20:
        raise SystemExit("--runs must be within 1..20")
    byte_compiled(ROOT)
    with running_sshd() as sshd, tempfile.TemporaryDirectory(prefix="bench-rtt-") as tmp:
        relay = LatencyRelay(sshd.port)
        try:
            target = make_scratch(Path(tmp), port=relay.port, user=sshd.user, identity_file=sshd.client_key,
                                  host_pubkey_line=sshd.host_pubkey_line)
            cells = measure(sshd, target, relay, rtts_ms, args.runs)
        finally:
            relay.close()
    print(render(cells, rtts_ms, args.runs))
    # The bare interpreter's start-up alongside: on a loaded machine both grow together.
    print(f"\n`deployer --help`, cold process: median {cold_start('-m', 'deployer', '--help'):.3f} s "
          f"of {HELP_RUNS} (target < 0.2 s); `python -c pass`: {cold_start('-c', 'pass'):.3f} s")


if __name__ == "__main__":
    main()
