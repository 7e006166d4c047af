"""SSHTransport against a real OpenSSH server (the `sshd` fixture on 127.0.0.1)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from fixtures_services import served
from fixtures_ssh import SSHD, CountingProxy, connect, fingerprint_of
from polling import within

from deployer.errors import ConfigError, ConnectError, HostKeyError, TransportError
from deployer.transport.ssh.config import _parse_jump
from deployer.transport.ssh.transport import SSHTransport

MiB = 1024 * 1024

# Every shape of argument that a careless join would let the remote shell interpret.
NASTY = [
    "two words",
    "it's",
    'say "hi"',
    "back\\slash",
    "line one\nline two",
    "-n",
    "--help",
    "*",
    "$HOME",
    "a;b|c&d",
    "tab\there",
    "",
]


def _injections(marker_dir: Path) -> list[str]:
    return [f"$(touch {marker_dir}/X)", f"`touch {marker_dir}/Y`", f"';touch {marker_dir}/Z;'"]


def _accepted_logins(sshd: SSHD) -> int:
    return sshd.log().count("Accepted publickey")


def _closed_before_auth(sshd: SSHD) -> int:
    """Connections sshd saw end before authentication (its `[preauth]` close lines)."""
    return len(re.findall(r"^Connection (?:closed|reset) by \S+ port \d+ \[preauth\]$", sshd.log(), re.M))


def _assert_refused_before_login(sshd: SSHD, logins: int, preauth_closes: int) -> None:
    """sshd logged the client hanging up before authentication, and no login since `logins`.

    sshd writes its log asynchronously: wait for the close line (a login would have come before it)."""
    assert within(lambda: _closed_before_auth(sshd) > preauth_closes, 10.0, interval_s=0.1), sshd.log()[-2000:]
    assert _accepted_logins(sshd) == logins


# -- run -------------------------------------------------------------------------------------

def test_run_reports_exit_code_stdout_and_stderr(ssh_transport: SSHTransport) -> None:
    result = ssh_transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=20)
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert not result.ok and not result.timed_out
    assert result.argv == ("sh", "-c", "echo out; echo err >&2; exit 3")
    assert ssh_transport.run(["true"], timeout=20).ok


def test_run_honours_cwd_and_env(ssh_transport: SSHTransport, tmp_path: Path) -> None:
    result = ssh_transport.run(["sh", "-c", 'pwd; printf "%s\\n" "$GREETING"'], cwd=str(tmp_path),
                               env={"GREETING": "hello there"}, timeout=20)
    assert result.ok, result.err
    assert result.out == f"{tmp_path}\nhello there\n"


def test_run_feeds_stdin_bytes_to_the_command(ssh_transport: SSHTransport) -> None:
    payload = bytes(range(256)) * 1000
    result = ssh_transport.run(["cat"], stdin=payload, timeout=20)
    assert result.ok and result.stdout == payload


def test_run_without_stdin_sends_eof_so_prompts_cannot_hang(ssh_transport: SSHTransport) -> None:
    result = ssh_transport.run(["sh", "-c", "read answer; echo got:$answer"], timeout=10)
    assert not result.timed_out
    assert result.out == "got:\n"


def test_run_reports_host_key_fingerprint_in_ssh_keygen_format(
        ssh_transport: SSHTransport, sshd: SSHD) -> None:
    listed = subprocess.run(["ssh-keygen", "-lf", sshd.host_key + ".pub"], check=True,
                            capture_output=True, text=True).stdout.split()[1]
    assert ssh_transport.info.kind == "ssh"
    assert ssh_transport.info.host_key_fingerprint == f"ssh-ed25519 {listed}" == sshd.host_fingerprint
    # What the run log records of the connection: no jump host, no become.
    assert ssh_transport.info.extra == {"address": sshd.host, "hostname": sshd.host, "port": str(sshd.port),
                                        "user": sshd.user, "known_hosts": sshd.known_hosts}


def test_become_wraps_commands_and_file_access_in_sudo(sshd: SSHD, tmp_path: Path) -> None:
    with connect(sshd, become=True) as transport:
        assert transport.info.extra["become"] == "sudo"
        before = len(sshd.sudo_calls())
        assert transport.run(["id", "-u"], timeout=20).out == "0\n"
        dest = tmp_path / "become" / "file.txt"
        transport.put(b"as root", str(dest), mode=0o600)
        assert transport.get(str(dest)) == b"as root"
        assert transport.get(str(tmp_path / "absent")) is None
        os.chown(dest, 4321, 4321)  # a service user's file: sudo must not make it root's
        transport.put(b"again", str(dest))
        assert stat.S_IMODE(dest.stat().st_mode) == 0o600 and dest.read_bytes() == b"again"
        assert (dest.stat().st_uid, dest.stat().st_gid) == (4321, 4321)
        assert not [p for p in dest.parent.iterdir() if p.name != "file.txt"]
    # One agent, started under sudo -n; every command and file access above went through it.
    calls = sshd.sudo_calls()[before:]
    assert calls == ["-n -- sh"], calls  # the sh that python3 runs under (bootstrap_argv)
    # Without become (the default) nothing goes through sudo.
    with connect(sshd) as plain:
        assert plain.run(["true"], timeout=20).ok and "become" not in plain.info.extra
    assert sshd.sudo_calls()[before:] == calls


# -- put / get -------------------------------------------------------------------------------

def test_put_then_get_round_trips_bytes(ssh_transport: SSHTransport, tmp_path: Path) -> None:
    data = os.urandom(300_000) + bytes(range(256))
    dest = tmp_path / "blob.bin"
    result = ssh_transport.put(data, str(dest))
    assert result.size == len(data) and result.dest == str(dest)
    assert dest.read_bytes() == data
    assert ssh_transport.get(str(dest)) == data


def test_put_creates_missing_directories_and_new_files_are_0644(
        ssh_transport: SSHTransport, tmp_path: Path) -> None:
    dest = tmp_path / "new" / "deeper" / "file.py"
    ssh_transport.put(b"print('hi')\n", str(dest))
    assert dest.read_bytes() == b"print('hi')\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644


def test_put_replaces_by_rename_keeps_the_mode_and_leaves_no_temp(
        ssh_transport: SSHTransport, tmp_path: Path) -> None:
    dest = tmp_path / "conf.py"
    dest.write_bytes(b"old\n")
    dest.chmod(0o750)
    old_inode = dest.stat().st_ino
    with open(dest, "rb") as reader:  # a process that had the old file open keeps the old bytes
        ssh_transport.put(b"new\n", str(dest))
        assert reader.read() == b"old\n"
    assert dest.read_bytes() == b"new\n"
    assert dest.stat().st_ino != old_inode
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750
    ssh_transport.put(b"newer\n", str(dest), mode=0o600)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf.py"]


def test_put_into_a_path_under_a_regular_file_fails_cleanly(
        ssh_transport: SSHTransport, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a directory")
    with pytest.raises(TransportError, match=re.escape(f"(not_a_directory): {tmp_path}/plain exists and is not a "
                                                       "directory")):
        ssh_transport.put(b"x", str(tmp_path / "plain" / "sub" / "f"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"] and (tmp_path / "plain").read_text() == \
        "not a directory"


def test_get_of_a_missing_file_is_none(ssh_transport: SSHTransport, tmp_path: Path) -> None:
    assert ssh_transport.get(str(tmp_path / "nope")) is None


# -- quoting ---------------------------------------------------------------------------------

def test_arguments_env_values_and_paths_reach_the_target_literally(
        ssh_transport: SSHTransport, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    values = NASTY + _injections(markers)

    printed = ssh_transport.run(["printf", "%s\\0", *values], timeout=20)
    assert printed.ok, printed.err
    assert printed.stdout.split(b"\0")[:-1] == [v.encode() for v in values]

    env = {f"V{i}": v for i, v in enumerate(values)}
    script = "printf '%s\\0' " + " ".join(f'"$V{i}"' for i in range(len(values)))
    echoed = ssh_transport.run(["sh", "-c", script], env=env, timeout=20)
    assert echoed.stdout.split(b"\0")[:-1] == [v.encode() for v in values]

    for name in [v for v in values if v not in ("", "*")] + ["-rf", "--"]:
        weird_dir = tmp_path / "dirs" / name.replace("/", "_")
        dest = weird_dir / name.replace("/", "_")
        ssh_transport.put(name.encode(), str(dest))
        assert dest.read_bytes() == name.encode()
        assert ssh_transport.get(str(dest)) == name.encode()
        shown = ssh_transport.run(["sh", "-c", 'pwd && cat -- "$1"', "show", str(dest)],
                                  cwd=str(weird_dir), timeout=20)
        assert shown.stdout == f"{weird_dir}\n{name}".encode()

    assert list(markers.iterdir()) == []


# -- timeouts and output volume ----------------------------------------------------------------

def test_timeout_kills_the_whole_remote_process_group(ssh_transport: SSHTransport) -> None:
    marker = f"deployer-timeout-{uuid.uuid4().hex}"
    # A child in the background and a foreground sleep, both tagged with the marker.
    script = "sh -c 'sleep 600; :' child-$0 & sleep 600; :"
    started = time.monotonic()
    result = ssh_transport.run(["sh", "-c", script, marker], timeout=2)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.exit_code is None and not result.ok
    assert 1.5 < elapsed < 10

    def gone() -> bool:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1

    assert within(gone, 5.0, interval_s=0.1), subprocess.run(["pgrep", "-af", marker], capture_output=True,
                                                  text=True).stdout


def test_timeout_kills_under_become_too(sshd: SSHD) -> None:
    marker = f"deployer-timeout-{uuid.uuid4().hex}"
    with connect(sshd, become=True) as transport:
        result = transport.run(["sh", "-c", "sleep 600; :", marker], timeout=1)
    assert result.timed_out

    def gone() -> bool:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1

    assert within(gone, 5.0, interval_s=0.1)


def test_ten_mebibytes_interleaved_on_stdout_and_stderr_do_not_deadlock(
        ssh_transport: SSHTransport) -> None:
    # 64 KiB at a time, alternating streams: a reader of only one stream would stall the other.
    script = ("i=0; while [ $i -lt 160 ]; do head -c 65536 /dev/zero; "
              "head -c 65536 /dev/zero >&2; i=$((i+1)); done")
    result = ssh_transport.run(["sh", "-c", script], timeout=60)
    assert result.ok, result.err[-200:]
    assert (result.out_stream.total, result.err_stream.total) == (10 * MiB, 10 * MiB)


# -- connection and host keys ----------------------------------------------------------------

def test_unknown_host_key_is_refused_before_login(sshd: SSHD, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    logins, preauth_closes = _accepted_logins(sshd), _closed_before_auth(sshd)
    with pytest.raises(HostKeyError) as caught:
        connect(sshd, known_hosts=str(empty))  # connecting is where the key is checked
    message = str(caught.value)
    assert caught.value.exit_code == 4
    assert message == (
        f"sshd-test: host key of [127.0.0.1]:{sshd.port} is not in {empty}; refusing to connect "
        "(host_key_policy: reject). Nothing was sent to it.\n"
        f"  The server presented: {sshd.host_fingerprint}\n"
        "  Compare it out of band (on the host: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub),\n"
        "  then accept it by setting `host_key_policy: accept-new` for this host in the\n"
        "  inventory, or by passing --accept-new-host-key.")
    assert empty.read_text() == ""
    _assert_refused_before_login(sshd, logins, preauth_closes)


def test_accept_new_pins_the_key_then_reject_trusts_it(sshd: SSHD, tmp_path: Path) -> None:
    known_hosts = tmp_path / "fresh" / "known_hosts"
    pinned: list[tuple[str, str, str]] = []
    with connect(sshd, known_hosts=str(known_hosts), host_key_policy="accept-new",
                 on_host_key_pinned=lambda *args: pinned.append(args)) as transport:
        assert transport.run(["true"], timeout=20).ok
    entry = f"[127.0.0.1]:{sshd.port}"
    keytype, fp = sshd.host_fingerprint.split()
    assert pinned == [(entry, keytype, fp)]
    assert stat.S_IMODE(known_hosts.stat().st_mode) == 0o600
    assert stat.S_IMODE(known_hosts.parent.stat().st_mode) == 0o700  # made for it, like ~/.ssh
    assert known_hosts.read_text() == f"{entry} {sshd.host_pubkey_line}\n"
    with connect(sshd, known_hosts=str(known_hosts), host_key_policy="reject") as transport:
        assert transport.run(["true"], timeout=20).ok
    assert len(known_hosts.read_text().splitlines()) == 1


def test_accept_new_pins_into_a_bare_known_hosts_file_name_in_the_working_directory(
        sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with connect(sshd, known_hosts="known_hosts", host_key_policy="accept-new") as transport:
        assert transport.run(["true"], timeout=20).ok
    assert os.listdir(work) == ["known_hosts"]  # the file, and no directory made for its (empty) dirname
    assert (work / "known_hosts").read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_pubkey_line}\n"


@pytest.mark.parametrize("last_line_ends", ["\n", ""], ids=["with-newline", "without-newline"])
def test_accept_new_appends_a_line_of_its_own_whatever_the_last_line_ends_with(
        sshd: SSHD, tmp_path: Path, last_line_ends: str) -> None:
    known_hosts = tmp_path / "known_hosts"
    other = f"[other.invalid]:2222 {sshd.host_pubkey_line}"
    known_hosts.write_text(other + last_line_ends)
    with connect(sshd, known_hosts=str(known_hosts), host_key_policy="accept-new") as transport:
        assert transport.run(["true"], timeout=20).ok
    assert known_hosts.read_text() == f"{other}\n[127.0.0.1]:{sshd.port} {sshd.host_pubkey_line}\n"


def test_hashed_known_hosts_entries_are_honoured(sshd: SSHD, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host(f"[127.0.0.1]:{sshd.port}")
    known_hosts.write_text(f"{hashed} {sshd.host_pubkey_line}\n")
    with connect(sshd, known_hosts=str(known_hosts)) as transport:
        assert transport.run(["true"], timeout=20).ok


def test_wrong_client_key_fails_with_connect_error_within_the_timeout(
        sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # an agent could hold a valid key
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    started = time.monotonic()
    with pytest.raises(ConnectError) as caught:
        connect(sshd, identity_file=str(wrong), connect_timeout=3.0)
    # A deadline, not a race: the failure is immediate; only a hang (paramiko's 15 s banner or
    # 30 s auth timeouts in place of ours) would pass it.
    assert time.monotonic() - started < 3.0 + 9.0
    assert not isinstance(caught.value, HostKeyError)
    assert caught.value.exit_code == 4
    assert "authentication" in str(caught.value) and f"127.0.0.1:{sshd.port}" in str(caught.value)


def test_refused_port_is_a_connect_error_naming_host_and_port(sshd: SSHD) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(ConnectError, match=f"refused by 127.0.0.1:{port}"):
            connect(sshd, port=port)


def test_silent_server_fails_within_the_connect_timeout(sshd: SSHD) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts (in the kernel) and never says a word
        started = time.monotonic()
        port = listener.getsockname()[1]
        with pytest.raises(ConnectError, match=re.escape(
                f"sshd-test: the SSH handshake or authentication with {sshd.user}@{sshd.host}:{port} did not "
                "complete within 1s (the host's connect_timeout_s)")):
            connect(sshd, port=port, connect_timeout=1.0)
        # Ignoring connect_timeout would wait for paramiko's 15 s banner timeout.
        assert time.monotonic() - started < 1.0 + 9.0


def test_use_after_close_or_connection_loss_is_a_transport_error(sshd: SSHD) -> None:
    transport = connect(sshd)
    transport._transport.close()  # the connection drops under us
    with pytest.raises(TransportError, match=f"sshd-test: SSH connection to {sshd.user}@{sshd.host}:{sshd.port} "
                                             "was lost"):
        transport.run(["true"], timeout=10)
    transport.close()
    transport.close()  # idempotent
    with pytest.raises(TransportError, match="closed"):
        transport.run(["true"], timeout=10)


# -- one connection, forwarding, ssh config --------------------------------------------------

@pytest.fixture
def http_server() -> Iterator[int]:
    with served(lambda path: f"hello from {path}".encode()) as server:
        yield server.port


def _fetch(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return str(response.read().decode())


def test_forward_tunnels_a_local_port_to_the_target(ssh_transport: SSHTransport, http_server: int) -> None:
    local = ssh_transport.forward(http_server)
    assert local != http_server
    assert _fetch(local, "/one") == "hello from /one"
    assert ssh_transport.forward(http_server) == local
    results: list[str] = []
    threads = [threading.Thread(target=lambda i=i: results.append(_fetch(local, f"/{i}")))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == sorted(f"hello from /{i}" for i in range(8))
    ssh_transport.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", local), timeout=2).close()


def test_everything_shares_one_tcp_connection(sshd: SSHD, tmp_path: Path, http_server: int) -> None:
    proxy = CountingProxy(sshd.port)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_pubkey_line}\n")
    try:
        with connect(sshd, port=proxy.port, known_hosts=str(known_hosts)) as transport:
            for i in range(3):
                assert transport.run(["echo", str(i)], timeout=20).out == f"{i}\n"
                transport.put(f"data {i}".encode(), str(tmp_path / "d" / f"f{i}"))
                assert transport.get(str(tmp_path / "d" / f"f{i}")) == f"data {i}".encode()
            assert transport.get(str(tmp_path / "absent")) is None
            local = transport.forward(http_server)
            assert _fetch(local, "/a") == "hello from /a"
            assert _fetch(local, "/b") == "hello from /b"
            assert transport.run(["sleep", "5"], timeout=0.5).timed_out  # the kill is a channel too
        assert proxy.accepted == 1
    finally:
        proxy.close()


def _write_ssh_config(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_ssh_config_alias_supplies_hostname_port_user_and_key(sshd: SSHD, tmp_path: Path) -> None:
    config = _write_ssh_config(tmp_path / "config", f"""
