"""The wire between deployer and its target: the lock, bounded output, masked tails, timeouts, restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, target_python
from fixtures_services import Stack
from fixtures_ssh import SSHD, CountingProxy, connect
from polling import wait_for

from deployer.agent.protocol import Captured
from deployer.demo.run import http_status
from deployer.errors import OutputTruncated, TransportError
from deployer.transport.base import CAPTURE_BYTES, Transport
from deployer.transport.local import LocalTransport

TTL_S = 5


def remote_bin(project: Project, request: pytest.FixtureRequest) -> Path:
    """A directory first on the PATH of commands deployer runs on the target, for gates."""
    if project.host["transport"] == "ssh":
        return Path(request.getfixturevalue("sshd").workdir) / "fakebin"
    gates = project.root / "gatebin"
    gates.mkdir(exist_ok=True)
    project.extra_env["PATH"] = f"{gates}{os.pathsep}{os.environ['PATH']}"
    return gates


@contextlib.contextmanager
def gate(project: Project, request: pytest.FixtureRequest, program: str, match: str) -> Iterator[Path]:
    """Replace `program` on the target by one that, while `armed` exists, parks (writing its pid) when
    its arguments contain `match`; otherwise it runs the real program. Yields the gate directory."""
    bindir = remote_bin(project, request)
    gatedir = project.root / f"gate-{program}"
    gatedir.mkdir()
    (gatedir / "armed").touch()
    real = f"/bin/{program}" if os.path.exists(f"/bin/{program}") else f"/usr/bin/{program}"
    fake = bindir / program
    fake.write_text(f"""#!/bin/sh
case "$*" in *{match}*) if [ -e {gatedir}/armed ]; then
  echo $$ > {gatedir}/pid.tmp && /bin/mv {gatedir}/pid.tmp {gatedir}/pid; exec sleep 600; fi;; esac
