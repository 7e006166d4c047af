"""What a far target costs: `deployer apply` vs the same chain by hand vs the floor, at added RTTs.

A real sshd on 127.0.0.1 sits behind a relay that adds a round-trip time (bench/rtt_relay.py).
The sequence is "2 files: local compile, upload, remote compile, diff bounds, commit" on a
scratch repo (bench/scratch_target.py), shipped three ways:

  deployer   `python -m deployer apply` of that playbook (this tree, via PYTHONPATH)
  container  the same apply into a podman container on the far host (the host's root as an overlay, the
             repo bind-mounted at its own path): the agent is `podman exec -i` over the same sshd and relay,
             so the row beside the host's shows what the extra exec costs (skipped without podman)
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
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

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

from deployer.demo.containers import find_engine  # noqa: E402
from deployer.errors import ConnectError  # noqa: E402

TIMEOUT_S = 300
HELP_RUNS = 7
IN_CONTAINER = "in-container"  # the inventory's second host: the first's sshd, its agent in the container


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


def by_deployer_in_container(sshd: SSHD, target: ScratchTarget, port: int) -> None:
    run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", IN_CONTAINER],
        "deployer apply into the container", cwd=target.root, env=target.deployer_env(str(ROOT)),
        stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def container_host(target: ScratchTarget) -> Iterator[bool]:
    """A podman container holding target's repo at its own path (bind-mounted: reset() and deployed() see
    what the apply did), added to the inventory as IN_CONTAINER; False, and no container, without podman.
    Removed by name after."""
    try:
        engine = find_engine()
    except ConnectError as exc:
        print(f"no container row: {exc}", file=sys.stderr)
        yield False
        return
    name, repo = f"bench-rtt-{os.getpid()}", str(target.repo)
    try:
        engine.run("run", "-d", "--name", name, "--init", "--network", "none", "-v", f"{repo}:{repo}",
                   "--rootfs", "/:O", "sleep", "infinity", workdir=target.root)
        inventory = yaml.safe_load(target.inventory.read_text())
        inventory["hosts"][IN_CONTAINER] = {**inventory["hosts"][target.host_name], "container": {
            "engine": engine.name, "name": name, "engine_path": engine.command}}
        target.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        yield True
    finally:
        engine.run("rm", "-f", "-t", "0", name, workdir=target.root, check=False)


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


DEPLOYER, IN_BOX, HAND, FLOOR, SKETCH = ("deployer apply", "deployer apply, into a container",
                                         "by hand: py_compile && scp && ssh", "floor: 1 connection, 1 exec, tar",
                                         "agent sketch: 1 exec, 4 batches")
WAYS: dict[str, Callable[[SSHD, ScratchTarget, int], None]] = {
    DEPLOYER: by_deployer,
    IN_BOX: by_deployer_in_container,
    HAND: by_hand,
    FLOOR: floor,
    SKETCH: agent_sketch,
}


def measure(sshd: SSHD, target: ScratchTarget, relay: LatencyRelay, rtts_ms: list[int],
            runs: int, ways: list[str]) -> dict[tuple[str, int], Cell]:
    cells: dict[tuple[str, int], Cell] = {}
    for rtt_ms in rtts_ms:
        relay.rtt_s = rtt_ms / 1000
        # Interleaved, so a noisy minute on the shared machine hits every way alike.
        for _ in range(runs):
            for name in ways:
                way = WAYS[name]
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


def render(cells: dict[tuple[str, int], Cell], rtts_ms: list[int], runs: int, ways: list[str]) -> str:
    width = max(map(len, ways)) + 2
    head = f"{'':<{width}}" + "".join(f"{f'{rtt} ms':>20}" for rtt in rtts_ms)
    lines = [f"median of {runs} runs; each cell: seconds / round trips the relay counted", head]
    for name in ways:
        row = "".join(f"{f'{cells[name, rtt].median:.2f} s / {cells[name, rtt].trips} rt':>20}" for rtt in rtts_ms)
        lines.append(f"{name:<{width}}{row}")
    ratios = [("container / host apply", IN_BOX, DEPLOYER)] if IN_BOX in ways else []
    for label, mine, other in (*ratios, ("deployer / hand", DEPLOYER, HAND), ("deployer / floor", DEPLOYER, FLOOR),
                               ("agent sketch / hand", SKETCH, HAND), ("agent sketch / floor", SKETCH, FLOOR)):
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
            with container_host(target) as boxed:
                ways = [name for name in WAYS if boxed or name != IN_BOX]
                cells = measure(sshd, target, relay, rtts_ms, args.runs, ways)
        finally:
            relay.close()
    print(render(cells, rtts_ms, args.runs, ways))
    # The bare interpreter's start-up alongside: on a loaded machine both grow together.
    print(f"\n`deployer --help`, cold process: median {cold_start('-m', 'deployer', '--help'):.3f} s "
          f"of {HELP_RUNS} (target < 0.2 s); `python -c pass`: {cold_start('-c', 'pass'):.3f} s")


if __name__ == "__main__":
    main()
