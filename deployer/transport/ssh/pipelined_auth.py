"""A public-key login whose signed request goes right behind its service request, not after the answer.

paramiko asks for the ssh-userauth service and waits for the server's accept before it sends the signed
userauth request: a round trip of its own on every login (50 ms at 50 ms RTT). A server reads a connection's
messages in order: OpenSSH's sshd has accepted the service by the time it reads the request that follows, and
answers it as if it had come after the accept (tests/transport/test_ssh_login.py). What the request signs is known
once the key exchange is done (the session id) except, for an RSA key, the algorithm: paramiko picks it from
the server's server-sig-algs, in an EXT_INFO that may still be on its way. An RSA key whose server has not
named them yet goes the plain way. Everything else (failure, partial success, a banner, the next key) is
paramiko's own handling of the answers.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from deployer.transport.ssh.paramiko_lean import paramiko

_AuthHandler: Any = paramiko.auth_handler.AuthHandler  # its private half, which the stubs leave out


class _SentWithTheServiceRequest(_AuthHandler):  # type: ignore[misc]
    """paramiko's client AuthHandler, its answer to the service accept sent before the accept comes."""

    def _request_auth(self) -> None:
        super()._request_auth()
        accepted = paramiko.Message()  # the accept paramiko waits for, to build its answer from it now
        accepted.add_string("ssh-userauth")
        accepted.rewind()
        super()._parse_service_accept(accepted)

    def _parse_service_accept(self, m: paramiko.Message) -> None:
        m.get_text()  # the accept the request sent already counted on: nothing left to answer


class PipelinedAuthTransport(paramiko.Transport):
    """A client Transport (SSHClient's transport_factory) whose public-key logins take one round trip."""

    def auth_publickey(self, username: str, key: paramiko.PKey, event: threading.Event | None = None) -> Any:
        known = cast(Any, self)
        plain = event is not None or not known.active or not known.initial_kex_done or (
            "rsa" in key.get_name() and "server-sig-algs" not in known.server_extensions)
        if plain:
            return super().auth_publickey(username, key, event)
        done = threading.Event()
        self.auth_handler = handler = _SentWithTheServiceRequest(self)
        handler.auth_publickey(username, key, done)
        return handler.wait_for_response(done)
