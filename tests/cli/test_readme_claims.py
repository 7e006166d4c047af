"""Docs claims (README.md, docs/) that had no test: each one here, against real processes, real HTTP and real git.

co_restart's refusals, a service's own `stop`, metric aggregation and comparisons, a failed
rollback (exit 6), a second signal, `become` through a whole apply, short secrets, and the
`./hosts.yaml` and runs dir defaults.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git
from fixtures_services import GAUGE, Stack, served, wait_dead

# -- co_restart's refusals ----------------------------------------------------------------------

def test_co_restart_refuses_a_health_url_that_still_answers_after_the_stop(stack: Stack) -> None:
    project = stack.project
    port = stack.ports["prefill"]
    # Started by hand: no pid file, so deployer cannot stop it, and it would answer for the new one.
    squatter = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                 "--directory", str(stack.www)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not port_answers(port):
            assert time.monotonic() < deadline and squatter.poll() is None, "the hand-started server never listened"
            time.sleep(0.05)
        project.playbook(steps=["co_restart"])
        head = project.head()
        result = project.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 1, result.stderr
        said = " ".join(result.stderr.split())
        # Refused before any change (the restart would stop nothing and find the port taken), with the line to add.
        assert (f"http://127.0.0.1:{port}/health answers 200, but no process deployer started (or adopted) runs "
                'prefill: add "adopt: port" to hosts.box.services.prefill in the inventory') in said
        assert "nothing on it was changed" in said
        assert project.head() == head
        assert not [e for e in project.events() if e["type"] in ("service_stopped", "uploaded")]
        assert squatter.poll() is None  # not deployer's to kill
        assert "prefill" not in stack.pids()  # and nothing was started in its place
    finally:
        squatter.kill()
        squatter.wait()


def port_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


# Answers its first /health with 200 and exits at once; the partner answers /health only once the
# first one's port is closed, so co_restart's after-check always runs after the death.
DIES_AFTER_HEALTH = """
import http.server, os, socket, sys
port, partner = int(sys.argv[1]), int(sys.argv[2])

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if partner == 0:
            self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
            self.wfile.write(b"ok"); self.wfile.flush()
            os._exit(0)
        try:
            socket.create_connection(("127.0.0.1", partner), timeout=1).close()
            self.send_response(503)
        except OSError:
            self.send_response(200)
        self.send_header("Content-Length", "0"); self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_co_restart_fails_when_a_process_dies_right_after_its_health_check(stack: Stack) -> None:
    project = stack.project
    script = project.write("dies.py", DIES_AFTER_HEALTH)
    prefill, decode = stack.ports["prefill"], stack.ports["decode"]
    stack.configure(
        prefill={**stack.service("prefill"), "start": [sys.executable, str(script), str(prefill), "0"]},
        decode={**stack.service("decode"), "start": [sys.executable, str(script), str(decode), str(prefill)]})
    project.playbook(steps=["co_restart"])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    said = " ".join(result.stderr.split())
    assert "service prefill" in said and "exited right after its health check passed" in said


FAKE_SYSTEMCTL_THAT_DOES_NOTHING = r"""#!/bin/sh
# A unit manager that reports the unit's process and ignores stop/start: the PID never changes.
case "$1" in
  show) cat "$UNITS/unit.pid" ;;
  is-active) exit 0 ;;
esac
exit 0
"""


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_co_restart_fails_when_a_pid_did_not_change(stack: Stack, tmp_path: Path) -> None:
    project = stack.project
    units = tmp_path / "units"
    (units / "bin").mkdir(parents=True)
    fake = units / "bin" / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL_THAT_DOES_NOTHING)
    fake.chmod(0o755)
    running = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        (units / "unit.pid").write_text(f"{running.pid}\n")
        project.extra_env.update(PATH=f"{fake.parent}:{os.environ['PATH']}", UNITS=str(units))
        stack.configure(decode={"systemd": "sglang-decode.service"})  # no health URL to trip first
        project.playbook(steps=["co_restart"])
        result = project.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 1, result.stderr
        said = " ".join(result.stderr.split())
        assert f"PID did not change ({running.pid} -> {running.pid}): the restart did not happen" in said
    finally:
        running.kill()
        running.wait()


