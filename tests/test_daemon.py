"""deployer/daemon: a command handed to this user's daemon runs as it would in its own process.

Two kinds of daemon, both real processes on a real unix socket. A probe daemon (deployer's Daemon with a small
command of this file's in place of deployer's CLI) says where and how its command ran: directory, environment,
umask, argv, stdin, signals. And deployer's own (`deployer daemon start`), for what a user runs: real commands,
a daemon whose code changed, a folder that is not private, stop. Each test's daemon lives in its own tmp folder
(DEPLOYER_DAEMON_DIR) and is stopped by pid at the end, whatever happened."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from polling import wait_for, within

ROOT = Path(__file__).resolve().parents[1]

# The probe daemon: what control.spawn starts, with the probe as its command. Its own folder on the path is
# dropped, as the real one's is, so that its stamp is the client's.
PROBE_DAEMON = textwrap.dedent("""
    import sys
    if sys.path[:1] == ['']: del sys.path[0]
    import json, os, signal, time
    from pathlib import Path
    from deployer.daemon.serve import Daemon

    def probe():
        what = sys.argv[1]
        if what == "where":
            print(json.dumps({"cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"), "umask": os.umask(0),
                              "zone": time.strftime("%Z"),
                              "argv": sys.argv, "path0": sys.path[0], "stdin": sys.stdin.read(),
                              "pid": os.getpid(), "pgid": os.getpgid(0)}))
            sys.stdout.flush()
            os._exit(7)
        Path(sys.argv[2]).write_text(str(os.getpid()))
        if what == "die":
            os.kill(os.getpid(), signal.SIGTERM)
        try:
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            os._exit(130)

    Daemon(Path(sys.argv[1]), float(sys.argv[2]), command=probe).serve(preload=lambda: None)
