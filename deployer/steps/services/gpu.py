"""What a service's GPUs hold, as nvidia-smi on the target reads it: between a stop and a start, the new
server must find its GPUs released, or it dies of out-of-memory while loading.

Free memory is what counts, not the process list: nvidia-smi can list no process while the memory of a
killed server is still being freed (llm-d-fast-model-actuation#720). Both are read; the wait ends when no
process of the old tree is listed and every GPU's used memory is low enough.

GpuWait is that wait as co_restart does it, between the stops and the service's start: both readings in one
round trip a round (the actions its plan shows), and the read preflight and `deployer check` make first
(nvidia-smi runs and lists the GPUs), so a host that cannot answer is refused before anything changes.
nvidia-smi runs with the host's `env:` (its PATH finds it), as a service's start does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from deployer.agent.protocol import ExecResult
from deployer.command import shell_line
from deployer.config.models import resolve_env
from deployer.steps.action import Action
from deployer.steps.context import NOTHING
from deployer.steps.services.manager import PROBE_TIMEOUT_S, Manager, Phase
from deployer.text import shown

LIST_GPUS = ("nvidia-smi", "--query-gpu=index", "--format=csv,noheader,nounits")
QUERY_GPUS = ("nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits")
QUERY_APPS = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
# An idle GPU reads 0 MiB used (the recorded H100, H200 and L40S readings in tests/data/nvidia_smi); the CUDA
# context of a process that is still exiting, or a monitoring agent, may hold a little.
IDLE_MARGIN_MIB = 1024
POLL_S = 0.5
SHOW_EVERY_S = 10.0  # a wait that sees no change still says so this often


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's used and total memory, as nvidia-smi reads it."""
    index: int
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class GpuApp:
    """One process holding GPU memory, as nvidia-smi lists it."""
    pid: int
    used_mib: int | None  # None: nvidia-smi does not say ([N/A]: under MIG, or not ours to see)


def _rows(out: str, columns: int, what: str) -> list[list[str]]:
    rows = []
    for number, line in enumerate(out.splitlines(), 1):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != columns:
            raise ValueError(f"{what}, line {number}: {columns} values expected, got {line.strip()!r}")
        rows.append(cells)
    return rows


def _number(cell: str, what: str, of: str = "a number of MiB") -> int:
    if not cell.isdigit():
        raise ValueError(f"{what}: {cell!r} is not {of}")
    return int(cell)


def parse_gpus(out: str) -> dict[int, GpuMemory]:
    """`nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits`, by index."""
    gpus = {}
    for index, used, total in _rows(out, 3, "nvidia-smi --query-gpu"):
        gpu = GpuMemory(_number(index, "GPU index", "an index"), _number(used, f"GPU {index} memory.used"),
                        _number(total, f"GPU {index} memory.total"))
        gpus[gpu.index] = gpu
    return gpus


def parse_indices(out: str) -> list[int]:
    """`nvidia-smi --query-gpu=index --format=csv,noheader,nounits`: the GPUs the target has."""
    return [_number(index, "GPU index", "an index") for index, in _rows(out, 1, "nvidia-smi --query-gpu=index")]


def parse_apps(out: str) -> list[GpuApp]:
    """`nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`."""
    return [GpuApp(_number(pid, "compute app", "a pid"),
                   None if used.startswith("[") else _number(used, f"pid {pid} memory"))
            for pid, used in _rows(out, 2, "nvidia-smi --query-compute-apps")]


@dataclass(frozen=True)
class GpuVerdict:
    """Whether a stopped service's GPU memory was released, and what was seen."""
    released: bool
    detail: str  # what each GPU holds, for the live view and for the failure after the wait's budget


def judge(gpus: dict[int, GpuMemory], apps: list[GpuApp], wanted: list[int], old_tree: set[int],
          free_mib: int | None) -> GpuVerdict:
    """Are the wanted GPUs released: no process of the old tree listed, and each GPU with at least free_mib
    free (None: used within IDLE_MARGIN_MIB of an idle GPU's 0)?"""
    missing = [index for index in wanted if index not in gpus]
    if missing:
        have = ", ".join(map(str, sorted(gpus))) or "none"
        return GpuVerdict(False, f"no GPU {', '.join(map(str, missing))} on the target (it has: {have})")
    holders = [app for app in apps if app.pid in old_tree]
    parts, released = [], not holders
    for index in wanted:
        gpu = gpus[index]
        enough = (gpu.total_mib - gpu.used_mib >= free_mib) if free_mib is not None else (
            gpu.used_mib <= IDLE_MARGIN_MIB)
        released = released and enough
        need = f"needs {free_mib} free" if free_mib is not None else f"needs <= {IDLE_MARGIN_MIB} used"
        parts.append(f"GPU {index}: {gpu.used_mib} of {gpu.total_mib} MiB used" + ("" if enough else f" ({need})"))
    if holders:
        parts.append("the old server still holds GPU memory: " + ", ".join(
            f"pid {app.pid}" + ("" if app.used_mib is None else f" ({app.used_mib} MiB)") for app in holders))
    return GpuVerdict(released, "; ".join(parts))


