"""Reading a service's GPUs from nvidia-smi, on real recorded readings (tests/data/nvidia_smi/README.md says
where each was recorded, and with which driver): these machines have no GPU, so the readings stand in for one."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.steps.services.gpu import GpuApp, GpuMemory, judge, parse_apps, parse_gpus

READINGS = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
CAPTURES = {"h200": "linux-x86_64__nvidia-h200__590.48.01", "h100": "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01",
            "l40s": "linux-x86_64__nvidia-l40s__595.80"}


def reading(gpu: str, state: str) -> tuple[dict[int, GpuMemory], list[GpuApp]]:
    base = READINGS / f"{CAPTURES[gpu]}__{state}"
    return (parse_gpus(Path(f"{base}.query-gpu.csv").read_text()),
            parse_apps(Path(f"{base}.query-compute-apps.csv").read_text()))


def test_the_recorded_readings_parse_to_what_nvidia_smi_showed() -> None:
    gpus, apps = reading("h200", "load")
    assert gpus == {0: GpuMemory(0, 32362, 143771)}
    assert apps == [GpuApp(10291, 2566), GpuApp(10293, 1542), GpuApp(10309, 28234)]
    assert reading("h100", "idle") == ({0: GpuMemory(0, 0, 81559)}, [])
    assert reading("l40s", "load")[1] == [GpuApp(20037, 538), GpuApp(20038, 681)]


@pytest.mark.parametrize("gpu", sorted(CAPTURES))
def test_an_idle_gpu_is_released_and_a_loaded_one_is_not(gpu: str) -> None:
    idle = judge(*reading(gpu, "idle"), wanted=[0], old_tree=set(), free_mib=None)
    assert idle.released, idle.detail
    gpus, apps = reading(gpu, "load")
    held = judge(gpus, apps, wanted=[0], old_tree={apps[-1].pid}, free_mib=None)
    assert not held.released
    assert f"pid {apps[-1].pid} ({apps[-1].used_mib} MiB)" in held.detail


def test_the_old_trees_processes_keep_the_wait_going_even_with_memory_free() -> None:
    gpus, apps = reading("h200", "load")
    # 111409 MiB free: enough for the new server, but pid 10309 of the old tree still holds its share.
    verdict = judge(gpus, apps, wanted=[0], old_tree={10309}, free_mib=100_000)
    assert not verdict.released
    assert verdict.detail == ("GPU 0: 32362 of 143771 MiB used; "
                              "the old server still holds GPU memory: pid 10309 (28234 MiB)")
    others = judge(gpus, apps, wanted=[0], old_tree={4242}, free_mib=100_000)  # another tenant's processes
    assert others.released, others.detail
    assert not judge(gpus, apps, wanted=[0], old_tree=set(), free_mib=120_000).released


def test_memory_still_held_with_no_process_listed_is_waited_for() -> None:
    # A killed server's memory freed late: the process list is empty while the GPU still reads 32362 MiB used.
    gpus, _ = reading("h200", "load")
    verdict = judge(gpus, [], wanted=[0], old_tree=set(), free_mib=None)
    assert not verdict.released
    assert verdict.detail == "GPU 0: 32362 of 143771 MiB used (needs <= 1024 used)"


def test_a_gpu_the_target_does_not_have_is_named() -> None:
    gpus, apps = reading("h100", "idle")
    verdict = judge(gpus, apps, wanted=[0, 3], old_tree=set(), free_mib=None)
    assert not verdict.released and verdict.detail == "no GPU 3 on the target (it has: 0)"


def test_not_available_memory_is_unknown_not_zero() -> None:
    assert parse_apps("4242, [N/A]\n") == [GpuApp(4242, None)]
    assert "pid 4242;" in judge({0: GpuMemory(0, 0, 100)}, [GpuApp(4242, None)], [0], {4242}, None).detail + ";"


@pytest.mark.parametrize(("parse", "out", "message"), [
    (parse_gpus, "0, 12\n", "nvidia-smi --query-gpu, line 1: 3 values expected, got '0, 12'"),
    (parse_gpus, "0, [N/A], 81559\n", "GPU 0 memory.used: '[N/A]' is not a number of MiB"),
    (parse_apps, "\n1, 2, 3\n", "nvidia-smi --query-compute-apps, line 2: 2 values expected, got '1, 2, 3'"),
    (parse_apps, "No devices were found, 0\n", "compute app: 'No devices were found' is not a pid"),
])
def test_output_that_is_not_a_reading_is_refused_by_line(parse: object, out: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse(out)  # type: ignore[operator]
    assert str(refused.value) == message
