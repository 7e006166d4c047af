"""`deployer demo --container`: the same story with prefill and decode each in a real podman container (the
container service manager restarts them), everything removed again; and no engine is exit 4 saying what to install."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from fixtures_containers import Box
from fixtures_repo import deployer, deployer_env
from test_demo import rollback_as_printed

from deployer.demo.containers import ContainerEngine, ContainerStack

GAUGE = "sglang:num_prefill_inflight_queue_reqs"


def kill_kept(workdir: Path) -> None:
    """What a kept demo left running on this machine (its router), found by working directory: a failed assertion
    before `demo --stop` left it running for good. By cwd, not by its pid files: a container's are of its own pid
    namespace."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(workdir):
                os.kill(int(entry.name), signal.SIGKILL)


def test_demo_container_shows_the_bug_fixes_it_by_restarting_the_containers_and_demo_stop_removes_them(
        tmp_path: Path, podman_env: dict[str, str]) -> None:
    workdir = tmp_path / "demo"
    names = [ContainerStack(workdir, engine=ContainerEngine("podman", "/x")).box(s).name for s in ("prefill", "decode")]
    boxes = [Box(name, podman_env) for name in names]
    try:
        result = deployer("demo", "--container", "--workdir", str(workdir), "--keep", "--json", cwd=tmp_path,
                          timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        summary = json.loads(result.stdout)
        assert summary["status"] == "successful"
        assert summary["facts"]["baseline"][GAUGE] >= 1, "the bug showed before the fix"
        assert summary["facts"]["drain"][GAUGE]["final"] == 0
        # The services were the containers: restarted by their engine, each its new main pid what inspect says.
        pids = summary["facts"]["pids"]
        for service, box in zip(("prefill", "decode"), boxes, strict=True):
            pid, status = box.podman("inspect", "--format", "{{.State.Pid}} {{.State.Status}}",
                                     box.name).stdout.split()
            assert status == "running" and pids[service]["new"] == int(pid) != pids[service]["old"], pids
        run_id = summary["run_id"]
        events = [json.loads(line) for line in (workdir / "runs" / run_id / "events.jsonl").read_text().splitlines()]
        commands = [e["command"] for e in events if e["type"] == "command"]
        assert any(f"stop -t 5 {names[0]}" in c for c in commands), commands
        assert any(c.endswith(f"start {names[1]}") for c in commands), commands
        stopped = deployer("demo", "--stop", "--workdir", str(workdir), cwd=tmp_path, timeout=120)
        assert stopped.returncode == 0 and f"{workdir}: stopped " in stopped.stdout, stopped.stdout + stopped.stderr
        for box in boxes:
            gone = box.podman("container", "exists", box.name, check=False)
            assert gone.returncode == 1, f"{box.name} is still there"
    finally:
        kill_kept(workdir)
        for box in boxes:
            box.remove()


def test_a_kept_container_demos_rollback_line_works_as_printed_and_demo_stop_then_removes_the_containers(
        tmp_path: Path, podman_env: dict[str, str]) -> None:
    workdir = tmp_path / "demo"
    boxes = [Box(ContainerStack(workdir, engine=ContainerEngine("podman", "/x")).box(s).name, podman_env)
             for s in ("prefill", "decode")]
    try:
        result = deployer("demo", "--container", "--workdir", str(workdir), "--keep", cwd=tmp_path, timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        rolled = rollback_as_printed(result.stdout, tmp_path)  # once exit 6 and a revert left with no container
        assert rolled.returncode == 0, rolled.args[-1] + "\n" + rolled.stdout + rolled.stderr
        assert "Deployer-Rollback-Of:" in subprocess.run(["git", "-C", str(workdir / "repo"), "log", "-1",
                                                          "--format=%B"], capture_output=True, text=True).stdout
        for box in boxes:
            running = box.podman("inspect", "--format", "{{.State.Status}}", box.name).stdout.strip()
            assert running == "running", f"{box.name}: {running}"
        stopped = deployer("demo", "--stop", "--workdir", str(workdir), cwd=tmp_path, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert all(box.podman("container", "exists", box.name, check=False).returncode == 1 for box in boxes)
    finally:
        kill_kept(workdir)
        for box in boxes:
            box.remove()


def test_demo_container_without_podman_is_exit_4_saying_what_to_install(tmp_path: Path) -> None:
    """Neither engine runs: none on PATH, or a `docker` that is Docker's own CLI (it cannot run a root dir)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\necho 'Docker version 27.3.1, build ce12230'\n")
    docker.chmod(0o755)
    env = deployer_env(PATH=str(bin_dir))
    workdir = tmp_path / "demo"
    result = deployer("demo", "--container", "--workdir", str(workdir), cwd=tmp_path, env=env)
    assert result.returncode == 4, result.stdout + result.stderr
    said = result.stderr
    assert "deployer demo --container needs podman: no podman on PATH" in said
    assert f"{docker} is not podman's (Docker version 27.3.1" in said
    assert "apt-get install podman runc" in said
    assert not workdir.exists(), "nothing was made"
