"""A config this machine checked before: its apply connects before loading it again (transport/early.py), and
still runs nothing on the host until this process's own checks pass."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git
from fixtures_ssh import SSHD, running_sshd
from polling import within
from pydantic import TypeAdapter

from deployer.command import Masker
from deployer.config.models import AnyHost, SshHost
from deployer.sources import code_stamp
from deployer.steps.context import EventBus
from deployer.transport.early import KnownGood, records_dir
from deployer.transport.factory import Opening
from deployer.transport.ssh.params import SshParams


def connected(project: Project) -> dict[str, Any]:
    event: dict[str, Any] = next(e for e in project.events() if e["type"] == "connected")
    return event


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_checked_config_connects_early_and_its_agent_starts_once_checked_again(target: Project, sshd: SSHD
                                                                                  ) -> None:
    before = len(sshd.sudo_calls())
    target.write_inventory(become=True)
    target.playbook()
    first = target.deployer("apply", "fix.yaml", "--host", "box")
    assert first.returncode == 0, first.stderr
    assert "opened" not in connected(target)["transport"]["extra"]  # nothing known yet: it connected after loading
    git(target.repo, "reset", "-q", "--hard", "HEAD~1")  # the same fix, to apply again

    second = target.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 0, second.stderr
    assert connected(target)["transport"]["extra"]["opened"] == "early"
    assert target.file("pkg/a.py") == FIXED_A
    assert "agent" not in connected(target)["transport"]["extra"]  # under sudo: started once checked, not ahead
    assert known_good_records()[-1]["agent"] == "on-release"
    calls = sshd.sudo_calls()[before:]
    assert len(calls) == 2, calls  # one agent each, under sudo: the early login started one too, once released


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_without_become_a_checked_configs_agent_starts_right_behind_its_login(target: Project, sshd: SSHD) -> None:
    target.write_inventory()
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    assert known_good_records()[-1]["agent"] == "ahead"  # the login's user, on the host itself
    git(target.repo, "reset", "-q", "--hard", "HEAD~1")

    second = target.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 0, second.stderr
    extra = connected(target)["transport"]["extra"]
    assert extra["opened"] == "early" and extra["agent"] == "ahead"
    assert target.file("pkg/a.py") == FIXED_A
    assert within(lambda: not agents_of(sshd), 10), "the run's agent outlived its run"


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_config_that_no_longer_passes_runs_nothing_on_an_early_connection(target: Project, sshd: SSHD) -> None:
    # What the key leaves out (the bytes a playbook ships) fails after the early login: nothing may run.
    target.write_inventory(become=True)
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    git(target.repo, "reset", "-q", "--hard", "HEAD~1")
    sudo_before = sshd.sudo_calls()
    log_before = len(sshd.log())
    refused_once(target, lambda: until_logged(sshd, log_before, "Accepted publickey"))  # the early login is in ...
    assert "Starting session" not in sshd.log()[log_before:]  # ... and no command, not even the agent, ran
    assert sshd.sudo_calls() == sudo_before
    assert target.file("pkg/a.py") == ORIGINAL_A


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_an_agent_gone_ahead_for_a_config_that_no_longer_passes_runs_nothing_and_exits(target: Project,
                                                                                       sshd: SSHD) -> None:
    target.playbook()
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    git(target.repo, "reset", "-q", "--hard", "HEAD~1")
    head, log_before = git(target.repo, "rev-parse", "HEAD"), len(sshd.log())

    def gone_ahead() -> None:
        until_logged(sshd, log_before, "Starting session")
        assert within(lambda: bool(agents_of(sshd)), 10), "no agent went ahead"
    refused_once(target, gone_ahead)
    assert within(lambda: not agents_of(sshd), 10), "the agent that went ahead never exited"
    assert target.file("pkg/a.py") == ORIGINAL_A  # nothing of the run: not its lock, not a file, not a commit
    assert not (target.repo / ".git" / "deployer.run.lock").exists()
    assert git(target.repo, "rev-parse", "HEAD") == head
    assert git(target.repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_an_opening_whose_agent_went_ahead_never_fits_a_host_in_a_container(target: Project, sshd: SSHD) -> None:
    # A record is this machine's file, and still input: one that says "ahead" of a host whose agent runs in its
    # container would have run that agent on the host. The opening is dropped; the run opens anew.
    host = TypeAdapter(AnyHost).validate_python(target.host)
    boxed = TypeAdapter(AnyHost).validate_python({**target.host, "container": {"engine": "podman", "name": "box"}})
    opening = Opening.early("box", SshParams.of("box", host), agent_ahead=True)
    try:
        assert opening.fits("box", host)
        assert not opening.fits("box", boxed)
    finally:
        opening.discard()
    assert within(lambda: not agents_of(sshd), 10), "the dropped opening's agent never exited"
    become = Opening.early("box", SshParams.of("box", TypeAdapter(AnyHost).validate_python(
        {**target.host, "become": True})), agent_ahead=True)
    become.discard()
    assert not become.agent_ahead  # a sudo is never asked for ahead, whatever a record says


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_changed_config_is_not_known_good_and_never_connects_before_its_checks(target: Project) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        target.write_inventory(port=listener.getsockname()[1], connect_timeout_s=0.5)
        target.playbook(steps=["local_compile", "upload"])
        # Its checks pass (so it is recorded), then the connection to a port that never speaks SSH times out.
        timed_out = target.deployer("apply", "fix.yaml", "--host", "box")
        assert timed_out.returncode != 0 and "within" in timed_out.stderr, timed_out.stderr
        listener.accept()[0].close()
        target.playbook(steps=["local_compile", "upload", {"drain": {"metric": "g", "to": 0, "within_s": 5}}])
        result = target.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 2, result.stderr
        assert "no metrics URL: set `metrics` on host box" in result.stderr
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # the playbook's bytes changed: no record, no connection
            listener.accept()
    finally:
        listener.close()
    assert target.file("pkg/a.py") == ORIGINAL_A


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_an_early_opening_starts_no_agent_until_released_and_closes_unused_when_dropped(target: Project,
                                                                                        sshd: SSHD) -> None:
    host = TypeAdapter(AnyHost).validate_python({**target.host, "become": True})
    params = SshParams.of("box", host)
    sudo_before = sshd.sudo_calls()

    log_before = len(sshd.log())
    dropped = Opening.early("box", params)
    until_logged(sshd, log_before, "Accepted publickey")  # logged in, and now waiting for its release ...
    dropped.discard()
    closed = until_logged(sshd, log_before, CLOSED)  # ... closed by it, unused
    assert "Starting session" not in closed
    assert sshd.sudo_calls() == sudo_before

    log_before = len(sshd.log())
    released = Opening.early("box", params)
    until_logged(sshd, log_before, "Accepted publickey")
    assert "Starting session" not in sshd.log()[log_before:]
    released.release(host)
    transport = released(EventBus(Masker(), "box"))
    try:
        assert transport.info.extra["opened"] == "early"
        assert transport.run(["id", "-u"]).out.strip() == "0"  # under the fake sudo: the host's become held
        assert "Starting session" in sshd.log()[log_before:]
        assert len(sshd.sudo_calls()[len(sudo_before):]) == 1
    finally:
        transport.close()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_an_early_opening_opens_its_agents_channel_while_it_waits_and_runs_it_once_released(
        target: Project) -> None:
    # A session channel runs nothing until its exec: opened before the release, its round trip is off the agent's.
    with running_sshd(log_level="DEBUG1") as debug:
        host = TypeAdapter(AnyHost).validate_python({**target.host, "port": debug.port,
                                                     "identity_file": debug.client_key,
                                                     "known_hosts": debug.known_hosts})
        opening = Opening.early("box", SshParams.of("box", host))
        try:
            waiting = until_logged(debug, 0, r"server_input_channel_open: ctype session")
            assert "Starting session" not in waiting and "Accepted publickey" in waiting
            opening.release(host)
            transport = opening(EventBus(Masker(), "box"))
            assert transport.run(["echo", "ran"]).out == "ran\n"
            ran = debug.log()
            assert ran.count("server_input_channel_open: ctype session") == 1  # the agent's was the one ahead
            assert "Starting session" in ran
            transport.close()
        finally:
            opening.discard()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_an_opening_discarded_while_it_connects_is_closed_once_it_has(target: Project, sshd: SSHD) -> None:
    host = TypeAdapter(AnyHost).validate_python(target.host)
    log_before = len(sshd.log())
    opening = Opening.of("box", host)
    opening.discard()  # the run's set-up failed at once: the handshake has not even begun
    until_logged(sshd, log_before, "Starting session")  # its agent started all the same ...
    until_logged(sshd, log_before, CLOSED)  # ... and the thread, seeing the discard, closed it


# How sshd logs a client's end of an authenticated connection (a close, or the reset of one), or its own end of it:
# the discard kills the agent's session, and the client's EOF on that channel may cross sshd's close of it, which
# sshd answers with "Disconnecting user ...: ieof packet referred to nonexistent channel 0" (a full run, once).
CLOSED = (r"^(?:Disconnected from user|Disconnecting user|Received disconnect from|Read error from remote host"
          r"|Connection (?:closed|reset))")


def refused_once(target: Project, reached: Callable[[], object]) -> None:
    """An apply whose fix turns out binary only once `reached` returns (its file a FIFO, fed then): the check
    that reads it fails after whatever the apply did first, exit 2."""
    source = target.root / "fix" / "a.py"
    source.unlink()
    os.mkfifo(source)
    applying = target.popen("apply", "fix.yaml", "--host", "box")
    try:
        reached()
        feed_fifo(source, b"def answer():\n    return 42\x00\n")  # a NUL byte: not a text file
        _, stderr = applying.communicate(timeout=60)
    finally:
        applying.kill()
        applying.wait()
    assert applying.returncode == 2, stderr
    assert "is a binary file" in stderr


def feed_fifo(path: Path, data: bytes) -> None:
    """data written into the FIFO at path once a reader opens it (within 10 s), then its end."""
    opened: list[int] = []

    def reader_there() -> bool:
        try:
            opened.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO until the reader has it open; anything else is the test's fault
                raise
            return False
        return True

    assert within(reader_there, 10), f"no reader opened {path} within 10 s"
    fd = opened[0]
    try:
        os.set_blocking(fd, True)
        os.write(fd, data)
    finally:
        os.close(fd)


def agents_of(sshd: SSHD) -> list[int]:
    """The agents running under sshd now (its sessions' descendants whose command line is the bootstrap's)."""
    found = []
    for pid in sshd.session_pids():
        with contextlib.suppress(OSError):
            if b"deployer agent: source cut short" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def known_good_records() -> list[dict[str, Any]]:
    """The session's known-good records (conftest's own_cache), oldest first: the newest is this test's last."""
    paths = sorted(records_dir().glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    return [json.loads(p.read_text()) for p in paths]


def until_logged(sshd: SSHD, start: int, line: str) -> str:
    """sshd's log since offset start, once a line of it matches (within 10 s)."""
    deadline = time.monotonic() + 10
    while not re.search(line, since := sshd.log()[start:], re.M):
        assert time.monotonic() < deadline, f"sshd never logged {line!r}:\n{since}"
        time.sleep(0.02)
    return since


def keyed(tmp_path: Path, **change: Any) -> str | None:
    """The key of an apply in tmp_path, with one input changed."""
    options = {"playbook": "fix.yaml", "host_name": "box", "limit": None, **change.pop("options", {})}
    known = KnownGood.of(options, str(tmp_path / "fix.yaml"), str(tmp_path / "hosts.yaml"))
    return None if known is None else known.key


def test_the_key_changes_with_everything_the_checks_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  box: {env: {TOKEN: {value_from_env: API_TOKEN}}}\n")
    (tmp_path / "fix.yaml").write_text("name: fix\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("API_TOKEN", "one")
    monkeypatch.setenv("UNRELATED", "one")
    base = keyed(tmp_path)
    assert base is not None and keyed(tmp_path) == base
    monkeypatch.setenv("UNRELATED", "two")  # not named by the inventory
    assert keyed(tmp_path) == base
    monkeypatch.setenv("API_TOKEN", "two")  # named: its value decides a check
    changed = {keyed(tmp_path)}
    monkeypatch.setenv("API_TOKEN", "one")
    monkeypatch.setenv("DEPLOYER_RUNS_DIR", str(tmp_path / "runs"))
    changed.add(keyed(tmp_path))
    monkeypatch.delenv("DEPLOYER_RUNS_DIR")
    changed.add(keyed(tmp_path, options={"limit": "box"}))
    (tmp_path / "fix.yaml").write_text("name: fix 2\n")
    changed.add(keyed(tmp_path))
    (tmp_path / "fix.yaml").write_text("name: fix\n")
    (tmp_path / "hosts.yaml").write_text("hosts:\n  box: {env: {TOKEN: {value_from_env: API_TOKEN}}}\n\n")
    changed.add(keyed(tmp_path))
    (tmp_path / "hosts.yaml").write_text("hosts:\n  box: {env: {TOKEN: {value_from_env: API_TOKEN}}}\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    changed.add(keyed(tmp_path))
    assert len(changed) == 6 and base not in changed
    (tmp_path / "fix.yaml").unlink()
    assert keyed(tmp_path) is None  # its load says why


def test_an_edit_of_deployer_itself_changes_the_stamp(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    module = tmp_path / "pkg" / "sub" / "m.py"
    module.write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "sub" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"")
    stamp = code_stamp(tmp_path / "pkg")
    assert [entry[0] for entry in stamp] == [os.path.join("sub", "m.py")]
    module.write_text("x = 2\n")
    os.utime(module, ns=(1, 1))
    assert code_stamp(tmp_path / "pkg") != stamp


PARAMS = {"address": "10.0.0.1", "port": 22, "user": "root", "identity_file": None, "known_hosts": None,
          "ssh_config": None, "host_key_policy": "reject", "connect_timeout_s": 10.0, "become": False,
          "python": "python3"}


@pytest.mark.parametrize("change", [{"port": True}, {"port": 0}, {"port": "22"}, {"address": ""},
                                    {"become": 1}, {"user": 5}, {"host_key_policy": "accept-all"},
                                    {"connect_timeout_s": 0}, {"connect_timeout_s": 10 ** 400},
                                    {"connect_timeout_s": float("inf")}, {"connect_timeout_s": float("nan")},
                                    {"extra": "x"}])
def test_a_record_that_is_not_one_opens_nothing(change: dict[str, Any]) -> None:
    assert SshParams.from_document(PARAMS) == SshParams(**PARAMS)  # type: ignore[arg-type]
    assert SshParams.from_document({**PARAMS, **change}) is None


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"host": "box"}', b'{"host": "a\\u001b[2J", "ssh": PARAMS}',
                                  b'{"host": "box", "ssh": PARAMS_ACCEPT}', b"[" * 5000 + b"]" * 5000,
                                  b'{"host": "box", "ssh": PARAMS, "pad": "' + b"x" * 20_000 + b'"}'],
                         ids=["cut", "a list", "no params", "escapes", "accept-new", "too deep", "too long"])
