"""co_restart waits for a service's GPUs between the stops and its start, over real processes, local and ssh.

These machines have no GPU: a stand-in `nvidia-smi` (tests/data/nvidia_smi/nvidia-smi) placed first on the
target's PATH, through the host's `env: PATH:`, replays real recorded readings (tests/data/nvidia_smi/README.md)
in sequence. It replaces only the hardware; deployer's code path (the actions, the poll, the parsing, the
judge, the failure) is the one a real GPU host runs.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from fixtures_repo import Project, work_tree
from fixtures_services import Stack, alive, wait_dead

READINGS = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
H200 = READINGS / "linux-x86_64__nvidia-h200__590.48.01"
LOAD, IDLE = f"{H200}__load", f"{H200}__idle"
LOADED = "GPU 0: 32362 of 143771 MiB used (needs <= 1024 used)"


def stand_in(project: Project, *readings: str | Path) -> Path:
    """The stand-in nvidia-smi in a directory first on the target's PATH, replaying `readings` in order."""
    gpu_bin = project.root / "gpu-bin"
    gpu_bin.mkdir()
    shutil.copy(READINGS / "nvidia-smi", gpu_bin / "nvidia-smi")
    (gpu_bin / "sequence").write_text("".join(f"{reading}\n" for reading in readings))
    project.host["env"] = {"PATH": f"{gpu_bin}:{os.environ['PATH']}"}
    return gpu_bin


def running(stack: Stack, **prefill: Any) -> dict[str, int]:
    """Both services started by a first restart (no GPUs yet), then the inventory's prefill given `prefill`:
    the old servers' pids."""
    stack.start_services()
    stack.configure(prefill=stack.service("prefill", **prefill), decode=stack.service("decode"))
    return stack.pids()


def index(evs: list[dict[str, Any]], **match: Any) -> int:
    return next(i for i, e in enumerate(evs) if all(e.get(k) == v for k, v in match.items()))