Host myalias
    HostName {sshd.host}
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    IdentitiesOnly yes
""")
    with SSHTransport(name="alias", address="myalias", known_hosts=sshd.known_hosts,
                      ssh_config=config, connect_timeout=5) as transport:
        assert transport.run(["id", "-un"], timeout=20).out == f"{sshd.user}\n"
        assert transport.info.extra["hostname"] == sshd.host
        assert transport.info.extra["port"] == str(sshd.port)


def test_explicit_arguments_override_the_ssh_config(sshd: SSHD, tmp_path: Path) -> None:
    config = _write_ssh_config(tmp_path / "config", f"""
Host myalias
    HostName {sshd.host}
    Port 1
    IdentityFile {tmp_path}/does-not-exist
""")
    with SSHTransport(name="alias", address="myalias", port=sshd.port, user=sshd.user,
                      identity_file=sshd.client_key, known_hosts=sshd.known_hosts,
                      ssh_config=config, connect_timeout=5) as transport:
        assert transport.run(["true"], timeout=20).ok


def _bastion_config(sshd: SSHD, path: Path, bastion_key: str) -> str:
    """`behind` through `bastion`, both on the fixture's sshd; the bastion logs in with bastion_key."""
    return _write_ssh_config(path, f"""
Host bastion
    HostName {sshd.host}
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {bastion_key}
Host behind
    HostName {sshd.host}
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    ProxyJump bastion
""")


