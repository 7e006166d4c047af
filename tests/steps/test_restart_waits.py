"""A start tells its own story, and its waits can be seen: what health answered and for how long, the new
process's pid and memory, each phase as it happens, each service's time to healthy, and budgets that fit.

The servers are the demo stack's real SGLang stand-in (`python -m sglang.launch_server`), whose `/health`
answers 503 for SGLANG_DEMO_STARTUP_S after it binds, as SGLang's does until its warm-up ends."""

from __future__ import annotations

import json
import re
import shutil
import sys
from typing import Any

import pytest
from fixtures_repo import Project
from fixtures_services import Stack, free_port

from deployer.demo.run import STACK


def demo_server(stack: Stack, name: str, startup_s: float, budget_s: float) -> dict[str, Any]:
    """The demo decode server as a service, its copy of the stack outside the source tree, warming up
    (health 503) for startup_s."""
    copy = stack.project.root / "stack"
    if not copy.exists():
        shutil.copytree(STACK, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    port = stack.ports[name]
    return {"start": [sys.executable, "-m", "sglang.launch_server", "--disaggregation-mode", "decode",
                      "--port", str(port), "--disaggregation-bootstrap-port", str(free_port()),
                      "--enable-metrics"],
            "cwd": str(copy / "python"), "health": f"http://127.0.0.1:{port}/health",
            "env": {"SGLANG_DEMO_STARTUP_S": str(startup_s), "PYTHONDONTWRITEBYTECODE": "1"},
            "health_timeout_s": budget_s, "stop_grace_s": 2}


def restart_only(project: Project) -> None:
    project.playbook(steps=[{"co_restart": {}}])




# -- item 4: the failure says what health answered, and whether the process lives -------------------------

def test_a_server_whose_health_stays_503_past_its_budget_fails_with_the_answers_counted_and_its_pid_and_rss(
        stack: Stack) -> None:
    stack.configure(decode=demo_server(stack, "decode", startup_s=60, budget_s=3))
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "did not answer 200 within 3s" in result.stderr
    told = re.search(r"/health: (no answer x(\d+), )?503 x(\d+) over (\d+) s; pid (\d+) alive, RSS (\d+) MiB",
                     result.stderr)
    assert told, result.stderr
    assert int(told.group(3)) >= 3 and int(told.group(4)) >= 3  # polled for the whole budget, 503 each time
    assert int(told.group(5)) == stack.pids()["decode"]
    assert int(told.group(6)) >= 5  # a python interpreter with an HTTP server loaded holds some memory
    polled = next(e for e in stack.project.events() if e.get("action") == "decode.up_health")
    assert sum(times for _, times in polled["outcomes"]) == polled["count"]
    assert ["503", int(told.group(3))] in polled["outcomes"]  # the message counts what the run log recorded


def test_a_server_that_exits_during_start_up_says_after_how_long_and_what_health_answered(stack: Stack) -> None:
    port = free_port()
    dies = {"start": [sys.executable, "-c", "import time; time.sleep(1.5); raise SystemExit('CUDA out of memory')"],
            "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 30}
    stack.configure(decode=dies)
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    told = re.search(r"exited during start-up after (\d+\.\d)s; /health: no answer x(\d+) over \d+ s", result.stderr)
    assert told, result.stderr
    assert 1.0 <= float(told.group(1)) < 30
    assert "alive" not in result.stderr.split("exited during start-up")[1].splitlines()[0]
    assert "CUDA out of memory" in result.stderr  # the log's tail still follows


# -- item 5: waits you can see, budgets that fit --------------------------------------------------------

def test_plain_output_of_an_apply_shows_loading_with_the_pid_and_health_answers_then_healthy(stack: Stack) -> None:
    stack.configure(decode=demo_server(stack, "decode", startup_s=2, budget_s=30))
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")  # not a terminal: plain lines
    assert result.returncode == 0, result.stdout + result.stderr
    pid = stack.pids()["decode"]
    assert f"[co_restart] decode starting: pid {pid}, " in result.stdout
    assert re.search(rf"\[co_restart\] decode loading: pid {pid}, health 503, \d+\.\ds of 30s", result.stdout), \
        result.stdout
    healthy = re.search(rf"\[co_restart\] decode healthy: pid {pid}, health 200, (\d+\.\d)s of 30s", result.stdout)
    assert healthy, result.stdout
    recorded = [e for e in stack.project.events() if e["type"] == "service_healthy"]
    assert [(e["service"], e["pid"], e["budget_s"]) for e in recorded] == [("decode", pid, 30)]
    assert 2.0 <= recorded[0]["seconds"] < 30 and recorded[0]["seconds"] == float(healthy.group(1))


@pytest.mark.parametrize("target", ["local"], indirect=True)  # when to poll is the client's: over ssh alike
def test_a_long_start_is_polled_less_often_as_it_goes_on_and_still_found_healthy_within_a_second(
        stack: Stack) -> None:
    # 12 s of 503: polled every 0.2 s throughout, that is 60 polls (40 with a round trip of 0.1 s each); polled
    # every tenth of the wait so far (0.2 s to 1 s), 28.
    stack.configure(decode=demo_server(stack, "decode", startup_s=12, budget_s=60))
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    events = stack.project.events()
    polled = next(e for e in events if e.get("action") == "decode.up_health")
    assert 12 <= polled["count"] <= 32, polled  # at least one a second, far fewer than 5 a second
    healthy = next(e for e in events if e["type"] == "service_healthy")
    # The server's own start (an interpreter, its imports) comes before its 12 s; then at most a 1 s pause.
    assert 12.0 <= healthy["seconds"] <= 12.0 + 1.0 + 3.0, healthy


def test_check_and_plan_show_the_last_time_to_healthy_and_warn_when_the_budget_is_below_it(stack: Stack) -> None:
    project = stack.project
    stack.configure(prefill=demo_server(stack, "prefill", startup_s=2, budget_s=30))
    restart_only(project)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    run_id = project.newest_run()
    seconds = next(e for e in project.events() if e["type"] == "service_healthy")["seconds"]
    said = f"last healthy after {seconds:g}s (run {run_id})"
    checked = project.deployer("check", "--host", "box", "--json")
    row = next(c for c in json.loads(checked.stdout)["checks"] if c["name"] == "service prefill start")
    assert (row["status"], row["detail"]) == ("ok", f"{said}; budget 30s")
    planned = project.deployer("plan", "fix.yaml", "--host", "box")
    assert f"ok prefill: {said}; budget 30s" in planned.stdout
    # The same service with a budget below what its last start took: a warning in both, naming the fix.
    stack.configure(prefill=demo_server(stack, "prefill", startup_s=2, budget_s=1))
    checked = project.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout  # a warning, not a refusal
    assert re.search(rf"service prefill start +warn +{re.escape(said)}; budget 1s: below it", checked.stdout), \
        checked.stdout
    planned = project.deployer("plan", "fix.yaml", "--host", "box", "--json")
    [timing] = json.loads(planned.stdout)["time_to_healthy"]
    assert timing == {"service": "prefill", "seconds": seconds, "run_id": run_id, "budget_s": 1.0, "short": True}


def test_health_timeout_overrides_every_budget_for_one_run_and_the_run_log_records_it(stack: Stack) -> None:
    project = stack.project
    stack.configure(decode=demo_server(stack, "decode", startup_s=5, budget_s=60))
    restart_only(project)
    cut = project.deployer("apply", "fix.yaml", "--host", "box", "--health-timeout", "2")
    assert cut.returncode == 1, cut.stdout + cut.stderr
    assert "service decode: http://127.0.0.1:" in cut.stderr and "did not answer 200 within 2s" in cut.stderr
    start = next(e for e in project.events() if e["type"] == "run_start")
    assert start["health_timeout_s"] == 2
    assert {e["budget_s"] for e in project.events() if e["type"] == "service_phase"} == {2}
    # The inventory's budget, without the option, fits the same server.
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    assert "health_timeout_s" not in next(e for e in project.events() if e["type"] == "run_start")


def test_rollback_and_recover_take_the_health_budget_too(target: Project) -> None:
    for command in ("apply", "rollback", "recover"):
        shown = target.deployer(command, "--help")
        assert "--health-timeout S" in shown.stdout, command
    refused = target.deployer("rollback", "20260101T000000.000Z-abcdef", "--health-timeout", "0")
    assert refused.returncode == 2 and "--health-timeout" in refused.stderr


# -- issue 33 item 13: a row's clock stops when its phase ends ------------------------------------------------

class Clock:
    """The live view's clock, moved by the test: each second of a restart, without waiting for it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_live_row_stops_its_clock_when_its_phase_ends_and_shows_that_phases_own_duration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    from types import SimpleNamespace

    from deployer.ui import live
    from deployer.ui.console import make_console

    clock = Clock()
    monkeypatch.setattr(live, "time", SimpleNamespace(monotonic=clock.monotonic))
    view = live.StepView(make_console())
    step = "co_restart"

    def at(seconds: float, event: str, **fields: Any) -> None:
        clock.now = 1000.0 + seconds
        view({"type": event, "step": step, **fields})

    def rows(seconds: float) -> list[str]:
        clock.now = 1000.0 + seconds
        terminal = make_console()
        terminal.file, terminal.width = io.StringIO(), 200
        terminal.print(view._table())
        return [line.strip() for line in terminal.file.getvalue().splitlines() if " decode " in f" {line} "]

    # The order co_restart goes in: decode stops first (6 s, of a 10 s grace), then prefill stops, waits for its
    # GPUs and loads, and only then does decode wait for its own GPUs.
    at(0, "step_start", kind="co_restart")
    at(0.1, "service_phase", service="decode", phase="stopping", elapsed_s=0.1, budget_s=10, pid=4755)
    at(2.0, "service_phase", service="decode", phase="waiting_tree", elapsed_s=2.0, budget_s=10, pid=4755)
    at(6.0, "service_stopped", service="decode", pid=4755)
    at(6.1, "service_phase", service="prefill", phase="stopping", elapsed_s=0.1, budget_s=10, pid=4604)
    at(9.0, "service_stopped", service="prefill", pid=4604)
    at(9.1, "service_phase", service="prefill", phase="waiting_gpu", elapsed_s=0.1, budget_s=120)
    at(30.0, "service_phase", service="prefill", phase="loading", elapsed_s=0.2, budget_s=600, pid=7450)
    assert rows(56.0) == ["decode waiting for its process tree: pid 4755, 6.0s of 10s"], \
        "decode's stop took 6 s, not 56"
    at(56.0, "service_phase", service="decode", phase="waiting_gpu", elapsed_s=0.0, budget_s=120)
    assert rows(58.5) == ["decode waiting for its GPUs: 2.5s of 120s"]  # its next phase's clock runs
    at(60.0, "step_end", status="failed", duration_s=60.0, error="cancelled")
    assert view.services[step, "decode"].clock() == 4.0  # the step's end ends the phase it was in


def test_a_launcher_that_writes_its_own_log_names_it_and_a_failed_start_shows_that_logs_tail_labelled(
        stack: Stack) -> None:
    own = stack.project.root / "own.log"
    own.write_text("an earlier start's last line\n")
    crash = ("import time; print('loading weights', flush=True); time.sleep(1); "
             "raise SystemExit('torch.OutOfMemoryError')")
    port = free_port()
    # `nohup server >> own.log &`: the launcher exits at once, and all the server says goes to its own file.
    launcher = {"start": ["sh", "-c", f'echo launching; nohup {sys.executable} -c "{crash}" >> {own} 2>&1 &'],
                "log": str(own), "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 5}
    stack.configure(decode=launcher)
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    label = f"decode's own log {own} since this start (tail):"
    assert label in result.stderr, result.stderr
    tail = result.stderr.split(label)[1]
    assert "loading weights" in tail and "torch.OutOfMemoryError" in tail
    assert "an earlier start's last line" not in tail


def test_a_failed_start_labels_its_tail_as_the_services_stdout_and_stderr_combined(stack: Stack) -> None:
    port = free_port()
    dies = {"start": [sys.executable, "-c", "import sys; print('to stdout', flush=True); sys.exit('to stderr')"],
            "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 10}
    stack.configure(decode=dies)
    restart_only(stack.project)
    result = stack.project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stdout + result.stderr
    label = "decode's stdout and stderr, combined, since this start (tail):"
    assert label in result.stderr, result.stderr
    assert "to stdout" in result.stderr.split(label)[1] and "to stderr" in result.stderr.split(label)[1]