def test_a_service_with_gpus_starts_only_after_nvidia_smi_reads_them_released(stack: Stack) -> None:
    project = stack.project
    gpu_bin = stand_in(project, LOAD, LOAD, IDLE)
    old = running(stack, gpus=[0], gpu_wait_s=30)
    planned = project.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert planned.returncode == 0, planned.stderr
    [restart] = [s for s in json.loads(planned.stdout)["steps"] if s["name"] == "co_restart"]
    keys = [a["key"] for a in restart["actions"]]
    assert keys.index("decode.free") < keys.index("prefill.gpu_memory") < keys.index("prefill.launch")
    shown = {a["key"]: a for a in restart["actions"]}
    assert shown["prefill.gpu_memory"]["repeats"] and shown["prefill.gpu_memory"]["argv"] == [
        "nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
    assert shown["prefill.gpu_apps"]["argv"][1] == "--query-compute-apps=pid,used_memory"
    assert "decode.gpu_memory" not in shown  # decode declares no GPUs

    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    new = stack.pids()
    assert new["prefill"] != old["prefill"] and new["decode"] != old["decode"]
    evs = project.events()
    waits = [e for e in evs if e["type"] == "service_phase" and e["phase"] == "waiting_gpu"]
    assert [(e["service"], e["detail"], e["budget_s"]) for e in waits] == [
        ("prefill", LOADED, 30), ("prefill", "GPU 0: 0 of 143771 MiB used", 30)]
    # The run log's order: both stops, the wait (recorded when it ends: three rounds, load, load, idle), and only
    # then the launch; the idle reading was read before it.
    polled = index(evs, action="prefill.gpu_memory")
    assert evs[polled]["count"] == 3 and evs[polled]["outcomes"] == [["exit 0", 3]]
    assert index(evs, action="prefill.gpu_apps") < index(evs, action="prefill.launch")
    waited = index(evs, type="service_phase", phase="waiting_gpu")
    assert index(evs, type="service_stopped", service="prefill") < waited < polled
    assert polled < index(evs, action="prefill.launch") < index(evs, type="service_started", service="prefill")
    assert (gpu_bin / "query-gpu.count").read_text() == "3\n"
    assert (gpu_bin / "query-compute-apps.count").read_text() == "3\n"


def test_gpus_still_held_fail_the_restart_after_gpu_wait_s_naming_what_holds_them_and_start_nothing(
        stack: Stack) -> None:
    project = stack.project
    held = project.root / "held"  # the recorded H200 under load, its largest process renumbered as the old prefill
    gpu_bin = stand_in(project, held)
    old = running(stack, gpus=[0], gpu_wait_s=1.5)
    shutil.copy(f"{LOAD}.query-gpu.csv", f"{held}.query-gpu.csv")
    apps = Path(f"{LOAD}.query-compute-apps.csv").read_text()
    Path(f"{held}.query-compute-apps.csv").write_text(apps.replace("10309,", f"{old['prefill']},"))
    started = time.monotonic()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - started < 30
    assert (f"step 'co_restart' failed: service prefill was not started: GPU 0 not released within 1.5s: {LOADED}; "
            f"the old server still holds GPU memory: pid {old['prefill']} (28234 MiB); nvidia-smi lists pid 10291 "
            f"(2566 MiB), pid 10293 (1542 MiB), pid {old['prefill']} (28234 MiB); not started (stopped by this "
            "restart): prefill, decode") in result.stderr
    assert wait_dead(old["prefill"]) and wait_dead(old["decode"])
    evs = project.events()
    assert not [e for e in evs if e["type"] == "service_started" or e.get("action") == "prefill.launch"]
    assert [e["detail"] for e in evs if e["type"] == "service_phase"][-1].endswith("(28234 MiB)")
    assert int((gpu_bin / "query-gpu.count").read_text()) >= 2


def test_a_reading_that_is_not_one_fails_the_wait_with_its_line_escaped(stack: Stack) -> None:
    project = stack.project
    odd = project.root / "odd"
    stand_in(project, odd)
    Path(f"{odd}.query-gpu.csv").write_text("0, \x1b[2J, 81559\n")  # the listing's first column is still "0"
    Path(f"{odd}.query-compute-apps.csv").write_text("")
    running(stack, gpus=[0], gpu_wait_s=30)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("service prefill was not started: nvidia-smi's reading is not one: GPU 0 memory.used: '\\x1b[2J' is not "
            "a number of MiB; not started (stopped by this restart): prefill, decode") in result.stderr
    assert "\x1b" not in result.stderr


def test_a_service_with_gpus_on_a_host_without_nvidia_smi_is_refused_before_anything_changes(stack: Stack) -> None:
    project = stack.project
    old = running(stack)
    no_gpu = project.root / "no-gpu-bin"  # a PATH without nvidia-smi, as on a host with no NVIDIA driver
    no_gpu.mkdir()
    project.host["env"] = {"PATH": str(no_gpu)}
    stack.configure(prefill=stack.service("prefill", gpus=[0]), decode=stack.service("decode"))
    project.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42"}}, "co_restart"])
    head, before = project.head(), work_tree(project.repo)
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "preflight" in result.stderr
    assert ("co_restart: service prefill has gpus: [0], but nvidia-smi --query-gpu=index --format=csv,noheader,"
            "nounits failed (exit 127)") in result.stderr
    assert "nothing on the target was changed" in result.stderr
    assert (project.head(), work_tree(project.repo)) == (head, before)
    assert stack.pids() == old and all(alive(pid) for pid in old.values())
    assert not [e for e in project.events() if e["type"] in ("uploaded", "service_stopped")]

    checked = project.deployer("check", "--host", "box", "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    rows = {c["name"]: c for c in json.loads(checked.stdout)["checks"]}
    assert rows["gpus prefill"]["status"] == "fail" and "cannot run nvidia-smi" in rows["gpus prefill"]["detail"]
    assert "gpus decode" not in rows


def test_check_names_a_gpu_the_target_does_not_have_and_passes_the_ones_it_has(stack: Stack) -> None:
    project = stack.project
    stand_in(project, IDLE)
    running(stack, gpus=[0, 3])
    checked = project.deployer("check", "--host", "box", "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    rows = {c["name"]: c for c in json.loads(checked.stdout)["checks"]}
    assert rows["gpus prefill"] == {**rows["gpus prefill"], "status": "fail",
                                    "detail": "service prefill: the target has no GPU 3 (nvidia-smi lists: 0)"}
    stack.configure(prefill=stack.service("prefill", gpus=[0]), decode=stack.service("decode"))
    fine = {c["name"]: c for c in json.loads(project.deployer("check", "--host", "box", "--json").stdout)["checks"]}
    assert (fine["gpus prefill"]["status"], fine["gpus prefill"]["detail"]) == ("ok", "nvidia-smi lists GPU 0")


def test_a_gpu_wait_that_times_out_says_the_service_was_not_started_and_why_never_an_earlier_runs_crash(
        stack: Stack) -> None:
    # The GPU is the suite's one stand-in (the replayed nvidia-smi readings, see the module's docstring): the
    # processes, the log and the wait are real.
    project = stack.project
    stand_in(project, LOAD)
    old = running(stack, gpus=[0], gpu_wait_s=1.5)
    log = project.repo / ".git" / "deployer" / "prefill.log"
    with log.open("a") as earlier:  # what an earlier run's start left at the end of the service's log
        earlier.write("Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"service prefill was not started: GPU 0 not released within 1.5s: {LOADED}; nvidia-smi lists pid "
            "10291 (2566 MiB), pid 10293 (1542 MiB), pid 10309 (28234 MiB); not started (stopped by this restart): "
            "prefill, decode") in result.stderr
    assert "OutOfMemoryError" not in result.stderr and "(tail)" not in result.stderr
    assert wait_dead(old["prefill"])