def test_a_spoiled_record_is_no_record(tmp_path: Path, body: bytes) -> None:
    known = KnownGood(tmp_path, "k" * 64)
    accept = {**PARAMS, "host_key_policy": "accept-new"}  # a first login pins a key: never early
    known.path.write_bytes(body.replace(b"PARAMS_ACCEPT", json.dumps(accept).encode())
                           .replace(b"PARAMS", json.dumps(PARAMS).encode()))
    assert known.opening() is None


def test_a_fifo_in_place_of_a_record_is_no_record(tmp_path: Path) -> None:
    known = KnownGood(tmp_path, "f" * 64)
    os.mkfifo(known.path)  # a read would block on it, for ever
    assert known.opening() is None


def test_the_records_are_this_users_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert records_dir() == tmp_path / "deployer" / "known-good"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert records_dir() == Path.home() / ".cache" / "deployer" / "known-good"


def test_a_link_planted_at_the_records_temp_name_is_not_written_through(tmp_path: Path) -> None:
    known = KnownGood(tmp_path / "records", "d" * 64)
    known.records.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("kept")
    (known.records / f".{known.key}.{os.getpid()}.tmp").symlink_to(victim)
    host = SshHost.model_validate({"transport": "ssh", "address": "10.0.0.1", "repo": "/srv/r", "user": "u"})
    known.record("box", host)
    assert victim.read_text() == "kept"
    assert json.loads(known.path.read_text())["host"] == "box"
    assert [p.name for p in known.records.iterdir()] == [known.path.name]