def test_proxy_jump_through_a_bastion(sshd: SSHD, tmp_path: Path) -> None:
    config = _bastion_config(sshd, tmp_path / "config", sshd.client_key)
    with SSHTransport(name="behind", address="behind", known_hosts=sshd.known_hosts,
                      ssh_config=config, connect_timeout=5) as transport:
        assert transport.run(["echo", "through"], timeout=20).out == "through\n"
        assert transport.info.extra["proxy_jump"] == f"{sshd.user}@{sshd.host}:{sshd.port}"
        assert transport.info.extra["proxy_jump_host_keys"] == sshd.host_fingerprint


def test_every_hop_of_a_two_bastion_proxy_jump_is_recorded(sshd: SSHD, tmp_path: Path) -> None:
    config = _write_ssh_config(tmp_path / "config", f"""
Host hop1 hop2 behind
    HostName {sshd.host}
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
Host behind
    ProxyJump hop1,hop2
""")
    with SSHTransport(name="behind", address="behind", known_hosts=sshd.known_hosts,
                      ssh_config=config, connect_timeout=5) as transport:
        assert transport.run(["true"], timeout=20).ok
        where = f"{sshd.user}@{sshd.host}:{sshd.port}"
        assert transport.info.extra["proxy_jump"] == f"{where},{where}"
        assert transport.info.extra["proxy_jump_host_keys"] == f"{sshd.host_fingerprint},{sshd.host_fingerprint}"


