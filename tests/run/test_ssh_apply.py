"""What only the SSH transport has: one connection per run, host keys, through the whole CLI."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, target_python
from fixtures_services import GAUGE, Stack
from fixtures_ssh import SSHD, CountingProxy


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_one_apply_uses_exactly_one_tcp_connection(target: Project, sshd: SSHD, tmp_path: Path) -> None:
    stack = Stack(target)
    stack.configure()
    proxy = CountingProxy(sshd.port)
    known_hosts = tmp_path / "proxy_known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_pubkey_line}\n")
    try:
        target.write_inventory(port=proxy.port, known_hosts=str(known_hosts), services=target_services(stack),
                               metrics=f"http://127.0.0.1:{stack.ports['prefill']}/metrics")
        target.playbook(steps=["local_compile", "upload", "remote_compile", {"diff_bounds": {"files": 1}},
                               {"commit": {"message": "m"}}, "co_restart",
                               {"drain": {"metric": GAUGE, "to": 5, "interval_s": 0.2, "within_s": 10}}])
        result = target.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 0, result.stderr
        assert target.file("pkg/a.py") == FIXED_A
        commands = [e for e in target.events() if e["type"] == "command"]
        assert len(commands) > 10  # many commands, besides uploads, health checks and scrapes ...
        assert proxy.accepted == 1  # ... over one SSH connection
    finally:
        proxy.close()
        stack.kill_all()


def target_services(stack: Stack) -> dict[str, object]:
    return {"prefill": stack.service("prefill"), "decode": stack.service("decode")}


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_config_problem_stops_the_apply_before_anything_connects(target: Project) -> None:
    # The connection opens while the run sets up; a step that cannot run on this host must stop it first.
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        target.write_inventory(port=listener.getsockname()[1])
        target.playbook(steps=["local_compile", "upload", {"drain": {"metric": GAUGE, "to": 0, "within_s": 5}}])
        result = target.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 2, result.stderr
        assert "no metrics URL: set `metrics` on host box" in result.stderr
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # the kernel would hold even a closed connection for accept()
            listener.accept()
    finally:
        listener.close()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_unknown_host_key_exits_4_with_the_fingerprint_and_runs_nothing(target: Project, sshd: SSHD,
                                                                       tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    target.write_inventory(known_hosts=str(empty))
    target.playbook()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 4, result.stderr
    assert sshd.host_fingerprint in result.stderr and "accept-new" in result.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
    assert not [e for e in target.events() if e["type"] == "command"]
    assert empty.read_text() == ""

    pinned = target.deployer("apply", "fix.yaml", "--host", "box", "--accept-new-host-key")
    assert pinned.returncode == 0, pinned.stderr
    assert f"[127.0.0.1]:{sshd.port}" in empty.read_text()
    assert pinned.stderr.count("pinned a new host key") == 1
    logged = [e for e in target.events() if e["type"] == "host_key_pinned"]
    assert logged and logged[0]["fingerprint"] in sshd.host_fingerprint
    connected = next(e for e in target.events() if e["type"] == "connected")
    assert connected["transport"]["host_key_fingerprint"].endswith(sshd.host_fingerprint.split()[-1])

    again = target.deployer("plan", "fix.yaml", "--host", "box", "--json")  # reject policy, key now known
    # It connects; the plan then finds nothing to do: the fix is already applied.
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["head"] == target.head() and json.loads(again.stdout)["already_applied"]


def through_ssh_config(target: Project, tmp_path: Path, config_text: str) -> None:
    """The inventory names host gpu-alias with nothing but this ssh_config to reach it by; fix.yaml is written."""
    config = tmp_path / "ssh_config"
    config.write_text(config_text)
    target.host_name = "gpu-alias"
    target.write_inventory(address=None, port=None, user=None, identity_file=None, ssh_config=str(config))
    target.playbook()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_the_host_name_can_be_an_ssh_config_alias(target: Project, sshd: SSHD, tmp_path: Path) -> None:
    through_ssh_config(target, tmp_path, f"Host gpu-alias\n  HostName {sshd.host}\n  Port {sshd.port}\n"
                                         f"  User {sshd.user}\n  IdentityFile {sshd.client_key}\n")
    result = target.deployer("apply", "fix.yaml", "--host", "gpu-alias")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == FIXED_A
    connected = next(e for e in target.events() if e["type"] == "connected")
    assert connected["transport"]["extra"]["port"] == str(sshd.port)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_match_exec_block_of_the_ssh_config_applies_only_when_its_command_succeeds(
        target: Project, sshd: SSHD, tmp_path: Path) -> None:
    # deployer imports paramiko without invoke, which paramiko needs for `Match exec` alone: a config with
    # such a line must get it back. The port is only right when the exec ran and succeeded.
    marker = tmp_path / "on-the-vpn"
    through_ssh_config(target, tmp_path, f"Host gpu-alias\n  HostName {sshd.host}\n  User {sshd.user}\n"
                                         f"  IdentityFile {sshd.client_key}\n"
                                         f"Match exec \"test -e {marker}\"\n  Port {sshd.port}\n"
                                         f"Host *\n  Port 1\n")
    refused = target.deployer("apply", "fix.yaml", "--host", "gpu-alias")
    assert refused.returncode == 4, refused.stderr
    assert "connection refused by 127.0.0.1:1" in refused.stderr
    marker.touch()
    result = target.deployer("apply", "fix.yaml", "--host", "gpu-alias")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == FIXED_A


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_connect_timeout_s_bounds_a_login_that_never_answers(target: Project, sshd: SSHD) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # the kernel accepts; nothing ever says a word
        port = listener.getsockname()[1]
        target.write_inventory(port=port, connect_timeout_s=0.5)
        target.playbook()
        result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 4, result.stderr
    assert result.stderr == (f"error: box: the SSH handshake or authentication with {sshd.user}@127.0.0.1:{port} "
                             "did not complete within 0.5s (the host's connect_timeout_s)\n")
    assert target.file("pkg/a.py") == ORIGINAL_A


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_cut_connection_says_exactly_what_it_left(target: Project, sshd: SSHD, tmp_path: Path) -> None:
    proxy = CountingProxy(sshd.port)
    known_hosts = tmp_path / "proxy_known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_pubkey_line}\n")
    target.write_inventory(port=proxy.port, known_hosts=str(known_hosts), python=target_python(target, "sleep 3"))
    target.playbook()
    proc = target.popen("apply", "fix.yaml", "--host", "box")
    try:
        deadline = time.monotonic() + 30
        while target.file("pkg/a.py") != FIXED_A:
            assert time.monotonic() < deadline and proc.poll() is None, "the upload never landed"
            time.sleep(0.02)
        proxy.close()  # the network goes away mid-run: no restore is possible
        out, err = proc.communicate(timeout=60)
    finally:
        proxy.close()
    assert proc.returncode == 6, out + err
    assert "restoring the target failed" in err and "may hold the new bytes" in err
    assert "deploy lock" in err and "stay on the target" in err and "deployer recover" in err
    assert target.file("pkg/a.py") == FIXED_A  # what the message says it left, it left
    assert (target.repo / ".git" / "deployer.run.lock").is_dir()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_corrupt_known_hosts_line_is_a_config_error(target: Project, sshd: SSHD, tmp_path: Path) -> None:
    broken = tmp_path / "broken_known_hosts"
    broken.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 AAAA!!!notbase64\n")
    target.write_inventory(known_hosts=str(broken))
    target.playbook()
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    assert "cannot read known_hosts" in result.stderr and "Traceback" not in result.stderr
