"""Runs handed to a daemon (deployer/daemon) are the runs deployer makes in its own process: the same apply, a
signal that stops it restores the target, a kill outright cuts it and recover ends it. Over local and ssh, with
a real daemon started by `deployer daemon start` in the test's own folder (killed by pid at the end)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, signal_one, staged_bytes, target_python
from polling import wait_for
from terminal import on_a_terminal
from test_recover import commit_with_hooks, gate, kill_marker, recover_twice, start_and_kill, state_of

from deployer.runowner import Owner

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]


@pytest.fixture
def daemon(target: Project, tmp_path: Path) -> Iterator[int]:
    folder = tmp_path / "daemon"
    folder.mkdir(mode=0o700)
    target.extra_env.update({"DEPLOYER_DAEMON": "on", "DEPLOYER_DAEMON_DIR": str(folder)})
    done = subprocess.run([sys.executable, "-m", "deployer", "daemon", "start", "--json"], env=target.env(),
                          cwd=target.root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(json.loads(done.stdout)["pid"])
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def served(target: Project) -> int:
    done = subprocess.run([sys.executable, "-m", "deployer", "daemon", "status", "--json"],
                          env={**target.env(), "DEPLOYER_DAEMON": "off"}, capture_output=True, text=True, timeout=60)
    return int(json.loads(done.stdout)["served"])


def owner_of(run: Path) -> Owner:
    found = state_of(run).get("owner")
    assert found is not None, f"{run} names no owner"
    return Owner.model_validate(found)


def test_an_apply_handed_to_the_daemon_ships_and_commits_in_its_fork(target: Project, daemon: int) -> None:
    target.playbook()
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert target.file("pkg/a.py") == FIXED_A
    assert served(target) == 1
    run = sorted(p for p in target.runs.iterdir() if (p / "state.json").is_file())[-1]
    assert owner_of(run).pid not in (proc.pid, daemon)  # the run's process is the daemon's fork of the command


def test_a_signal_to_the_command_stops_the_run_in_the_daemon_and_restores_the_target(target: Project,
                                                                                    daemon: int) -> None:
    target.write_inventory(python=target_python(target, "sleep 2"))
    target.playbook()
    head = target.head()
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    wait_for(lambda: staged_bytes(target.repo, "pkg/a.py") == FIXED_A or proc.poll() is not None, "the upload")
    assert proc.poll() is None, proc.communicate()
    signal_one(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "canceled (exit 130)" in out
    assert target.file("pkg/a.py") == ORIGINAL_A and staged_bytes(target.repo, "pkg/a.py") is None
    assert target.head() == head


def test_a_command_killed_outright_cuts_its_run_and_recover_ends_it(target: Project, daemon: int) -> None:
    head = target.head()
    script, marker = gate(target, "pre-commit")
    target.hook("pre-commit", f"#!/bin/sh\nexec {script}\n")
    target.playbook(steps=commit_with_hooks())
    run = start_and_kill(target, marker.exists, "the pre-commit hook")
    forked = owner_of(run)
    # The hook still blocks: only the kill that took the command could have ended the run's process.
    wait_for(lambda: forked.alive() is False, "the run's process ended with the command that was killed", 30)
    kill_marker(marker)
    recover_twice(target, run)
    assert target.file("pkg/a.py") == ORIGINAL_A and target.head() == head


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_the_live_view_draws_on_the_callers_terminal(target: Project, daemon: int) -> None:
    target.playbook()
    shown = on_a_terminal(["apply", "fix.yaml", "--host", "box"], target.root, target.env(), columns=160)
    assert shown.exit_code == 0, "\n".join(shown.screen)
    assert served(target) == 1
    # The step table is the live view's: drawn (and redrawn) only on a terminal, as the fork saw its stdout be one.
    assert any(line.startswith("local_compile ") for line in shown.screen), "\n".join(shown.screen)
    assert len(shown.frames) > 1, "\n".join(shown.screen)
