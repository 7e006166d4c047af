"""The agent kept on the target by its hash (issue 38 item 1), over the real sshd: the first run leaves it, later
runs send no source, and a copy that is not the user's alone or not exactly ours never runs, while the run goes on
with the source from the stream as before."""

from __future__ import annotations

import hashlib
import marshal
import os
import shutil
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_ssh import SSHD, connect
from polling import wait_for
from test_agent_protocol import PY38

from deployer.agent.client import AgentClient, agent_payload, agent_source, bootstrap_argv
from deployer.agent.protocol import Hello, Put, Run
from deployer.transport.pipes import local_pipe

PAYLOAD = agent_payload()
NAME = f"agent-{hashlib.sha256(PAYLOAD).hexdigest()}"
OURS = hashlib.sha256(agent_source()).hexdigest()
SOURCE_BYTES = len(PAYLOAD)


@pytest.fixture
def cache(sshd: SSHD) -> Iterator[Path]:
    """The fixture user's cache (sshd gives its sessions HOME=<workdir>/home), emptied before and after: the
    session's other tests over this sshd fill it too."""
    where = Path(sshd.workdir) / "home" / ".cache" / "deployer"
    shutil.rmtree(where, ignore_errors=True)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def one_run(sshd: SSHD, *, become: bool = False) -> tuple[Hello, int]:
    """An agent started and used as a run does (requests pipelined behind its start): its hello and the bytes sent."""
    with connect(sshd, become=become) as transport:
        seen: list[Hello] = []
        transport.on_agent = seen.append  # what the run log records of the agent (transport/factory.py)
        pending = [transport.submit(Run(("echo", str(n)))) for n in range(3)]
        assert [p.result().stdout for p in pending] == [b"0\n", b"1\n", b"2\n"]
        agent = transport.agent()
        assert seen == [agent.hello]
        return seen[0], agent.bytes_sent


def kept(cache: Path) -> bool:
    """The cache holds exactly our payload under its name, as the agent leaves it."""
    path = cache / NAME
    return path.is_file() and not path.is_symlink() and path.read_bytes() == PAYLOAD


def test_the_first_run_leaves_the_agent_and_the_next_sends_no_source(sshd: SSHD, cache: Path) -> None:
    first, sent_first = one_run(sshd)
    assert not first.cached and first.sha256 == OURS
    assert sent_first > SOURCE_BYTES
    wait_for(lambda: kept(cache), "the agent's copy in the user's cache")
    # The user's alone: the directory 0700, the file 0600, both the user's (root here, as sshd logs us in).
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and cache.stat().st_uid == os.geteuid()
    assert stat.S_IMODE((cache / NAME).stat().st_mode) == 0o600 and (cache / NAME).stat().st_uid == os.geteuid()
    assert sorted(p.name for p in cache.iterdir()) == [NAME]  # no temp left behind

    second, sent_second = one_run(sshd)
    assert second.cached and second.bytecode
    assert second.sha256 == first.sha256 == OURS  # the run log names the same agent either way
    assert sent_second < 4096 < SOURCE_BYTES


def test_what_was_pipelined_before_the_bootstrap_asked_for_the_source_reaches_the_agent_in_order(
        sshd: SSHD, cache: Path, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)  # an upload the bootstrap holds for the agent, with the requests around it
    with connect(sshd) as transport:
        before = transport.submit(Run(("echo", "before")))
        put = transport.submit(Put(str(tmp_path / "up"), data, mkdirs=True))
        after = transport.submit(Run(("sha256sum", str(tmp_path / "up"))), after=put)
        assert before.result().stdout == b"before\n"
        assert after.result().stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
        assert put.result().size == len(data)
        assert transport.agent().hello is not None and not transport.agent().hello.cached


def test_under_become_root_keeps_and_runs_its_own_copy(sshd: SSHD, cache: Path) -> None:
    before = len(sshd.sudo_calls())
    first, _ = one_run(sshd, become=True)
    wait_for(lambda: kept(cache), "root's copy of the agent")
    second, sent = one_run(sshd, become=True)
    assert sshd.sudo_calls()[before:] == ["-n -- sh", "-n -- sh"]  # both started under sudo
    assert (first.euid, second.euid) == (0, 0) and (cache / NAME).stat().st_uid == 0
    assert not first.cached and second.cached and sent < 4096
    assert first.sha256 == second.sha256 == OURS


