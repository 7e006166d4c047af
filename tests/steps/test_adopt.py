"""Servers deployer did not start: refused before any change unless adopted (`adopt: port`), launchers that
background the server and exit, and a failing start that shows only its own output. Real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_repo import ORIGINAL_B, Project
from polling import wait_for, within
from ports import free_port
from proctree_helpers import in_sessions, kill_sessions, recorded_pid, restart_playbook

from deployer.agent.processes import Procs
from deployer.transport.local import spawn_agent

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]


@pytest.fixture
def started() -> Iterator[set[int]]:
    sids: set[int] = set()
    yield sids
    kill_sessions(sids)


def web(target: Project, port: int, **extra: object) -> None:
    (target.root / "health").write_text("ok\n")
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(target.root)]
    target.write_inventory(services={"web": {"start": server, "health": f"http://127.0.0.1:{port}/health",
                                             "stop_grace_s": 2, "health_timeout_s": 20, **extra}})


def by_hand(target: Project, port: int, started: set[int]) -> subprocess.Popen[bytes]:
    """A server an operator started from a shell of their own (its own session, as tmux gives it), no pid file."""
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                             str(target.root)], start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    started.add(proc.pid)
    # Loaded CI: the apply's preflight ran before the server listened, found the port free, and went ahead.
    wait_for(lambda: listens(port), f"the server started by hand listens on {port}", 20)
    return proc


def listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_server_started_by_hand_is_refused_before_any_change_and_adopted_with_adopt_port(
        target: Project, started: set[int]) -> None:
    port = free_port()
    web(target, port)
    restart_playbook(target, "pkg/b.py", "VALUE = 2\n")
    hand = by_hand(target, port, started)
    head = target.head()
    refused = target.deployer("apply", "fix.yaml", "--host", "box")
    # Before: the run went ahead, committed, then failed in co_restart.
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert 'add "adopt: port" to hosts.box.services.web' in refused.stderr
    assert target.head() == head and target.file("pkg/b.py") == ORIGINAL_B
    checked = target.deployer("check", "--host", "box")
    assert "served by a process deployer did not start" in checked.stdout and 'add "adopt: port"' in checked.stdout, \
        checked.stdout

    web(target, port, adopt="port")
    checked = target.deployer("check", "--host", "box")
    assert f"running (adopted, pid {hand.pid})" in checked.stdout, checked.stdout
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    new = recorded_pid(target.repo, "web")
    assert new is not None and new != hand.pid
    started.add(new)
    assert hand.wait(timeout=10) is not None


def test_a_launcher_that_backgrounds_the_server_and_exits_is_restarted_through_the_server(
        target: Project, started: set[int]) -> None:
    port = free_port()
    web(target, port)
    server = f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {target.root}"
    target.write_inventory(services={"web": {"start": ["sh", "-c", f"nohup {server} >/dev/null 2>&1 & exit 0"],
                                             "health": f"http://127.0.0.1:{port}/health", "stop_grace_s": 2,
                                             "health_timeout_s": 20}})
    restart_playbook(target, "pkg/b.py", "VALUE = 2\n")
    first = target.deployer("apply", "fix.yaml", "--host", "box")
    # Before: "exited during start-up" (the launcher's exit), while its server served 200.
    assert first.returncode == 0, first.stdout + first.stderr
    served = recorded_pid(target.repo, "web")
    assert served is not None and b"http.server" in Path(f"/proc/{served}/cmdline").read_bytes()
    started.add(os.getsid(served))  # the launcher's session: the server is not its leader
    target.write("fix/touched.py", "VALUE = 3\n")
    second = target.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 0, second.stdout + second.stderr
    assert served not in in_sessions({served}), "the second restart did not stop the launched server"
    again = recorded_pid(target.repo, "web")
    assert again is not None and again != served
    started.add(os.getsid(again))


def listening_on(port: int) -> set[int]:
    """The pids that come to listen on port within a few seconds (the agent's own process table)."""
    with spawn_agent() as agent:
        found: set[int] = set()
        within(lambda: bool(found.update(p.pid for p in agent.call(Procs(ports=[port])).procs) or found), 10)
        return found


def test_a_start_that_detaches_its_server_into_a_session_of_its_own_is_the_server_that_serves_the_port(
        target: Project, started: set[int]) -> None:
    """A daemonizing launcher (as `docker run -d` returns before its server listens): it puts the server in a
    session of its own, which binds a second later, and exits at once. `detaches: true` says so."""
    port = free_port()
    web(target, port)
    server = f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {target.root}"
    launcher = ["sh", "-c", f"setsid sh -c 'sleep 1; exec {server}' >/dev/null 2>&1 </dev/null & exit 0"]
    service = {"start": launcher, "health": f"http://127.0.0.1:{port}/health", "stop_grace_s": 2,
               "health_timeout_s": 20}
    target.write_inventory(services={"web": service})
    restart_playbook(target, "pkg/b.py", "VALUE = 2\n")
    undeclared = target.deployer("apply", "fix.yaml", "--host", "box")
    assert undeclared.returncode != 0 and "exited during start-up" in undeclared.stderr, undeclared.stderr
    orphans = listening_on(port)  # the server it detached binds after the failure: not left behind
    assert orphans, "the detached server never listened"
    kill_sessions(orphans)
    assert within(lambda: not in_sessions(orphans), 10)
    target.write_inventory(services={"web": {**service, "detaches": True}})
    target.write("fix/touched.py", "VALUE = 3\n")
    first = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty")
    assert first.returncode == 0, first.stdout + first.stderr
    served = recorded_pid(target.repo, "web")
    assert served is not None and b"http.server" in Path(f"/proc/{served}/cmdline").read_bytes()
    started.add(os.getsid(served))  # the launcher's session: the server is not its leader
    target.write("fix/touched.py", "VALUE = 4\n")
    second = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty")
    assert second.returncode == 0, second.stdout + second.stderr
    assert served not in in_sessions({served}), "the second restart did not stop the detached server"
    again = recorded_pid(target.repo, "web")
    assert again is not None and again != served
    started.add(os.getsid(again))


def test_a_failing_start_shows_its_own_output_not_an_older_starts_traceback(target: Project,
                                                                           started: set[int]) -> None:
    port = free_port()
    crash = "import sys; print('Traceback (most recent call last): OLD CRASH', file=sys.stderr); sys.exit(1)"
    web(target, port)
    target.write_inventory(services={"web": {"start": [sys.executable, "-c", crash],
                                             "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 5}})
    restart_playbook(target, "pkg/b.py", "VALUE = 2\n")
    first = target.deployer("apply", "fix.yaml", "--host", "box")
    assert first.returncode != 0 and "OLD CRASH" in first.stderr, first.stderr
    other = "import sys; print('second start: config missing', file=sys.stderr); sys.exit(2)"
    target.write_inventory(services={"web": {"start": [sys.executable, "-c", other],
                                             "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 5}})
    target.write("fix/touched.py", "VALUE = 3\n")
    second = target.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode != 0 and "second start: config missing" in second.stderr, second.stderr
    # Before: the tail of a log appended across starts showed the older crash as this failure's cause.
    assert "OLD CRASH" not in second.stderr


def test_a_server_started_by_hand_that_writes_its_pid_file_is_adopted_through_pidfile_and_restarted(
        target: Project, started: set[int]) -> None:
    port = free_port()
    theirs = target.root / "run" / "web.pid"
    theirs.parent.mkdir()
    web(target, port, pidfile=str(theirs))
    restart_playbook(target, "pkg/b.py", "VALUE = 2\n")
    hand = by_hand(target, port, started)
    theirs.write_text(f"{hand.pid}\n")  # as its launcher does
    checked = target.deployer("check", "--host", "box")
    # Before: "served by a process deployer did not start", and the apply refused.
    assert f"running (adopted, pid {hand.pid})" in checked.stdout, checked.stdout
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert hand.wait(timeout=10) is not None
    new = recorded_pid(target.repo, "web")
    assert new is not None and new != hand.pid
    started.add(new)
    assert new in in_sessions({new})


def test_a_pid_file_naming_a_dead_pid_init_or_no_number_is_not_adopted(target: Project,
                                                                      started: set[int]) -> None:
    port = free_port()
    theirs = target.root / "web.pid"
    web(target, port, pidfile=str(theirs))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=10)
    for written in (f"{gone.pid}\n", "1\n", "12ab\n", "\x1b[2J\n"):
        theirs.write_text(written)
        checked = target.deployer("check", "--host", "box")
        assert "adopted" not in checked.stdout and "not running" in checked.stdout, (written, checked.stdout)


def test_a_relative_pidfile_is_a_config_error_naming_its_line_and_field(target: Project) -> None:
    web(target, free_port(), pidfile="run/web.pid")
    refused = target.deployer("check", "--host", "box")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "pidfile" in refused.stderr and "absolute path" in refused.stderr
    assert f"{target.inventory}:" in refused.stderr, refused.stderr
