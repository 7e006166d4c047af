"""Upload verification against real mismatches: a lying sha256sum on the target, a write that is cut.

Every path that writes a file on a target is covered: SFTP (ssh), `become` (sudo + sh), and the
local transport. In each, a failed upload leaves the old bytes and no temp file behind.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_ssh import SSHD, connect

from deployer.errors import TransportError

# Reads the file like the real one, then reports a digest that is not its hash: what the target
# would say of bytes that were corrupted on the way or on its disk.
LYING_SHA256SUM = """#!/bin/sh
cat > /dev/null
echo "0000000000000000000000000000000000000000000000000000000000000000  -"
"""


@contextlib.contextmanager
def lying_sha256sum(sshd: SSHD) -> Iterator[None]:
    """A sha256sum first on the target sessions' PATH (the fixture's fakebin), for this block only."""
    fake = Path(sshd.fake_sudo_log).parent / "sha256sum"
    fake.write_text(LYING_SHA256SUM)
    fake.chmod(0o755)
    try:
        yield
    finally:
        fake.unlink()


@pytest.mark.parametrize("become", [False, True], ids=["sftp", "become"])
def test_an_upload_the_target_hashes_differently_is_refused_and_leaves_the_old_file(
        sshd: SSHD, tmp_path: Path, become: bool) -> None:
    dest = tmp_path / "keep.py"
    dest.write_bytes(b"precious\n")
    with connect(sshd, become=become) as transport:
        transport.put(b"fine\n", str(tmp_path / "control.py"))  # the real sha256sum agrees
        with lying_sha256sum(sshd), pytest.raises(TransportError) as caught:
            transport.put(b"new bytes\n", str(dest))
    message = str(caught.value)
    assert "upload of" in message and str(dest) in message and "did not verify" in message
    assert "0" * 64 in message
    assert dest.read_bytes() == b"precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control.py", "keep.py"]


CUT_WRITE = """
import resource, sys
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


@pytest.mark.xfail(strict=True, reason=(
    "BUG: LocalTransport.put lets OSError out (disk full, EFBIG, EIO) instead of a TransportError naming the "
    "file, so the engine reports 'internal error ... (please report this)' for an ordinary failed upload."))
def test_a_local_write_that_is_cut_is_a_transport_error_naming_the_file(tmp_path: Path) -> None:
    dest = tmp_path / "keep.py"
    dest.write_bytes(b"precious\n")
    outcome = cut_local_write(dest)
    assert outcome.startswith("TransportError:") and str(dest) in outcome, outcome