def test_a_tampered_copy_never_runs_and_the_run_takes_the_source_from_the_stream(sshd: SSHD, cache: Path,
                                                                                  tmp_path: Path) -> None:
    one_run(sshd)
    wait_for(lambda: kept(cache), "the agent's copy")
    # A copy under the right name, as long as ours, that leaves a mark when it runs: a source that makes the mark,
    # and this python's bytecode of it, each padded to our lengths (zlib ignores what follows its stream).
    mark = tmp_path / "tampered-copy-ran"
    size = len(agent_source())
    line = f"open({str(mark)!r}, 'w').close()\n".encode()
    evil = line + b"#" * (size - len(line))
    code = zlib.compress(marshal.dumps(compile(evil, "agent", "exec")), 1)
    tampered = evil + code + b"\0" * (SOURCE_BYTES - size - len(code))
    assert len(tampered) == SOURCE_BYTES and tampered != PAYLOAD
    (cache / NAME).write_bytes(tampered)
    os.chmod(cache / NAME, 0o600)

    hello, sent = one_run(sshd)
    assert not mark.exists()
    assert not hello.cached and hello.sha256 == OURS and sent > SOURCE_BYTES
    wait_for(lambda: kept(cache), "the tampered copy replaced by ours")
    assert one_run(sshd)[0].cached


@pytest.mark.parametrize("spoil", ["another user's file", "a group-writable file", "a world-writable directory",
                                   "another user's directory", "a symlink to a good copy", "a symlinked directory"])
def test_a_copy_that_is_not_the_users_alone_is_not_run(sshd: SSHD, cache: Path, tmp_path: Path, spoil: str) -> None:
    one_run(sshd)
    wait_for(lambda: kept(cache), "the agent's copy")
    path = cache / NAME
    elsewhere = tmp_path / "good"
    elsewhere.mkdir(mode=0o700)
    shutil.copy2(path, elsewhere / NAME)
    if spoil == "another user's file":
        os.chown(path, 4321, 4321)
    elif spoil == "a group-writable file":
        os.chmod(path, 0o620)
    elif spoil == "a world-writable directory":
        os.chmod(cache, 0o777)
    elif spoil == "another user's directory":
        os.chown(cache, 4321, 4321)
    elif spoil == "a symlink to a good copy":
        path.unlink()
        path.symlink_to(elsewhere / NAME)
    else:
        shutil.rmtree(cache)
        cache.symlink_to(elsewhere)

    hello, sent = one_run(sshd)
    assert not hello.cached and hello.sha256 == OURS and sent > SOURCE_BYTES  # still our agent, from the stream
    if spoil in ("a world-writable directory", "another user's directory", "a symlinked directory"):
        # A directory that is not the user's alone gets nothing new either: every run sends the source.
        assert not one_run(sshd)[0].cached
        assert (elsewhere / NAME).read_bytes() == PAYLOAD
    else:  # the user's own directory: the next run's copy replaces what was there
        wait_for(lambda: kept(cache) and path.stat().st_uid == os.geteuid()
                 and stat.S_IMODE(path.stat().st_mode) == 0o600, "a copy of the user's own in its place")
        assert one_run(sshd)[0].cached


@pytest.mark.skipif(PY38 is None, reason="no Python 3.8 on this machine")
def test_the_oldest_python_the_agent_runs_on_keeps_and_runs_the_copy_too(tmp_path: Path) -> None:
    assert PY38 is not None
    hellos = []
    for _ in range(2):  # a local pipe under that HOME: the bootstrap and `_keep` as an SSH target runs them
        within = ("env", f"HOME={tmp_path}", f"XDG_CACHE_HOME={tmp_path / 'xdg'}")  # $HOME is the user's: XDG counts
        with AgentClient(local_pipe(bootstrap_argv(PY38, within, cached=True), "py38"), name="py38").start(
                source_ahead=False) as agent:
            assert agent.run(["echo", "ran"]).stdout == b"ran\n"
            hellos.append(agent.hello)
        wait_for(lambda: kept(tmp_path / "xdg" / "deployer"), "the copy under Python 3.8")
    assert [(h.python[:4], h.cached, h.sha256) for h in hellos if h] == [("3.8.", False, OURS), ("3.8.", True, OURS)]
