"""The public-key login against the real OpenSSH server: its signed request goes right behind the service request
(transport/ssh/pipelined_auth.py), and the server takes it; an RSA key, whose algorithm the server names, too."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_ssh import SSHD, connect

from deployer.errors import ConnectError
from deployer.transport.ssh import pipelined_auth
from deployer.transport.ssh.paramiko_lean import paramiko

SERVICE_REQUEST, USERAUTH_REQUEST = 5, 50  # RFC 4253/4252 message numbers


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str]]:
    """What the client sent (message numbers) and the server's service accept, each with the thread it was on."""
    seen: list[tuple[Any, str]] = []
    send = paramiko.Transport._send_message
    accept = pipelined_auth._SentWithTheServiceRequest._parse_service_accept

    def sending(self: paramiko.Transport, data: Any) -> None:
        seen.append((data.asbytes()[0], threading.current_thread().name))
        send(self, data)

    def accepted(self: Any, m: paramiko.Message) -> None:
        seen.append(("accept", threading.current_thread().name))
        accept(self, m)

    monkeypatch.setattr(paramiko.Transport, "_send_message", sending)
    monkeypatch.setattr(pipelined_auth._SentWithTheServiceRequest, "_parse_service_accept", accepted)
    return seen


def test_the_signed_request_goes_with_the_service_request_and_the_server_takes_it(
        sshd: SSHD, said: list[tuple[Any, str]]) -> None:
    transport = connect(sshd)
    try:
        assert transport.run(["echo", "in"]).stdout == b"in\n"
    finally:
        transport.close()
    # paramiko sends it from its own thread once the accept came (it answers the accept); here the thread that
    # asked for the login sends it, right behind the service request, and the accept is only taken in.
    here = threading.current_thread().name
    assert [who for what, who in said if what in (SERVICE_REQUEST, USERAUTH_REQUEST)] == [here, here], said
    assert [what for what, _ in said].count("accept") == 1 and [what for what, _ in said].count(USERAUTH_REQUEST) == 1


@pytest.fixture
def rsa_key(sshd: SSHD, tmp_path: Path) -> Iterator[str]:
    """An RSA client key that sshd's authorized_keys admits while the test runs."""
    key = tmp_path / "client_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(key)], check=True)
    authorized = Path(sshd.workdir) / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + (tmp_path / "client_rsa.pub").read_text())
    try:
        yield str(key)
    finally:
        authorized.write_text(before)


def test_an_rsa_key_logs_in_with_the_algorithm_the_server_names(sshd: SSHD, rsa_key: str) -> None:
    # OpenSSH refuses ssh-rsa (SHA-1) signatures: a request signed before server-sig-algs were known would fail.
    transport = connect(sshd, identity_file=rsa_key)
    try:
        assert transport.run(["echo", "in"]).stdout == b"in\n"
    finally:
        transport.close()


def test_a_key_the_server_does_not_admit_is_still_said_as_an_authentication_failure(sshd: SSHD,
                                                                                     tmp_path: Path) -> None:
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(ConnectError, match=r"(?i)auth"):
        connect(sshd, identity_file=str(key)).run(["true"])