def test_the_target_behind_a_bastion_is_dialled_by_the_bastion_never_directly(sshd: SSHD, tmp_path: Path) -> None:
    # The bastion logs in with a key of its own that sshd lets forward only to a port nothing listens on
    # (permitopen): going through the bastion must fail, where dialling the target directly would work.
    key = tmp_path / "bastion_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    with open(Path(sshd.workdir) / "authorized_keys", "a") as authorized:
        authorized.write(f'permitopen="127.0.0.1:1" {key.with_name("bastion_key.pub").read_text()}')
    config = _bastion_config(sshd, tmp_path / "config", str(key))
    with pytest.raises(ConnectError, match=re.escape(f"behind: jump host {sshd.user}@{sshd.host}:{sshd.port} could "
                                                     f"not reach {sshd.host}:{sshd.port}")):
        SSHTransport(name="behind", address="behind", known_hosts=sshd.known_hosts, ssh_config=config,
                     connect_timeout=5)


def test_known_hosts_comes_from_the_ssh_config_then_from_home(
        sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = sshd.write_known_hosts(tmp_path / "pinned_known_hosts")
    config = _write_ssh_config(tmp_path / "config",
                               f"Host box\n    HostName {sshd.host}\n    UserKnownHostsFile {pinned} /dev/null\n")
    with connect(sshd, address="box", known_hosts=None, ssh_config=config) as transport:
        assert transport.info.extra["known_hosts"] == pinned
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/known_hosts there: the key is unknown
    with pytest.raises(HostKeyError, match=re.escape(f"is not in {tmp_path}/home/.ssh/known_hosts; refusing")):
        connect(sshd, known_hosts=None)


def _aliased_jump_config(sshd: SSHD, path: Path) -> str:
    """A bastion and a target on the same sshd, pinned under different names (HostKeyAlias)."""
    return _write_ssh_config(path, f"""
Host bastion
    HostName {sshd.host}
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    HostKeyAlias bastion-key
Host behind
    HostName {sshd.host}
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    HostKeyAlias behind-key
    ProxyJump bastion
""")


@pytest.mark.parametrize("bastion_pin", ["unknown", "changed"])
def test_a_bastion_with_an_unknown_or_changed_key_is_refused_and_nothing_runs(
        sshd: SSHD, tmp_path: Path, bastion_pin: str) -> None:
    config = _aliased_jump_config(sshd, tmp_path / "config")
    target_line = f"[behind-key]:{sshd.port} {sshd.host_pubkey_line}\n"
    pins = target_line
    if bastion_pin == "changed":
        other = tmp_path / "other_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        other_line = " ".join(other.with_name("other_key.pub").read_text().split()[:2])
        pins += f"[bastion-key]:{sshd.port} {other_line}\n"
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(pins)
    # The control: with the bastion pinned correctly, the same config connects.
    good = tmp_path / "good_known_hosts"
    good.write_text(target_line + f"[bastion-key]:{sshd.port} {sshd.host_pubkey_line}\n")
    with SSHTransport(name="behind", address="behind", known_hosts=str(good), ssh_config=config,
                      connect_timeout=5) as transport:
        assert transport.run(["true"], timeout=20).ok

    logins, preauth_closes = _accepted_logins(sshd), _closed_before_auth(sshd)
    for policy in ("reject", "accept-new") if bastion_pin == "changed" else ("reject",):
        with pytest.raises(HostKeyError) as caught:
            SSHTransport(name="behind", address="behind", known_hosts=str(known_hosts), ssh_config=config,
                         connect_timeout=5, host_key_policy=policy)  # type: ignore[arg-type]
        message = str(caught.value)
        assert caught.value.exit_code == 4
        assert f"[bastion-key]:{sshd.port}" in message and sshd.host_fingerprint in message
        assert ("HOST KEY CHANGED" in message) == (bastion_pin == "changed")
    assert known_hosts.read_text() == pins
    _assert_refused_before_login(sshd, logins, preauth_closes)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client for ssh -W")
def test_proxy_command_from_the_ssh_config(sshd: SSHD, tmp_path: Path) -> None:
    relay = (f"ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes "
             f"-o UserKnownHostsFile={sshd.known_hosts} -i {sshd.client_key} -p {sshd.port} "
             f"-W %h:%p {sshd.user}@{sshd.host}")
    config = _write_ssh_config(tmp_path / "config", f"""
Host relayed
    HostName {sshd.host}
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    ProxyCommand {relay}
""")
    with SSHTransport(name="relayed", address="relayed", known_hosts=sshd.known_hosts,
                      ssh_config=config, connect_timeout=5) as transport:
        assert transport.run(["echo", "relayed"], timeout=20).out == "relayed\n"


# -- last: rotates the server's host key ------------------------------------------------------

def test_changed_host_key_is_refused_under_every_policy(sshd: SSHD, tmp_path: Path) -> None:
    old_known_hosts = tmp_path / "known_hosts"
    pinned_before = sshd.known_hosts_line
    old_known_hosts.write_text(pinned_before)
    old_fingerprint = sshd.host_fingerprint
    sshd.regenerate_host_key()
    for policy in ("reject", "accept-new"):
        with pytest.raises(HostKeyError) as caught:
            connect(sshd, known_hosts=str(old_known_hosts), host_key_policy=policy)
        assert str(caught.value) == (
            f"sshd-test: HOST KEY CHANGED for [127.0.0.1]:{sshd.port}; refusing to connect (under every "
            "host_key_policy).\n"
            f"  known_hosts {old_known_hosts} pins: {old_fingerprint}\n"
            f"  the server presented:       {fingerprint_of(sshd.host_pubkey_line)}\n"
            "  Either the host was reinstalled or someone is intercepting the connection. Only if\n"
            "  you have verified the new key out of band, remove the old entry with\n"
            f"    ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {old_known_hosts}\n"
            "  and connect once with --accept-new-host-key.")
    assert old_known_hosts.read_text() == pinned_before  # accept-new did not overwrite it
    with connect(sshd) as transport:  # the fixture's own known_hosts follows the rotation
        assert transport.run(["true"], timeout=20).ok


def test_a_partitioned_target_fails_the_call_within_its_bounds(sshd: SSHD, tmp_path: Path) -> None:
    proxy = CountingProxy(sshd.port)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_pubkey_line}\n")
    try:
        with connect(sshd, port=proxy.port, known_hosts=str(known_hosts), connect_timeout=2.0) as transport:
            assert transport.run(["true"], timeout=10).ok
            proxy.freeze()
            started = time.monotonic()
            with pytest.raises(TransportError):
                transport.run(["sleep", "30"], timeout=1)
            assert time.monotonic() - started < 10  # bounded by the timeouts, not by TCP giving up
    finally:
        proxy.close()


