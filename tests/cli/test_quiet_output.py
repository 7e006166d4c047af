"""Off a terminal, output a person can read: a poll's reading is a line when it changes and every 10 s (as a
service's wait is), not a line a poll; a refusal is said once."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures_repo import Project
from fixtures_services import GAUGE, Stack

from deployer.ui import live
from deployer.ui.console import PlainConsole, make_console


class Clock:
    """The views' clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_off_a_terminal_a_drain_says_an_unchanged_reading_once_not_once_a_poll(stack: Stack) -> None:
    stack.start_services()  # the gauge reads 3 throughout
    stack.project.playbook(steps=[{"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.1, "within_s": 2}}])
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith("[drain] sample")]
    assert len(said) == 1, result.stdout
    assert re.fullmatch(rf"\[drain\] sample {re.escape(GAUGE)} = 3, target <= 0, \d+\.\ds of 2s", said[0])
    assert len([e for e in stack.project.events() if e["type"] == "sample"]) >= 10  # each one logged


def plain_lines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[Clock, Any]:
    clock = Clock()
    monkeypatch.setattr(live, "time", SimpleNamespace(monotonic=clock.monotonic))
    return clock, lambda: capsys.readouterr().out.splitlines()


def test_a_metric_poll_is_said_on_each_change_and_every_10_s_while_it_stays(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock, said = plain_lines(monkeypatch, capsys)
    view = live.StepView(PlainConsole())
    view({"type": "step_start", "step": "drain"})
    said()

    def sample(at: float, value: float) -> None:
        clock.now = 1000.0 + at
        view({"type": "sample", "step": "drain", "metric": "g", "value": value, "target": "<= 0",
              "elapsed_s": at, "budget_s": 60})

    for at in (0.0, 1.0, 2.0, 9.5):
        sample(at, 3)
    assert said() == ["[drain] sample g = 3, target <= 0, 0.0s of 60s"]
    sample(10.0, 3)  # 10 s on, still 3: said again
    sample(11.0, 2)  # a change: said at once
    sample(12.0, 2)
    assert said() == ["[drain] sample g = 3, target <= 0, 10.0s of 60s",
                      "[drain] sample g = 2, target <= 0, 11.0s of 60s"]


def inflight(worker: str, value: float | None, at: float, host: str = "gpu-a") -> dict[str, Any]:
    return {"type": "worker_inflight", "host": host, "router": "r", "unit": "pd-1", "worker": worker,
            "service": f"{host}:prefill", "value": value, "elapsed_s": at, "budget_s": 20}


def test_a_router_drain_is_said_per_worker_on_each_change_and_every_10_s_by_both_views(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock, said = plain_lines(monkeypatch, capsys)
    step_view, fleet_view = live.StepView(PlainConsole()), live.FleetView(PlainConsole(), ["gpu-a"])
    for view in (step_view, fleet_view):
        for at in (0.0, 0.1, 0.2, 0.3):  # two workers polled every 0.1 s
            clock.now = 1000.0 + at
            view(inflight("http://w1", 2, at))
            view(inflight("http://w2", 0, at))
        clock.now = 1010.0
        view(inflight("http://w1", 2, 10.0))
        view(inflight("http://w1", 0, 10.1))
        lines = said()
        assert [line.split("] unit pd-1: ")[1] for line in lines] == [
            "worker http://w1 (gpu-a:prefill) in flight: 2, 0.0s of 20s",
            "worker http://w2 (gpu-a:prefill) in flight: 0, 0.0s of 20s",
            "worker http://w1 (gpu-a:prefill) in flight: 2, 10.0s of 20s",
            "worker http://w1 (gpu-a:prefill) in flight: 0, 10.1s of 20s"], lines


def test_a_fleet_hosts_row_shows_no_detail_of_the_step_before_once_the_next_starts() -> None:
    view = live.FleetView(PlainConsole(), ["gpu-a"])
    for event in ({"type": "host_status", "status": "running"},
                  {"type": "step_start", "step": "upload"},
                  {"type": "step_end", "step": "upload", "status": "ok", "summary": "1 file(s) staged"},
                  {"type": "step_start", "step": "remote_compile"}):
        view({**event, "host": "gpu-a"})
    terminal = make_console()
    terminal.file, terminal.width = io.StringIO(), 200
    terminal.print(view._render())
    row = next(line for line in terminal.file.getvalue().splitlines() if line.startswith("gpu-a"))
    assert "remote_compile" in row and "staged" not in row, row


def test_a_phase_is_said_in_words_not_its_name_in_the_run_log() -> None:
    event = {"service": "decode", "phase": "waiting_tree", "pid": 7, "budget_s": 10}
    assert live.phase_text(event, 1.0) == "decode waiting for its process tree: pid 7, 1.0s of 10s"
    assert live.phase_text({**event, "phase": "waiting_gpu", "pid": None}, 2.0) == \
        "decode waiting for its GPUs: 2.0s of 10s"


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_check_says_a_host_key_refusal_once(target: Project, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    target.write_inventory(known_hosts=str(empty))
    result = target.deployer("check", "--host", "box")
    assert result.returncode == 4, result.stdout + result.stderr
    assert (result.stdout + result.stderr).count("refusing to connect") == 1, result.stdout + result.stderr
    assert result.stderr.startswith("error: box: host key of ") and "accept-new" in result.stderr
    assert re.search(r"host key +FAIL +see the error below", result.stdout), result.stdout
    assert "box: not ready: host key (exit 4)" in result.stdout