exec {real} "$@"
""")
    fake.chmod(0o755)
    try:
        yield gatedir
    finally:
        fake.unlink()
        pid_file = gatedir / "pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


# -- the lock -------------------------------------------------------------------------------------------

def test_a_lock_whose_info_is_not_written_yet_is_being_taken_never_stale(target: Project) -> None:
    ttl = 60
    target.write_inventory(lock_ttl_s=ttl)
    target.playbook()
    # What an older deployer leaves for a moment between its mkdir and writing info.json; made half a TTL
    # ago: old enough to have an age without waiting on the clock, and still not stale.
    lock = target.repo / ".git" / "deployer.run.lock"
    lock.mkdir()
    young = time.time() - ttl / 2
    os.utime(lock, (young, young))
    status = target.deployer("lock", "status", "--host", "box")
    assert status.returncode == 3 and "being taken" in status.stdout
    assert "STALE" not in status.stdout and "--force" not in status.stdout
    second = target.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 3 and "being taken" in second.stderr
    assert "STALE" not in second.stderr and "--force" not in second.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A


def test_staleness_counts_from_the_locks_own_mtime_plus_its_ttl(target: Project) -> None:
    target.write_inventory(lock_ttl_s=TTL_S)
    lock = target.repo / ".git" / "deployer.run.lock"
    lock.mkdir()
    # A complete lock without a heartbeat file yet: young by its own mtime, so alive.
    (lock / "info.json").write_text(json.dumps({"run_id": "R1", "operator": "op", "pid": 1, "ttl_s": TTL_S}))
    fresh = target.deployer("lock", "status", "--host", "box")
    assert fresh.returncode == 3 and "held by run R1" in fresh.stdout and "STALE" not in fresh.stdout
    old = time.time() - 3 * TTL_S
    os.utime(lock, (old, old))
    aged = target.deployer("lock", "status", "--host", "box")
    assert aged.returncode == 3 and "STALE" in aged.stdout
    (lock / "info.json").unlink()
    os.utime(lock, (old, old))
    abandoned = target.deployer("lock", "status", "--host", "box")
    assert "being taken" in abandoned.stdout and "STALE" in abandoned.stdout


def test_a_run_cut_while_taking_the_lock_leaves_no_lock_and_a_stray_the_next_run_removes(
        target: Project, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Cut between writing the lock and publishing it: locally a SIGKILL of deployer, over SSH the
    TCP link itself (a relay that cuts); the target side dies with it in both cases."""
    target.playbook()
    git_dir = target.repo / ".git"
    with contextlib.ExitStack() as stack, gate(target, request, "ln", "deployer.run.lock.") as gatedir:
        relay = None
        if target.host["transport"] == "ssh":
            relay = stack.enter_context(relayed(request.getfixturevalue("sshd"), tmp_path, after=1 << 40))
            target.write_inventory(port=relay.port, known_hosts=str(tmp_path / "relay_known_hosts"))
        first = target.popen("apply", "fix.yaml", "--host", "box")
        try:
            wait_for(lambda: (gatedir / "pid").exists(), seconds=30,
                     what="the run to reach the link that publishes its lock")
        finally:
            if relay is None:
                first.kill()  # SIGKILL: the deployer dies between writing its lock and publishing it
            else:
                relay.close()  # the connection is cut at that moment
            _, err = first.communicate(timeout=60)
        if relay is not None:
            assert "cut while taking the deploy lock" in err, err
            assert "the target holds either no lock or this run's complete lock" in err
            # The chain up to the commit went behind the take: whether it ran is recover's to read (it did not).
            assert first.returncode == 6 and "its premise's answer was lost" in err, err
        # And the target side with it: the agent, its client gone, kills the parked lock script's whole group.
        parked = int((gatedir / "pid").read_text())
        wait_for(lambda: not os.path.exists(f"/proc/{parked}") or
                 Path(f"/proc/{parked}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z",
                 seconds=30, what="the parked lock command to die with its run")
        (gatedir / "armed").unlink()
    target.write_inventory()
    assert not os.path.lexists(git_dir / "deployer.run.lock")
    [stray] = [p for p in git_dir.iterdir() if p.name.startswith("deployer.run.lock.")]
    assert json.loads((stray / "info.json").read_text())["run_id"] == stray.name.removeprefix("deployer.run.lock.")
    status = target.deployer("lock", "status", "--host", "box")
    assert status.returncode == 0 and "unlocked" in status.stdout
    assert str(stray) in status.stdout and "the next run that takes the lock removes it" in status.stdout
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stderr
    assert target.file("pkg/a.py") == FIXED_A
    assert not [p for p in git_dir.iterdir() if p.name.startswith("deployer.run.lock")]
    run_id = sorted(target.runs.iterdir())[-1].name
    [acquired] = [e for e in target.events(run_id) if e["type"] == "lock_acquired"]
    assert acquired["removed_strays"] == [str(stray)]


# -- output: bounded while it streams, whole when a caller needs it --------------------------------------

MiB = 1 << 20
# Run in a fresh interpreter so the peak RSS measured is this command's alone.
RSS_PROBE = """
import json, resource, sys
spec = json.loads(sys.argv[1])
if spec["kind"] == "local":
    from deployer.transport.local import LocalTransport
    transport = LocalTransport()
else:
    from deployer.transport.ssh.transport import SSHTransport
    transport = SSHTransport(**spec["ssh"])
transport.run(["true"], timeout=30)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = transport.run(["sh", "-c", spec["script"]], timeout=300)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_kib": after - before, "ok": result.ok,
                  "totals": [result.out_stream.total, result.err_stream.total],
                  "kept": [len(result.out_stream.kept), len(result.err_stream.kept)]}))
"""


def transport_spec(kind: str, request: pytest.FixtureRequest) -> dict[str, object]:
    if kind == "local":
        return {"kind": "local"}
    sshd = request.getfixturevalue("sshd")
    return {"kind": "ssh", "ssh": {"name": "probe", "address": sshd.host, "port": sshd.port, "user": sshd.user,
                                   "identity_file": sshd.client_key, "known_hosts": sshd.known_hosts,
                                   "ssh_config": os.devnull, "connect_timeout": 10.0}}


@pytest.fixture(params=["local", "ssh"])
def transport(request: pytest.FixtureRequest) -> Iterator[Transport]:
    if request.param == "local":
        yield LocalTransport()
        return
    with connect(request.getfixturevalue("sshd")) as ssh:
        yield ssh


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_memory_stays_bounded_whatever_a_command_prints(kind: str, request: pytest.FixtureRequest) -> None:
    # 200 MB: 160 MB on stdout and 40 MB on stderr at once, both drained.
    script = "head -c 41943040 /dev/zero >&2 & head -c 167772160 /dev/zero; wait"
    probe = subprocess.run([sys.executable, "-c", RSS_PROBE, json.dumps({**transport_spec(kind, request),
                                                                          "script": script})],
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["ok"] and seen["totals"] == [160 * MiB, 40 * MiB]
    assert seen["kept"] == [CAPTURE_BYTES, CAPTURE_BYTES]
    assert seen["grew_kib"] < 100 * 1024, f"peak RSS grew by {seen['grew_kib'] // 1024} MiB"


def test_whole_output_beyond_the_capture_limit_is_an_error_or_asked_for(transport: Transport) -> None:
    script = f"head -c {CAPTURE_BYTES + 10} /dev/zero; printf end"
    cut = transport.run(["sh", "-c", script], timeout=60)
    assert cut.ok and cut.out_stream.total == CAPTURE_BYTES + 13
    assert cut.out_stream.kept.endswith(b"end") and len(cut.out_stream.kept) == CAPTURE_BYTES
    with pytest.raises(OutputTruncated, match=f"printed {CAPTURE_BYTES + 13} bytes on stdout"):
        _ = cut.stdout
    with pytest.raises(OutputTruncated):
        _ = cut.out
    whole = transport.run(["sh", "-c", script], timeout=60, capture=None)
    assert whole.stdout == b"\0" * (CAPTURE_BYTES + 10) + b"end"
    small = transport.run(["sh", "-c", "printf 0123456789; printf abcdef >&2"], timeout=30, capture=4)
    assert small.out_stream == Captured(b"6789", 10) and small.err == "[first 2 bytes not kept] cdef"


# -- secrets: masked before any cut ----------------------------------------------------------------------

SECRET = "sk_live_4f9Q2mZx7LpR8vWc3T"
assert len(SECRET) == 26


def fragments(secret: str, size: int = 6) -> set[str]:
    return {secret[i:i + size] for i in range(len(secret) - size + 1)}


def assert_no_fragment(texts: list[str], runs: Path) -> None:
    seen = list(texts) + [p.read_text(errors="replace") for p in runs.rglob("*") if p.is_file()]
    leaks = sorted({f for f in fragments(SECRET) for text in seen if f in text})
    assert not leaks, f"fragments of the secret leaked: {leaks}"


def straddling(*cuts: int) -> str:
    """Text whose last `cut` characters begin halfway through a copy of SECRET, for each cut."""
    text = ""
    for cut in sorted(cuts):
        filler = cut - len(SECRET) // 2 - len(text)
        text = SECRET + "y" * filler + text
    return "lead " + text


def test_output_tails_cut_inside_a_secret_leak_no_fragment_of_it(target: Project) -> None:
    # 1000: the stdout and stderr tails of a command's run-log event; 1500: a failed step's stderr tail.
    printed = straddling(1000, 1500)
    assert printed[-1000 - 13:-1000 + 13] == SECRET and printed[-1500 - 13:-1500 + 13] == SECRET
    leaky = target_python(target, f"printf %s '{printed}'\nprintf %s '{printed}' >&2", then="exit 1")
    target.write_inventory(python=leaky, env={"API_KEY": {"secret": True, "value": SECRET}})
    target.playbook(steps=["upload", "remote_compile"])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1 and "remote_compile" in result.stderr and "***" in result.stderr
    assert_no_fragment([result.stdout, result.stderr], target.runs)
    assert target.file("pkg/a.py") == ORIGINAL_A


def test_a_service_log_tail_cut_inside_a_secret_leaks_no_fragment_of_it(stack: Stack) -> None:
    project = stack.project
    # The log tail is the last 3000 bytes of the log: print the secret across that edge, then die.
    leaky = {"start": [sys.executable, "-c", f"import sys; sys.stdout.write({straddling(3000)!r}); sys.exit(3)"],
             "env": {"HF_TOKEN": {"secret": True, "value": SECRET}}, "health": "http://127.0.0.1:9/health"}
    stack.configure(prefill=leaky)
    project.playbook(steps=["co_restart"])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode != 0 and "service prefill" in result.stderr and "lead" not in result.stderr
    assert "yyy" in result.stderr  # the log tail is shown ...
    assert_no_fragment([result.stdout, result.stderr], project.runs)  # ... without any of the secret


def test_a_service_log_is_private_to_its_owner(stack: Stack) -> None:
    project = stack.project
    logs = project.repo / ".git" / "deployer"
    logs.mkdir()
    (logs / "decode.log").write_text("from an older deployer\n")
    (logs / "decode.log").chmod(0o644)
    project.playbook(steps=["co_restart"])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    for name in ("prefill", "decode"):
        assert (logs / f"{name}.log").stat().st_mode & 0o777 == 0o600, name
    # Only the log was narrowed: the service itself keeps the umask it was started with.
    ours = os.umask(0o022)
    os.umask(ours)
    status = Path(f"/proc/{stack.pids()['prefill']}/status").read_text()
    assert f"Umask:\t{ours:04o}" in status


# -- co_restart reports what it saw ----------------------------------------------------------------------

def stopped_events(project: Project) -> dict[str, dict[str, object]]:
    run_id = sorted(project.runs.iterdir())[-1].name
    return {str(e["service"]): e for e in project.events(run_id) if e["type"] == "service_stopped"}


def test_co_restart_reports_the_observed_state_and_a_missing_pid_as_none(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=["co_restart"])
    first = project.deployer("apply", "fix.yaml", "--host", "box")
    assert first.returncode == 0, first.stderr
    assert "None" not in first.stdout and "(none) -> " in first.stdout
    seen = stopped_events(project)
    assert seen["prefill"]["pid_alive"] is False and seen["prefill"]["health_answering"] is False
    assert seen["prefill"]["seen"] == "no live pid, health not answering"
    pids = stack.pids()
    second = project.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 0, second.stderr
    seen = stopped_events(project)
    assert seen["decode"]["seen"] == f"pid {pids['decode']} alive, health answering"
    assert seen["decode"]["pid_alive"] is True and seen["decode"]["health_answering"] is True
    assert f"was pid {pids['decode']} alive, health answering" in second.stdout


def test_a_service_answering_without_a_pid_deployer_knows_is_reported_as_answering(stack: Stack) -> None:
    project = stack.project
    outsider = subprocess.Popen(stack.service("prefill")["start"], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: http_status(stack.service("prefill")["health"]) == 200, seconds=30,
                 what="the outside server")
        project.playbook(steps=["co_restart"])
        result = project.deployer("apply", "fix.yaml", "--host", "box")
        said = " ".join(result.stderr.split())
        assert result.returncode == 1 and "answers 200, but no process deployer started (or adopted) runs prefill" \
            in said, result.stderr
        assert "prefill" not in stopped_events(project)  # refused before the restart stopped anything
        checked = project.deployer("check", "--host", "box")
        row = next(line for line in checked.stdout.splitlines() if "service prefill" in line)
        assert "not running" not in row and 'add "adopt: port"' in " ".join(checked.stdout.split()), checked.stdout
    finally:
        outsider.kill()
        outsider.wait()


# -- every transport call takes its step's timeout -------------------------------------------------------

class FreezingRelay(CountingProxy):
    """A relay to sshd whose link freezes (no FIN, no RST: bytes are swallowed) once `after` bytes passed."""

    def __init__(self, target_port: int, after: int) -> None:
        self.after = after
        self.passed = 0
        super().__init__(target_port)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.passed += len(data)
                if self.passed > self.after:
                    self.freeze()
                if not self.frozen.is_set():
                    dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


@contextlib.contextmanager
def relayed(sshd: SSHD, tmp_path: Path, after: int) -> Iterator[FreezingRelay]:
    relay = FreezingRelay(sshd.port, after)
    (tmp_path / "relay_known_hosts").write_text(f"[127.0.0.1]:{relay.port} {sshd.host_pubkey_line}\n")
    try:
        yield relay
    finally:
        relay.close()


def test_ssh_put_and_get_on_a_frozen_link_fail_at_their_timeout(sshd: SSHD, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"before\n")
    for call in ("put", "get"):
        with relayed(sshd, tmp_path, after=1 << 40) as relay, \
                connect(sshd, port=relay.port, known_hosts=str(tmp_path / "relay_known_hosts"),
                        connect_timeout=2.0) as ssh:
            assert ssh.get(str(tmp_path / "f")) == b"before\n"  # the SFTP session is open
            relay.freeze()
            started = time.monotonic()
            with pytest.raises(TransportError, match=r"did not finish within 1\.5s"):
                if call == "put":
                    ssh.put(b"after\n", str(tmp_path / "f"), timeout=1.5)
                else:
                    ssh.get(str(tmp_path / "f"), timeout=1.5)
            # The call's own timeout, plus at most one connect_timeout spent trying to remove its temp file.
            assert time.monotonic() - started < 1.5 + 2.0 + 1.5, call
    assert (tmp_path / "f").read_bytes() == b"before\n"


def test_a_local_get_of_a_file_that_would_never_answer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer that never comes
    started = time.monotonic()
    with LocalTransport() as local, pytest.raises(TransportError, match=r"fifo is a other, not a regular file"):
        local.get(str(fifo), timeout=0.5)
    assert time.monotonic() - started < 3


def test_an_upload_on_a_frozen_link_fails_within_its_step_timeout(target: Project, tmp_path: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    if target.host["transport"] != "ssh":
        pytest.skip("a frozen link needs the relay in front of sshd")
    sshd = request.getfixturevalue("sshd")
    big = "# padding\n" * (3 << 19)  # 15 MiB: only the upload moves more than a MiB, so the freeze lands inside it
    target.write("fix/b.py", big)
    target.playbook(files=[{"src": "fix/b.py", "dest": "pkg/b.py"}], steps=[{"upload": {"timeout_s": 3}}])
    with relayed(sshd, tmp_path, after=1 << 20) as relay:
        target.write_inventory(port=relay.port, known_hosts=str(tmp_path / "relay_known_hosts"))
        proc = target.popen("apply", "fix.yaml", "--host", "box")
        try:
            def upload_ended() -> dict[str, object] | None:
                # A run dir is made before its log: poll until both are there.
                runs = sorted(target.runs.glob("*/events.jsonl")) if target.runs.exists() else []
                ends = [e for e in target.events(runs[-1].parent.name)
                        if e["type"] == "step_end" and e["step"] == "upload"] if runs else []
                return ends[0] if ends else None
            wait_for(upload_ended, seconds=40, what="the upload step to end")
        finally:
            proc.kill()  # what follows (restoring over the frozen link) is not this test's subject
            proc.communicate(timeout=30)
        assert relay.frozen.is_set()
    ended = upload_ended()
    assert ended is not None and ended["status"] == "failed"
    assert "did not finish within 3s" in str(ended["error"])
    duration = float(str(ended["duration_s"]))
    # The step's 3 s, plus at most the transport's 10 s connect_timeout spent trying to remove its temp file.
    assert duration < 3 + 10 + 2, duration
