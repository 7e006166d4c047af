"""`deployer demo` end to end: the bug shows, the fix lands, the gauge drains, nothing is left running."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures_repo import deployer
from fixtures_services import alive, wait_dead
from polling import within

from deployer.demo.run import GAUGE, DemoStack

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first


def demo_pids(workdir: Path) -> dict[str, int]:
    state = workdir / "repo" / ".git" / "deployer"
    return {p.stem: int(p.read_text()) for p in state.glob("*.pid")}


def git_out(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def all_gone(pids: list[int]) -> bool:
    return all(wait_dead(pid) for pid in pids)


def test_demo_shows_the_bug_fixes_it_cleans_up_and_offers_no_rollback_of_the_stack_it_stopped(
        tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    # Given relative, as a person types it: the hosts' repos must still be absolute paths (a traceback before).
    result = deployer("demo", "--workdir", "demo", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = result.stdout[result.stdout.index("demo report"):]
    repo = workdir / "repo"
    before, fix = (git_out(repo, "rev-parse", rev).strip()[:12] for rev in ("HEAD~1", "HEAD"))
    baseline = re.search(rf"gauge +baseline: {GAUGE} = (\d+) on the build before the fix \({before}\)\n", report)
    assert baseline and int(baseline.group(1)) >= 1, report
    assert f"drain: {GAUGE} = 0 on the fix's build ({fix}): passed\n" in report, report
    assert "every process the demo started has been stopped" in report
    files = re.search(rf"  files +{re.escape(str(workdir))} \((\d+\.\d) MB: the demo's repo, inventory and run log\); "
                      rf"deployer demo --stop --workdir {re.escape(str(workdir))} removes them\n", report)
    assert files and 0 < float(files.group(1)) < 20, report
    pids = demo_pids(workdir)
    assert set(pids) == {"prefill", "decode", "router"}
    assert all_gone(list(pids.values()))
    run_id = next(p.name for p in (workdir / "runs").iterdir())
    # A rollback would start the stopped stack again and leave it running: no command, but how to get one.
    assert "deployer rollback" not in report and "to try one, run the demo again with --keep" in report, report
    verify = deployer("runs", "verify", run_id, "--runs-dir", str(workdir / "runs"), cwd=tmp_path)
    assert verify.returncode == 0
    log = subprocess.run(["git", "-C", str(workdir / "repo"), "log", "-1", "--format=%B"], capture_output=True,
                         text=True, check=True).stdout
    assert f"Deployer-Run: {run_id}" in log
    removed = deployer("demo", "--stop", "--workdir", str(workdir), cwd=tmp_path)
    assert removed.returncode == 0 and f"{workdir}: removed the demo's files" in removed.stdout, removed.stdout
    assert not workdir.exists()


def test_demo_json_and_keep_leave_the_stack_running_until_stopped(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--workdir", str(workdir), "--keep", "--json", cwd=tmp_path)
    pids = demo_pids(workdir)
    try:
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["status"] == "successful"
        assert summary["facts"]["drain"]["sglang:num_prefill_inflight_queue_reqs"]["final"] == 0
        assert all(alive(pid) for pid in pids.values())
        stopped = deployer("demo", "--stop", "--workdir", str(workdir), cwd=tmp_path)
        assert stopped.returncode == 0 and f"{workdir}: stopped " in stopped.stdout, stopped.stdout + stopped.stderr
        assert all_gone(list(pids.values()))
        assert f"{workdir}: removed the demo's files" in stopped.stdout and not workdir.exists()
        again = deployer("demo", "--stop", "--workdir", str(workdir), cwd=tmp_path)
        assert again.returncode == 2 and f"{workdir} holds no demo" in again.stderr, again.stdout + again.stderr
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert all_gone(list(pids.values()))


def test_ctrl_c_during_the_demo_stops_everything_and_exits_130(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.Popen([sys.executable, "-m", "deployer", "demo", "--workdir", str(workdir)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    events = workdir / "runs"
    while not (events.exists() and any(events.iterdir())):
        assert time.monotonic() < deadline and proc.poll() is None, "the demo never started its run"
        time.sleep(0.05)
    repo = workdir / "repo"
    initial = git_out(repo, "rev-list", "--max-parents=0", "HEAD").strip()
    shipped = repo / "python/sglang/srt/disaggregation/common/conn.py"
    original = shipped.read_bytes()
    # Interrupt once the fix is on the target's disk: there is something to restore.
    while shipped.read_bytes() == original:
        assert time.monotonic() < deadline and proc.poll() is None, "the fix never landed"
        time.sleep(0.02)
    pids = demo_pids(workdir)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert all_gone(list(pids.values()) + list(demo_pids(workdir).values()))
    # Restored (before the commit) or rolled back (after it): either way the tree is the buggy one
    # again, nothing is left uncommitted, and a commit the run made is undone by a rollback commit.
    assert shipped.read_bytes() == original
    assert git_out(repo, "rev-parse", "HEAD^{tree}") == git_out(repo, "rev-parse", f"{initial}^{{tree}}")
    assert git_out(repo, "status", "--porcelain", "--untracked-files=no") == ""
    if git_out(repo, "rev-parse", "HEAD").strip() != initial:
        assert "Deployer-Rollback-Of:" in git_out(repo, "log", "-1", "--format=%B")
    else:  # no commit was made: the report offers no rollback
        assert "deployer rollback" not in out and "nothing to roll back" in out, out


def rollback_as_printed(report: str, root: Path) -> subprocess.CompletedProcess[str]:
    """The report's rollback line run as a person would: pasted into a shell in another directory, with `deployer`
    on PATH and no DEPLOYER_* set."""
    line = next(row.split("rollback", 1)[1].strip() for row in report.splitlines()
                if row.strip().startswith("rollback "))
    bin_dir, elsewhere = root / "bin", root / "elsewhere"
    bin_dir.mkdir()
    elsewhere.mkdir()
    (bin_dir / "deployer").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m deployer \"$@\"\n")
    (bin_dir / "deployer").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPLOYER_")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    return subprocess.run(["sh", "-c", line], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)


def test_a_kept_demos_rollback_line_works_as_printed_and_demo_stop_then_stops_the_stack_it_restarted(
        tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--workdir", str(workdir), "--keep", cwd=tmp_path)
    pids = demo_pids(workdir)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        rolled = rollback_as_printed(result.stdout, tmp_path)
        assert rolled.returncode == 0, rolled.args[-1] + "\n" + rolled.stdout + rolled.stderr
        assert "Deployer-Rollback-Of:" in git_out(workdir / "repo", "log", "-1", "--format=%B")
        restarted = demo_pids(workdir)
        assert restarted["prefill"] != pids["prefill"] and all(alive(pid) for pid in restarted.values())
        stopped = deployer("demo", "--stop", "--workdir", str(workdir), cwd=tmp_path)
        assert stopped.returncode == 0 and f"{workdir}: stopped " in stopped.stdout, stopped.stdout + stopped.stderr
        assert all_gone(list(restarted.values()))
    finally:
        for pid in {*pids.values(), *demo_pids(workdir).values()}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_a_demo_interrupted_after_its_commit_reports_the_fixs_drain_as_not_run_and_no_rollback_of_a_rolled_back_run(
        tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.Popen([sys.executable, "-m", "deployer", "demo", "--workdir", str(workdir)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    repo = workdir / "repo"
    def committed() -> bool:
        # The run's log says it committed: git's own count of commits can show the run's commit while the run has
        # not recorded it yet, and a SIGINT there undoes a commit the run never knew it made, reverting nothing
        # (the likely cause of a full run that found fewer than three commits here once).
        return any('"type": "commit"' in log.read_text() for log in (workdir / "runs").glob("*/events.jsonl"))

    try:
        assert within(committed, 120), "the demo never committed its fix"
        proc.send_signal(signal.SIGINT)  # the restart of the fix is next: it never runs, the commit is rolled back
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out + err
    report = out[out.index("demo report"):]
    before, fix, revert = (git_out(repo, "rev-parse", rev).strip() for rev in ("HEAD~2", "HEAD~1", "HEAD"))
    assert "Deployer-Rollback-Of:" in git_out(repo, "log", "-1", "--format=%B")
    assert re.search(rf"gauge +baseline: {GAUGE} = \d+ on the build before the fix \({before[:12]}\)\n", report)
    assert "drain: not run\n" in report, report
    assert f"rollback:drain: {GAUGE} = 0 on the reverted build ({revert[:12]}), no load since its restart: " \
           "passed\n" in report, report
    assert "after\n" not in report and "the fix's build" not in report, report  # nothing measured the fix
    assert f"commit    {fix} (was {before}); reverted by {revert}" in report, report
    assert "deployer rollback" not in report and f"the run rolled itself back: {revert[:12]} reverts its commit" \
        in report, report


def test_demo_stop_leaves_a_demo_that_was_not_kept_running(tmp_path: Path) -> None:
    """A demo in progress in the temp dir (where --stop without --workdir looks) is no kept demo."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-m", "deployer", "demo"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # its stack is up: three services running from their pid files
            workdirs = list(temp.glob("deployer-demo-*"))
            pids = demo_pids(workdirs[0]) if workdirs and (workdirs[0] / "repo" / ".git").is_dir() else {}
            if len(pids) == 3 and all(alive(pid) for pid in pids.values()):
                break
            assert time.monotonic() < deadline and proc.poll() is None, "the demo's stack never came up"
            time.sleep(0.05)
        for args in ([], ["--workdir", str(workdirs[0])]):
            stop = subprocess.run([sys.executable, "-m", "deployer", "demo", "--stop", *args], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            assert stop.returncode == 0, stop.stdout + stop.stderr
            assert "nothing was kept" in stop.stdout and "stopped nothing" in stop.stdout, stop.stdout
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, out + err  # its services were left to it: the run went through
        assert "every process the demo started has been stopped" in out
        assert f"files    {workdirs[0]} (" in out  # where the demo left its files, in the temp dir
        # Now that it stopped its stack, --stop without --workdir removes its files from the temp dir.
        removed = subprocess.run([sys.executable, "-m", "deployer", "demo", "--stop"], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert removed.returncode == 0 and f"{workdirs[0]}: removed the demo's files" in removed.stdout, \
            removed.stdout + removed.stderr
        assert not list(temp.glob("deployer-demo-*"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for workdir in temp.glob("deployer-demo-*"):
            for pid in demo_pids(workdir).values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


def test_a_demo_pid_file_is_whole_or_names_no_pid(tmp_path: Path) -> None:
    # `demo --stop` reads them from another process: once one read a file launch had only begun to write.
    stack = DemoStack(tmp_path)
    stack.state.mkdir(parents=True)
    (stack.state / "decode.pid").write_text("")
    (stack.state / "router.pid").write_text("12x\n")
    (stack.state / "prefill.pid").write_text(f"{os.getpid()}\n")
    assert stack.pids() == {"prefill": os.getpid()}
    assert stack.live_pids() == {}  # not a process of the stack's repo


def test_demo_refuses_a_workdir_that_is_not_empty_as_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "notes.txt").write_text("mine\n")
    result = deployer("demo", "--workdir", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"--workdir {tmp_path / 'demo'} is not empty" in result.stderr
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["notes.txt"]


def test_demo_stop_removes_only_this_users_stopped_demos_from_the_shared_temp_dir(tmp_path: Path) -> None:
    """The temp dir is every user's: root's `demo --stop` removed another user's stopped demo there too."""
    from deployer.demo.run import STOPPED

    temp = tmp_path / "tmp"
    temp.mkdir()
    mine, theirs = temp / "deployer-demo-mine", temp / "deployer-demo-theirs"
    for directory in (mine, theirs):
        (directory / "repo").mkdir(parents=True)
        (directory / STOPPED).touch()
    os.chown(theirs, 12345, 12345)  # another user's (the tests run as root, as CI does)
    removed = subprocess.run([sys.executable, "-m", "deployer", "demo", "--stop"], cwd=tmp_path,
                             env={**os.environ, "TMPDIR": str(temp)}, capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert f"{mine}: removed the demo's files" in removed.stdout and str(theirs) not in removed.stdout
    assert not mine.exists() and (theirs / STOPPED).is_file()