def test_a_services_own_stop_command_is_used_instead_of_signals(stack: Stack) -> None:
    project = stack.project
    stops = project.root / "stops.log"
    pidfile = project.repo / ".git" / "deployer" / "prefill.pid"
    prefill = stack.service("prefill", stop_grace_s=60)
    # TERM is ignored: only the stop command's USR1 ends it before the 60 s grace runs out.
    prefill["start"] = ["sh", "-c", 'trap "" TERM; exec "$@"', "sh", *prefill["start"]]
    prefill["stop"] = ["sh", "-c", f"echo stop >> '{stops}'; "
                                   f"[ ! -f '{pidfile}' ] || kill -s USR1 -- \"-$(cat '{pidfile}')\" || true"]
    stack.configure(prefill=prefill, decode=stack.service("decode"))
    stack.start_services()
    old = stack.pids()["prefill"]
    started = time.monotonic()
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30  # far inside the 60 s grace a TERM would have waited out
    assert stops.read_text() == "stop\nstop\n"  # once per apply
    assert wait_dead(old)
    stopped = next(e for e in project.events() if e["type"] == "service_stopped" and e["service"] == "prefill")
    assert stopped["how"] == "stopped" and stopped["pid"] == old


# -- metric steps ---------------------------------------------------------------------------------

@contextlib.contextmanager
def metrics_server(text: str) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering /metrics with text; yields its URL."""
    with served(lambda path: text.encode()) as server:
        yield f"http://127.0.0.1:{server.port}/metrics"


TWO_WORKERS = (f"# TYPE {GAUGE} gauge\n"
               f'{GAUGE}{{tp_rank="0"}} 2.0\n'
               f'{GAUGE}{{tp_rank="1"}} 3.0\n')  # sum 5, max 3


@pytest.mark.parametrize(("drain", "passes"), [
    ({"aggregate": "max", "op": "==", "to": 3}, True),
    ({"aggregate": "sum", "op": "==", "to": 3}, False),
    ({"aggregate": "sum", "op": "==", "to": 5}, True),
    ({"aggregate": "max", "op": "<=", "to": 3}, True),
    ({"aggregate": "sum", "op": "<=", "to": 3}, False),
    ({"aggregate": "sum", "op": ">=", "to": 5}, True),
    ({"aggregate": "max", "op": ">=", "to": 4}, False),
    ({"aggregate": "sum", "op": "==", "to": 6}, False),
    ({"aggregate": "sum", "op": ">=", "to": 4}, True),
], ids=["max==3", "sum==3", "sum==5", "max<=3", "sum<=3", "sum>=5", "max>=4", "sum==6", "sum>=4"])
@pytest.mark.parametrize("target", ["local"], indirect=True)  # arithmetic: one transport is enough
def test_drain_aggregates_and_compares_as_asked(target: Project, drain: dict[str, Any], passes: bool) -> None:
    with metrics_server(TWO_WORKERS) as url:
        # A drain that holds ends at its second poll: its window is wide, for a machine so loaded that two polls
        # take over a second (a CI run: 'did not reach == 3 for 2 polls within 1s (last samples: 3)'); one that
        # never holds waits its whole window out, so that one is short.
        target.playbook(steps=[{"drain": {"metric": GAUGE, "url": url, "interval_s": 0.1, "within_s": 20 if passes
                                          else 1, "stable_polls": 2, **drain}}])
        result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert (result.returncode == 0) == passes, result.stderr
    values = {e["value"] for e in target.events() if e["type"] == "sample"}
    assert values == {3.0 if drain["aggregate"] == "max" else 5.0}
    if not passes:
        assert f"did not reach {drain['op']} {drain['to']}" in result.stderr


def test_an_unparseable_metric_is_inconclusive_and_fails(target: Project) -> None:
    with metrics_server(f"{GAUGE}{{tp_rank=\"0\"}} not-a-number\n") as url:
        target.playbook(steps=[{"drain": {"metric": GAUGE, "url": url, "to": 0, "op": ">=", "interval_s": 0.1,
                                          "within_s": 1}}])
        result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "inconclusive: unparseable metrics" in " ".join(result.stderr.split())
    assert {e["value"] for e in target.events() if e["type"] == "sample"} == {None}


# -- rollback and signals -------------------------------------------------------------------------

# Refuses only the ref update of a rollback's commit (its message names the run it rolls back).
def logged_events(project: Project) -> list[dict[str, Any]]:
    """The newest run's events so far; none while its log is not there yet."""
    try:
        return project.events()
    except (FileNotFoundError, IndexError):
        return []


