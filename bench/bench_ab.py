"""Two checkouts' `deployer apply`, alternating run by run, on one sshd, relay and scratch target.

    python bench/bench_ab.py OTHER_TREE [--runs 15] [--rtt-ms 0,50]

bench_rtt.py's table is one column after the other, minutes apart, and on a shared machine the machine's speed
moves more between them than a change does. Here each run of this tree is next to one of OTHER_TREE (the order
swapped every pair), so what the machine does to one it does to the other: the ratio of the medians is the change.
It prints, per RTT, each tree's median wall time and time to the first byte, and this tree's / OTHER_TREE's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench"), str(ROOT)]

from fixtures_ssh import running_sshd  # noqa: E402
from rtt_relay import LatencyRelay  # noqa: E402
from scratch_target import ScratchTarget, byte_compiled, make_scratch  # noqa: E402

TIMEOUT_S = 300


def one_apply(target: ScratchTarget, relay: LatencyRelay, tree: Path) -> tuple[float, float]:
    """Wall time and time to the first byte of one apply with tree's deployer; the fix must land."""
    target.reset()
    relay.reset_counts()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", target.host_name],
                          cwd=target.root, env=target.deployer_env(str(tree)), stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=TIMEOUT_S)
    wall = time.monotonic() - started
    if done.returncode != 0 or not target.deployed():
        raise SystemExit(f"{tree}: apply failed with exit {done.returncode}:\n{done.stderr.decode(errors='replace')}")
    first = relay.first_byte_at
    return wall, (first - started) if first is not None else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="the checkout to compare this one with")
    parser.add_argument("--runs", type=int, default=15, help="applies per tree and RTT")
    parser.add_argument("--rtt-ms", default="0,50", help="comma-separated RTTs the relay adds")
    args = parser.parse_args()
    trees = (args.other.resolve(), ROOT)
    for tree in trees:
        byte_compiled(tree)
    with tempfile.TemporaryDirectory() as tmp, running_sshd() as sshd:
        relay = LatencyRelay(sshd.port)
        try:
            target = make_scratch(Path(tmp) / "t", port=relay.port, user=sshd.user, identity_file=sshd.client_key,
                                  host_pubkey_line=sshd.host_pubkey_line)
            print(f"{args.runs} runs per tree and RTT, alternating; this tree {ROOT}, other {trees[0]}")
            for rtt_ms in (int(r) for r in args.rtt_ms.split(",")):
                relay.rtt_s = rtt_ms / 1000
                walls: dict[Path, list[float]] = {tree: [] for tree in trees}
                firsts: dict[Path, list[float]] = {tree: [] for tree in trees}
                for i in range(args.runs):
                    for tree in trees if i % 2 == 0 else trees[::-1]:
                        wall, first = one_apply(target, relay, tree)
                        walls[tree].append(wall)
                        firsts[tree].append(first)
                other, this = (statistics.median(walls[tree]) for tree in trees)
                other_fb, this_fb = (statistics.median(firsts[tree]) * 1000 for tree in trees)
                print(f"{rtt_ms:4d} ms  other {other:.3f} s (first byte {other_fb:.0f} ms)   this {this:.3f} s "
                      f"(first byte {this_fb:.0f} ms)   this / other {this / other:.3f}", flush=True)
        finally:
            relay.close()


if __name__ == "__main__":
    main()
