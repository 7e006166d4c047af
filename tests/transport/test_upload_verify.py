"""Upload verification against real mismatches: bytes that do not match their digest, a write that is cut.

Every upload is the agent's `put` (over ssh, under become, locally): it checks the sha256 of the bytes it got
and of what is on disk before the rename. A failed upload leaves the old bytes and no temp file behind.
The cut write limits the agent's file size (RLIMIT_FSIZE, inherited by the agent the transport starts).
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures_ssh import SSHD, connect

from deployer.agent import agent as agent_mod
from deployer.agent.protocol import Put
from deployer.errors import TransportError
from deployer.run.restore import TEMP_GLOB


class CorruptedPut(Put):
    """A put whose bytes do not match the sha256 sent with them: what the agent sees of bytes corrupted on
    the way. The request is real protocol; only its declared digest is wrong."""

    def fields(self) -> dict[str, Any]:
        return {**super().fields(), "sha256": "0" * 64}


@pytest.mark.parametrize("become", [False, True], ids=["ssh", "become"])
def test_an_upload_whose_bytes_do_not_match_their_sha256_is_refused_and_leaves_the_old_file(
        sshd: SSHD, tmp_path: Path, become: bool) -> None:
    dest = tmp_path / "keep.py"
    dest.write_bytes(b"precious\n")
    with connect(sshd, become=become) as transport:
        transport.put(b"fine\n", str(tmp_path / "control.py"))  # an honest upload lands
        with pytest.raises(TransportError) as caught:
            transport.call(CorruptedPut(str(dest), b"new bytes\n"))
    message = str(caught.value)
    assert "corrupt" in message and str(dest) in message and "0" * 64 in message
    assert dest.read_bytes() == b"precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control.py", "keep.py"]


CUT_WRITE = """
import resource, sys
from deployer.agent.protocol import Put
from deployer.errors import TransportError
from deployer.transport.local import LocalTransport
# Files may not grow past 4 KiB in this process: the write is cut short (EFBIG; Python ignores SIGXFSZ).
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    LocalTransport().put(b"x" * 65536, sys.argv[1])
except TransportError as exc:
    print("TransportError:", exc)
except OSError as exc:
    print("OSError:", exc)
else:
    print("no error")
"""


def cut_local_write(dest: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", CUT_WRITE, str(dest)], capture_output=True, text=True,
                          check=True, timeout=60, env=env).stdout


def test_a_local_write_that_is_cut_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    dest = tmp_path / "keep.py"
    dest.write_bytes(b"precious\n")
    outcome = cut_local_write(dest)
    assert outcome != "no error\n"
    assert dest.read_bytes() == b"precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.py"]


def test_a_local_write_that_is_cut_is_a_transport_error_naming_the_file(tmp_path: Path) -> None:
    dest = tmp_path / "keep.py"
    dest.write_bytes(b"precious\n")
    outcome = cut_local_write(dest)
    assert outcome == f"TransportError: local: agent refused 'put' (os_error): cannot write {dest}: File too large\n"


def test_a_temp_file_that_does_not_verify_on_disk_is_removed_and_the_old_file_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes that change between the write and the read-back (a failing disk) cannot be made for real: here the
    agent, run in this process, reads back a wrong digest (the one mock in this file)."""
    dest = tmp_path / "keep.py"
    dest.write_bytes(b"precious\n")
    monkeypatch.setattr(agent_mod, "_sha256_file", lambda path: "f" * 64)
    reply = agent_mod.Agent(b"", io.BytesIO(), io.BytesIO()).execute(Put(str(dest), b"new bytes\n").wire())
    assert (reply["ok"], reply["error"]["type"]) == (False, "corrupt"), reply
    expected = Put(str(dest), b"new bytes\n").wire()["sha256"]
    said = re.fullmatch(f"(.+) did not verify on disk: sha256 {'f' * 64} != {expected}", reply["error"]["message"])
    assert said is not None, reply
    # The temp file was beside the dest, named as restore's clean-up looks for it, and is gone again.
    temp = Path(said[1])
    assert temp.parent == tmp_path and fnmatch.fnmatch(temp.name, TEMP_GLOB), temp
    assert dest.read_bytes() == b"precious\n" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.py"]
