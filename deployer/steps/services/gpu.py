"""What a service's GPUs hold, as nvidia-smi on the target reads it: between a stop and a start, the new
server must find its GPUs released, or it dies of out-of-memory while loading.

Free memory is what counts, not the process list: nvidia-smi can list no process while the memory of a
killed server is still being freed (llm-d-fast-model-actuation#720). Both are read; the wait ends when no
process of the old tree is listed and every GPU's used memory is low enough.
"""

from __future__ import annotations

from dataclasses import dataclass

QUERY_GPUS = ("nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits")
QUERY_APPS = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
# An idle GPU reads 0 MiB used (the recorded H100, H200 and L40S readings in tests/data/nvidia_smi); the CUDA
# context of a process that is still exiting, or a monitoring agent, may hold a little.
IDLE_MARGIN_MIB = 1024


@dataclass(frozen=True)
class GpuMemory:
    index: int
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class GpuApp:
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


def parse_apps(out: str) -> list[GpuApp]:
    """`nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`."""
    return [GpuApp(_number(pid, "compute app", "a pid"),
                   None if used.startswith("[") else _number(used, f"pid {pid} memory"))
            for pid, used in _rows(out, 2, "nvidia-smi --query-compute-apps")]


@dataclass(frozen=True)
class GpuVerdict:
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