def fail_a_rollback(stack: Stack, *, restart: bool = False) -> tuple[str, str]:
    """An apply whose drain fails and whose rollback meets another git process holding the index (its
    index.lock, made once the drain is polling: rollback commits run no hooks, so none can refuse them).
    Returns (HEAD before, stderr)."""
    project = stack.project
    before = project.head()
    stack.start_services()
    project.playbook(steps=["upload", {"commit": {"message": "fix"}}, *([{"co_restart": {}}] if restart else []),
                            {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.1, "within_s": 3}}],
                     on_failure="rollback")
    proc = project.popen("apply", "fix.yaml", "--host", "box")
    index_lock = project.repo / ".git" / "index.lock"
    try:
        deadline = time.monotonic() + 60
        while not any(e["type"] == "sample" for e in logged_events(project)):
            assert proc.poll() is None and time.monotonic() < deadline, "the drain never polled"
            time.sleep(0.02)
        index_lock.write_text("")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        index_lock.unlink(missing_ok=True)
    assert proc.returncode == 6, err
    return before, " ".join(err.split())


def test_a_rollback_that_fails_exits_6_and_names_the_head_it_left(stack: Stack) -> None:
    project = stack.project
    before, said = fail_a_rollback(stack)
    assert "The rollback failed too" in said and "index.lock" in said
    run_id = project.newest_run()
    head = project.head()
    assert git(project.repo, "rev-parse", "HEAD~1").strip() == before
    assert f"Deployer-Run: {run_id}" in git(project.repo, "log", "-1", "--format=%B")
    assert f"Target now: HEAD {head[:12]} (this run's commit)" in said
    end = next(e for e in project.events() if e["type"] == "run_end")
    assert end["exit_code"] == 6 and end["status"] == "failed"


def test_a_rollback_that_fails_names_the_build_each_process_it_left_runs(stack: Stack) -> None:
    # HEAD alone does not say which build serves: the processes the run's restart started run its commit.
    project = stack.project
    _, said = fail_a_rollback(stack, restart=True)
    run_id = project.newest_run()
    started = {e["service"]: e["pid"] for e in project.events(run_id) if e["type"] == "service_started"}
    assert started, said
    for name, pid in started.items():
        assert f"{name} pid {pid} (started on this run's commit)" in said, said


def events_text(project: Project) -> str:
    """The run log's events, for a failure's message: what the run did, step by step."""
    return "".join(f"\n{json.dumps({k: v for k, v in e.items() if k not in ('time', 'run', 'line_sha256')})[:300]}"
                   for e in project.events())


def gated_commit(project: Project) -> Path:
    """A pre-commit hook that announces itself, then waits for a gate that never opens (bounded: 60 s).

    The commit goes to the target with the upload (sent ahead), so when the hook runs, the run here may be
    inside the commit step or still at a safe point before it: a first signal then stops it there and the
    restore begins, and a second one comes during that restore (which must finish all the same)."""
    entered = project.root / "hook-entered"
    project.hook("pre-commit", f"#!/bin/sh\ntouch '{entered}'\ni=0\n"
                               f"while [ ! -e '{project.root}/never' ] && [ $i -lt 1200 ]; do sleep 0.05; "
                               "i=$((i+1)); done\n")
    return entered


