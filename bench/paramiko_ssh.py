"""The paramiko connection the bench's one-process clients open (agent_sketch.py, paramiko_floor.py):
to 127.0.0.1:PORT as USER with one key, the host key pinned in KNOWN_HOSTS (an unknown key is refused),
never an agent or the user's own keys."""

from __future__ import annotations

import paramiko

TIMEOUT_S = 30


def connect(port: str, user: str, identity: str, known_hosts: str) -> paramiko.SSHClient:
    ssh = paramiko.SSHClient()
    ssh.load_host_keys(known_hosts)
    ssh.set_missing_host_key_policy(paramiko.RejectPolicy())
    ssh.connect("127.0.0.1", port=int(port), username=user, key_filename=identity, look_for_keys=False,
                allow_agent=False, timeout=TIMEOUT_S)
    return ssh


def session(ssh: paramiko.SSHClient) -> paramiko.Channel:
    """A new session channel on ssh's transport."""
    transport = ssh.get_transport()
    assert transport is not None
    return transport.open_session(timeout=TIMEOUT_S)