def listed_apps(apps: list[GpuApp]) -> str:
    """Every process nvidia-smi lists, the old server's or not: what else may hold the memory."""
    held = ", ".join(f"pid {app.pid}" + ("" if app.used_mib is None else f" ({app.used_mib} MiB)") for app in apps)
    return f"nvidia-smi lists {held}" if held else "nvidia-smi lists no process"


def gpu_list(gpus: list[int]) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, gpus))


def _failed(result: Any, action: Action) -> str | None:
    """What makes a command's result no reading at all (it did not run, or exited non-zero); None: it is one."""
    if isinstance(result, ExecResult) and result.ok:
        return None
    if not isinstance(result, ExecResult):
        return f"{shell_line(action.argv)}: no result"
    how = "timed out" if result.timed_out else f"exit {result.exit_code}"
    said = (result.err_stream.text or result.out_stream.text).strip()
    return f"{shell_line(action.argv)} failed ({how}): {shown(said)}"


class GpuWait:
    """A service's GPUs around its start: the read that refuses a host without nvidia-smi, and the wait."""

    def __init__(self, m: Manager) -> None:
        self.m = m
        env = tuple(resolve_env(m.ctx.host.env).items())
        which = gpu_list(m.service.gpus)
        self.listing = Action.run(f"{m.name}.gpus", f"nvidia-smi runs and lists {which}", LIST_GPUS, env=env)
        self.memory = Action.run(f"{m.name}.gpu_memory", f"wait up to {m.service.gpu_wait_s:g}s for {which} "
                                 "to be released: their memory", QUERY_GPUS, env=env, repeats=True)
        self.apps = Action.run(f"{m.name}.gpu_apps", "and the processes that hold them", QUERY_APPS, env=env,
                               repeats=True)

    def actions(self) -> list[Action]:
        return [self.memory, self.apps]

    def problem(self) -> str | None:
        """Why this host cannot wait for the service's GPUs (no nvidia-smi, no such GPU); None: it can."""
        result = self.m.ctx.act(self.listing, timeout=PROBE_TIMEOUT_S)
        if (failed := _failed(result, self.listing)) is not None:
            return (f"service {self.m.name} has gpus: {self.m.service.gpus}, but {failed} (no NVIDIA driver here, or "
                    "nvidia-smi is not on the PATH the host's `env:` gives)")
        try:
            have = parse_indices(result.out)
        except ValueError as exc:
            return f"service {self.m.name}: nvidia-smi's answer is not a GPU list: {exc}"
        missing = [index for index in self.m.service.gpus if index not in have]
        if missing:
            return (f"service {self.m.name}: the target has no {gpu_list(missing)} "
                    f"(nvidia-smi lists: {', '.join(map(str, have)) or 'none'})")
        return None

    def judged_there(self) -> dict[str, Any]:
        """problem() as the premise of a chain sent whole checks it there (agent.protocol.Ready.gpus)."""
        return {"service": self.m.name, "argv": list(self.listing.argv), "env": dict(self.listing.env),
                "timeout": PROBE_TIMEOUT_S, "want": list(self.m.service.gpus)}

    def wait(self, old_tree: set[int]) -> str | None:
        """Poll until judge() says the GPUs are released (None), or why not: the budget spent (with what holds
        them) or a reading that is none. A `waiting_gpu` phase on each change of what they hold, and every
        SHOW_EVERY_S while nothing changes."""
        service, ctx = self.m.service, self.m.ctx
        started = time.monotonic()
        shown_detail, shown_at = "", started
        with ctx.poll(PROBE_TIMEOUT_S) as poll:
            while True:
                gpus, apps = poll.round([(self.memory, NOTHING), (self.apps, NOTHING)])
                failed = _failed(gpus, self.memory) or _failed(apps, self.apps)
                if failed is not None:
                    return failed
                try:
                    verdict = judge(parse_gpus(gpus.out), parse_apps(apps.out), service.gpus, old_tree,
                                    service.gpu_free_mib)
                except ValueError as exc:
                    return f"nvidia-smi's reading is not one: {exc}"
                now = time.monotonic()
                if verdict.detail != shown_detail or now - shown_at >= SHOW_EVERY_S:
                    self.m.phase(Phase.waiting_gpu, started, service.gpu_wait_s, detail=verdict.detail)
                    shown_detail, shown_at = verdict.detail, now
                if verdict.released:
                    return None
                if now - started >= service.gpu_wait_s:
                    return (f"{gpu_list(service.gpus)} not released within {service.gpu_wait_s:g}s: "
                            f"{verdict.detail}; {listed_apps(parse_apps(apps.out))}")
                ctx.cancel.wait(POLL_S)