""")
CLIENT = ("import os, sys\nfrom deployer.daemon.client import handed_over\ncode = handed_over()\n"
          "print('not handed over', flush=True) if code is None else os._exit(code)\n")


def env_for(folder: Path, **extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("DEPLOYER_")},
            "DEPLOYER_DAEMON_DIR": str(folder), "NO_COLOR": "1", **extra}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "daemon"
    made.mkdir(mode=0o700)
    return made


@pytest.fixture
def probe_daemon(folder: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", PROBE_DAEMON, str(folder), "60"], env=env_for(folder),
                            stderr=subprocess.PIPE, cwd="/")
    try:
        wait_for(lambda: list(folder.glob("*.sock")) or proc.poll() is not None, "the probe daemon listens", 30)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        yield proc
    finally:
        proc.kill()
        proc.wait()


def client(folder: Path, *args: str, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(  # type: ignore[call-overload]
        [sys.executable, "-c", CLIENT, *args], env=env or env_for(folder, PROBE_VALUE="from-env"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except (ProcessLookupError, FileNotFoundError):  # gone between the two looks too
        return True


def test_the_command_runs_with_the_callers_directory_environment_umask_argv_and_stdin(
        probe_daemon: subprocess.Popen[bytes], folder: Path, tmp_path: Path) -> None:
    proc = client(folder, "where", "an arg", cwd=tmp_path, stdin=subprocess.PIPE,
                  env=env_for(folder, PROBE_VALUE="from-env", TZ="Asia/Tokyo"), preexec_fn=lambda: os.umask(0o027))
    out, err = proc.communicate("typed in\n", timeout=30)
    assert proc.returncode == 7, err  # the command's own exit code
    seen = json.loads(out)
    assert seen["cwd"] == str(tmp_path)
    assert seen["env"] == "from-env"
    assert seen["umask"] == 0o027
    assert seen["zone"] == "JST"  # the caller's TZ, not the daemon's
    assert seen["argv"] == ["-c", "where", "an arg"]
    assert seen["path0"] == ""  # the caller's sys.path, its script's folder first (`-c`: "")
    assert seen["stdin"] == "typed in\n"
    assert seen["pid"] != proc.pid  # it ran in the daemon's fork, not in the caller
    assert seen["pgid"] == seen["pid"]  # in a group of its own, so a signal reaches what it starts too


def test_a_ctrl_c_reaches_the_command(probe_daemon: subprocess.Popen[bytes], folder: Path, tmp_path: Path) -> None:
    proc = client(folder, "wait", str(tmp_path / "pid"))
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert out == "interrupted\n", (proc.returncode, err)
    assert proc.returncode == 130


def test_a_caller_killed_outright_takes_its_command_with_it(probe_daemon: subprocess.Popen[bytes], folder: Path,
                                                            tmp_path: Path) -> None:
    proc = client(folder, "wait", str(tmp_path / "pid"))
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    command = int((tmp_path / "pid").read_text())
    assert not gone(command)
    proc.kill()
    proc.wait()
    wait_for(lambda: gone(command), "the command ended with its caller", 30)


def test_a_runner_killed_by_hand_takes_its_command_with_it(probe_daemon: subprocess.Popen[bytes], folder: Path,
                                                           tmp_path: Path) -> None:
    proc = client(folder, "wait", str(tmp_path / "pid"))
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    command = int((tmp_path / "pid").read_text())
    runner = int(Path(f"/proc/{command}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    os.kill(runner, signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 70 and "ended without its exit status" in err
    wait_for(lambda: gone(command), "the command ended with its runner", 30)


def test_a_command_ended_by_a_signal_ends_its_caller_by_the_same(probe_daemon: subprocess.Popen[bytes],
                                                                 folder: Path, tmp_path: Path) -> None:
    proc = client(folder, "die", str(tmp_path / "pid"))
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_a_command_that_outlives_its_daemon_leaves_the_place_to_the_next(probe_daemon: subprocess.Popen[bytes],
                                                                          folder: Path, tmp_path: Path) -> None:
    proc = client(folder, "wait", str(tmp_path / "pid"))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        probe_daemon.terminate()
        probe_daemon.wait(timeout=30)
        assert proc.poll() is None  # the command runs on without its daemon
        lock = os.open(next(folder.glob("*.lock")), os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the next daemon may take the place at once
        finally:
            os.close(lock)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert out == "interrupted\n"  # still its caller's: the runner outlived the daemon too


def test_a_caller_under_other_interpreter_flags_runs_on_its_own(probe_daemon: subprocess.Popen[bytes],
                                                               folder: Path, tmp_path: Path) -> None:
    proc = client(folder, "where", cwd=tmp_path, env=env_for(folder, PYTHONFAULTHANDLER="1"))
    out, _ = proc.communicate(timeout=30)
    assert out == "not handed over\n"
    assert probe_daemon.poll() is None  # it still serves the callers it was started for


def deployer(folder: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deployer", *args], env=env_for(folder, **extra),
                          capture_output=True, text=True, timeout=120, cwd="/")


@pytest.fixture
def started(folder: Path) -> Iterator[int]:
    done = deployer(folder, "daemon", "start", "--json")
    assert done.returncode == 0, done.stderr
    pid = int(json.loads(done.stdout)["pid"])
    try:
        yield pid
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def served(folder: Path) -> int:
    done = deployer(folder, "daemon", "status", "--json", DEPLOYER_DAEMON="off")
    return int(json.loads(done.stdout).get("served", -1))


def test_deployer_commands_go_through_a_started_daemon(started: int, folder: Path) -> None:
    before = served(folder)
    version = deployer(folder, "--version")
    assert version.returncode == 0 and "deployer, version" in version.stdout
    usage = deployer(folder, "no-such-command")
    assert usage.returncode == 2 and "No such command" in usage.stderr  # its exit code and its stderr
    assert served(folder) == before + 2
    assert deployer(folder, "--version", DEPLOYER_DAEMON="off").returncode == 0
    assert served(folder) == before + 2  # off: a process of its own
    again = deployer(folder, "daemon", "start")
    assert "already running" in again.stdout and str(started) in again.stdout


def test_auto_starts_a_daemon_for_the_commands_after_the_first(folder: Path) -> None:
    first = deployer(folder, "--version", DEPLOYER_DAEMON="auto")
    assert first.returncode == 0 and "deployer, version" in first.stdout
    wait_for(lambda: served(folder) == 0, "the daemon the first command started answers", 60)
    pid = int(json.loads(deployer(folder, "daemon", "status", "--json", DEPLOYER_DAEMON="off").stdout)["pid"])
    try:
        again = deployer(folder, "--version", DEPLOYER_DAEMON="auto")
        assert again.returncode == 0 and "deployer, version" in again.stdout
        assert served(folder) == 1
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_caller_with_another_module_path_or_nice_runs_on_its_own_and_the_daemon_stays(
        started: int, folder: Path, tmp_path: Path) -> None:
    before = served(folder)
    other = deployer(folder, "--version", PYTHONPATH=str(tmp_path))
    assert other.returncode == 0 and "deployer, version" in other.stdout
    niced = subprocess.run([sys.executable, "-m", "deployer", "--version"], env=env_for(folder), cwd="/",
                           capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.nice(3))
    assert niced.returncode == 0 and "deployer, version" in niced.stdout
    assert served(folder) == before  # neither was the daemon's to run: a fork would have had its path and nice
    assert not gone(started)
    assert deployer(folder, "--version").returncode == 0 and served(folder) == before + 1


def test_daemon_commands_run_on_their_own_and_a_relative_dir_or_a_race_still_starts_one(
        folder: Path, tmp_path: Path) -> None:
    bad = deployer(folder, "daemon", "start", "--idle", "inf")
    assert bad.returncode == 2 and "--idle" in bad.stderr
    starts = [subprocess.Popen([sys.executable, "-m", "deployer", "daemon", "start", "--json", "--dir", "rel"],
                               env=env_for(folder), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for _ in range(2)]
    answers = [p.communicate(timeout=120) for p in starts]
    pids = set()
    try:
        assert [p.returncode for p in starts] == [0, 0], answers
        pids = {int(json.loads(out)["pid"]) for out, _ in answers}
        assert len(pids) == 1  # one daemon, both starts content
        assert sorted(json.loads(out)["started_now"] for out, _ in answers) == [False, True]
        status = subprocess.run([sys.executable, "-m", "deployer", "daemon", "status", "--json", "--dir", "rel"],
                                env=env_for(folder), cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert json.loads(status.stdout)["served"] == 0  # start and status ran on their own
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_daemon_of_other_code_exits_and_the_command_runs_on_its_own(folder: Path, tmp_path: Path) -> None:
    extra = tmp_path / "site"
    extra.mkdir()
    pythonpath = os.pathsep.join([str(extra), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = deployer(folder, "daemon", "start", "--json", PYTHONPATH=pythonpath)
    assert done.returncode == 0, done.stderr
    pid = int(json.loads(done.stdout)["pid"])
    try:
        (extra / "installed.py").write_text("")  # a package installed on the module path: the folder changes
        version = deployer(folder, "--version", PYTHONPATH=pythonpath)
        assert version.returncode == 0 and "deployer, version" in version.stdout
        wait_for(lambda: gone(pid), "the out-of-date daemon exited", 30)
        assert "differs from what this daemon imported" in next(folder.glob("*.log")).read_text()
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_folder_others_can_enter_gets_no_daemon(started: int, folder: Path) -> None:
    folder.chmod(0o755)
    try:
        status = deployer(folder, "daemon", "status")
        assert status.returncode == 1  # the socket is there, and not trusted
        assert "no daemon can live there" in status.stderr and "open to others" in status.stderr
        start = deployer(folder, "daemon", "start")
        assert start.returncode == 1
        assert "open to others (mode 0755; it must be 0700)" in start.stderr
        assert deployer(folder, "--version").returncode == 0  # commands run as ever
    finally:
        folder.chmod(0o700)
    assert not gone(started)


def test_stop_ends_the_daemon_and_status_says_none_runs(started: int, folder: Path) -> None:
    stopped = deployer(folder, "daemon", "stop")
    assert stopped.returncode == 0 and f"pid {started} stopped" in stopped.stdout
    assert within(lambda: gone(started), 30)
    status = deployer(folder, "daemon", "status")
    assert status.returncode == 3 and "no deployer daemon runs" in status.stdout
    assert not list(folder.glob("*.sock"))  # it took its socket with it


def test_an_idle_daemon_exits(folder: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", PROBE_DAEMON, str(folder), "0.5"], env=env_for(folder),
                            stderr=subprocess.PIPE, cwd="/")
    try:
        proc.wait(timeout=30)
        assert proc.stderr is not None and b"idle for" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