def test_a_second_signal_stops_at_once_and_still_restores(target: Project) -> None:
    entered = gated_commit(target)
    target.playbook(steps=["local_compile", "upload", "remote_compile", {"diff_bounds": {"files": 1}},
                           {"commit": {"message": "m", "hooks": True}}])
    head = target.head()
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not entered.exists():  # parked in the commit step
            assert time.monotonic() < deadline and proc.poll() is None, "the commit never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        while not any("again to force" in line for line in lines):  # the first signal was handled
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.02)
        assert proc.poll() is None  # waiting for the next safe point: the end of the commit step
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)  # the gate holds the commit for 60 s: only a forced stop ends sooner
        except subprocess.TimeoutExpired:
            pytest.fail("the forced stop did not end the run:\n" + "".join(lines) + events_text(target))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.returncode == 130, "".join(lines)
    # Under load the second signal came during the restore, which it used to abandon (the fix left, exit 130).
    assert target.file("pkg/a.py") == ORIGINAL_A and target.head() == head, "".join(lines) + events_text(target)
    assert not (target.repo / ".git" / "deployer.run.lock").exists()
    logged = target.events()
    end = next(e for e in logged if e["type"] == "run_end")
    assert end["status"] == "canceled"
    # The forced stop killed the remote_compile still running on the target, so the restore was not queued behind it.
    killed = [e["count"] for e in logged if e["type"] == "commands_killed"]
    assert killed and all(count >= 1 for count in killed), killed


# -- hosts, secrets, defaults ---------------------------------------------------------------------

@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_become_carries_a_whole_apply_through_sudo(target: Project, sshd: Any) -> None:
    before = len(sshd.sudo_calls())
    target.write_inventory(become=True)
    target.playbook()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == FIXED_A
    # One agent, started under sudo -n; every command the run logged went through it.
    calls = sshd.sudo_calls()[before:]
    assert len(calls) == 1 and calls[0].startswith("-n -- "), calls
    assert [e for e in target.events() if e["type"] == "command"]
    [agent] = [e for e in target.events() if e["type"] == "agent"]
    assert agent["euid"] == 0 and len(agent["sha256"]) == 64
    connected = next(e for e in target.events() if e["type"] == "connected")
    assert connected["transport"]["extra"]["become"] == "sudo"


@pytest.mark.parametrize(("value", "accepted"), [("abc", False), ("", False), ("abcd", True)])
def test_secrets_shorter_than_4_characters_are_refused(target: Project, value: str, accepted: bool) -> None:
    target.write_inventory(env={"API_KEY": {"secret": True, "value": value}})
    target.playbook()
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    if accepted:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2, result.stderr
    assert "shorter than 4 characters; it cannot be masked reliably" in " ".join(result.stderr.split())


def test_inventory_defaults_to_hosts_yaml_in_the_cwd_and_runs_dir_to_the_users_state_dir(target: Project) -> None:
    target.playbook()
    env = {k: v for k, v in os.environ.items() if k not in ("DEPLOYER_INVENTORY", "DEPLOYER_RUNS_DIR")}
    env["NO_COLOR"] = "1"
    result = subprocess.run([sys.executable, "-m", "deployer", "apply", "fix.yaml", "--host", "box"],
                            cwd=target.root, env=env, capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr  # found ./hosts.yaml (target.inventory is there)
    assert target.inventory == target.root / "hosts.yaml"
    [run] = list((Path(env["XDG_STATE_HOME"]) / "deployer" / "runs").iterdir())
    assert json.loads((run / "events.jsonl").read_text().splitlines()[0])["type"] == "run_start"
    assert not target.runs.exists() and not (target.root / ".deployer").exists()
    elsewhere = subprocess.run([sys.executable, "-m", "deployer", "runs", "list"], cwd=target.root.parent,
                               env=env, capture_output=True, text=True, timeout=60)
    assert run.name in elsewhere.stdout  # one place per user, whatever the cwd