SCAN_CMDLINES = """
import os
value = os.environ["DEPLOYER_TEST_SECRET"].encode()
seen = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        seen += value in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        pass
print(os.environ["DEPLOYER_TEST_SECRET"], seen)
"""


def test_env_values_never_appear_in_a_command_line_on_the_target(ssh_transport: SSHTransport) -> None:
    secret = "zz-not-in-ps-$(touch X)"  # quoted whole on a command line, so a scan would find it
    result = ssh_transport.run([sys.executable, "-c", SCAN_CMDLINES], env={"DEPLOYER_TEST_SECRET": secret},
                               timeout=30)
    assert result.ok, result.err
    assert result.out == f"{secret} 0\n"  # the value arrived literally, and no process shows it


def test_without_an_identity_file_the_default_keys_in_home_are_tried(
        sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # only ~/.ssh/id_* can authenticate
    keys = tmp_path / "home" / ".ssh"
    keys.mkdir(parents=True)
    shutil.copy(sshd.client_key, keys / "id_ed25519")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with connect(sshd, identity_file=None) as transport:
        assert transport.run(["true"], timeout=20).ok


def test_a_key_held_by_ssh_agent_authenticates(sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline and agent.poll() is None, "ssh-agent did not start"
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", sshd.client_key], env=env, check=True, capture_output=True, timeout=10)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* to fall back on: the agent or nothing
        with connect(sshd, identity_file=None) as transport:
            assert transport.run(["echo", "via agent"], timeout=20).out == "via agent\n"
    finally:
        agent.kill()
        agent.wait()


def test_proxy_jump_specs_parse_or_fail_as_config_errors() -> None:
    assert _parse_jump("root@bastion:2222") == ("root", "bastion", 2222)
    assert _parse_jump("ssh://[::1]:22") == (None, "::1", 22)
    assert _parse_jump("bastion") == (None, "bastion", None)
    with pytest.raises(ConfigError, match="ProxyJump port"):
        _parse_jump("root@bastion:ssh")
