"""The agent's exec, against the real OpenSSH server: sent on a channel opened ahead, its answer not waited for,
and each way it can fail to start said as that, not as an agent lost mid-run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fixtures_ssh import SSHD, CountingProxy, connect

from deployer.agent.client import NeverStarted
from deployer.transport.ssh.execchan import ExecPipe


def test_the_agent_starts_on_the_channel_opened_ahead(sshd: SSHD) -> None:
    transport = connect(sshd)
    try:
        transport.open_ahead()
        ahead = transport._ahead
        assert ahead is not None and ahead.active
        agent = transport.agent()
        agent.verified()
        assert transport._ahead is None
        assert agent._pipe._chan is ahead  # type: ignore[attr-defined]
        assert transport.run(["echo", "ran"]).stdout == b"ran\n"
    finally:
        transport.close()


def test_a_channel_opened_ahead_and_never_used_closes_with_the_connection(sshd: SSHD) -> None:
    transport = connect(sshd)
    transport.open_ahead()
    ahead = transport._ahead
    assert ahead is not None and ahead.active
    transport.close()
    assert ahead.closed


def test_an_exec_the_server_refuses_is_said_as_refused(sshd: SSHD) -> None:
    # sshd refuses a second exec on a channel that runs one already: a refusal it really sends.
    transport = connect(sshd)
    try:
        channel = transport._open_channel()
        channel.exec_command("sleep 30")
        pipe = ExecPipe(channel, "echo never", name="box", where=transport.target.where, timeout_s=5.0)
        with pytest.raises(NeverStarted, match=r"^box: could not start the agent: the SSH server at \S+ refused "
                                               r"the exec request$"):
            pipe.read(1024)
        assert transport._transport.is_active()  # a refusal is the channel's, not the connection's
    finally:
        transport.close()


def test_an_exec_left_unanswered_closes_the_connection_within_connect_timeout(sshd: SSHD, tmp_path: Path) -> None:
    proxy = CountingProxy(sshd.port)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_pubkey_line}\n")
    transport = connect(sshd, port=proxy.port, known_hosts=str(known_hosts), connect_timeout=0.5)
    try:
        channel = transport._open_channel()
        proxy.freeze()
        started = time.monotonic()
        pipe = ExecPipe(channel, "echo never", name="box", where=transport.target.where, timeout_s=0.5)
        with pytest.raises(NeverStarted, match=r"^box: could not start the agent: no answer to its exec from \S+ "
                                               r"within 0.5s$"):
            pipe.read(1024)
        assert time.monotonic() - started < 10
        assert not transport._transport.is_active()
    finally:
        transport.close()
        proxy.close()


def test_an_answered_exec_reads_its_output_and_its_end_as_an_end(sshd: SSHD) -> None:
    transport = connect(sshd)
    try:
        pipe = ExecPipe(transport._open_channel(), "printf started", name="box", where=transport.target.where,
                        timeout_s=5.0)
        out = b""
        while chunk := pipe.read(1024):
            out += chunk
        assert out == b"started"
        pipe.close()
    finally:
        transport.close()
