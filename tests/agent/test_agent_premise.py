"""The agent's `premise` and `numstat_within`: what a chain sent whole runs behind, checked on a real repo by a real
agent process. A premise that does not hold writes nothing, and nothing sent behind it runs."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_repo import ORIGINAL_A, init_repo

from deployer.agent.client import AgentClient
from deployer.agent.protocol import Premise, Put, Run
from deployer.errors import RequestSkipped, TransportError
from deployer.run import intent
from deployer.run.lease import run_trailer
from deployer.runstate import git_blob_id
from deployer.steps.gitops import HEAD
from deployer.transport.local import spawn_agent

RUN_ID = "20261202T120000.000Z-abcdef"
NEW = b"def answer():\n    return 42\n"


@pytest.fixture
def client() -> Iterator[AgentClient]:
    with spawn_agent() as agent:
        yield agent


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    init_repo(path, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
    return path


def premise(repo: Path, dests: dict[str, bytes]) -> Premise:
    return Premise(repo=str(repo), git_dir=str(repo / ".git"), head_argv=HEAD,
                   record=intent.path_in(str(repo / ".git")),
                   record_fields={"run_id": RUN_ID, "operator": "op@here", "host": "box",
                                  "started": "2026-12-02T12:00:00Z", "trailer": run_trailer(RUN_ID)},
                   files=[{"dest": dest, "new_sha256": hashlib.sha256(new).hexdigest(), "new_blob": git_blob_id(new)}
                          for dest, new in dests.items()])


def test_a_premise_that_holds_writes_the_intent_record_from_what_it_found(client: AgentClient, repo: Path) -> None:
    os.chmod(repo / "pkg/a.py", 0o640)
    found = client.call(premise(repo, {"pkg/a.py": NEW}))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert found.head == head
    record = intent.parse((repo / ".git/deployer/inflight.json").read_bytes(), str(repo / ".git"), "box")
    assert record is not None and record.run_id == RUN_ID and record.head_before == head
    (rec,) = record.files
    stat = (repo / "pkg/a.py").stat()
    assert (rec.dest, rec.existed, rec.tracked, rec.mode, rec.uid, rec.gid) == (
        "pkg/a.py", True, True, 0o640, stat.st_uid, stat.st_gid)
    assert rec.sha256 == hashlib.sha256(ORIGINAL_A.encode()).hexdigest() and found.files[0]["sha256"] == rec.sha256
    assert ((repo / ".git/deployer/inflight.json").stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("case", ["record there", "symlink", "already new", "missing", "a directory", "setuid",
                                  "absolute", "a fifo"])
def test_a_premise_that_does_not_hold_writes_nothing_and_nothing_behind_it_runs(
        client: AgentClient, repo: Path, case: str) -> None:
    dest, new = "pkg/a.py", NEW
    if case == "record there":
        (repo / ".git/deployer").mkdir()
        (repo / ".git/deployer/inflight.json").write_text("{}")
    elif case == "symlink":
        (repo / "pkg/real.py").write_text(ORIGINAL_A)
        (repo / "pkg/a.py").unlink()
        (repo / "pkg/a.py").symlink_to("real.py")
    elif case == "already new":
        new = ORIGINAL_A.encode()
    elif case == "missing":
        dest = "pkg/gone.py"
    elif case == "setuid":  # a restore never sets such a bit again: the run reads the file first, as ever
        os.chmod(repo / "pkg/a.py", 0o4755)
    elif case == "absolute":
        dest = str(repo / "pkg/a.py")
    elif case == "a fifo":  # never waited on
        os.mkfifo(repo / "pkg/fifo")
        dest = "pkg/fifo"
    else:
        dest = "pkg"
    before = (repo / ".git/deployer/inflight.json").read_bytes() if case == "record there" else None
    sent = client.submit(premise(repo, {dest: new}))
    change = client.submit(Put(str(repo / "pkg/b.py"), b"changed\n"), after=sent)
    with pytest.raises(TransportError, match=r"\((premise|bad_request)\)"):
        sent.result()
    with pytest.raises(RequestSkipped):
        change.result()
    assert not (repo / "pkg/b.py").exists()
    record = repo / ".git/deployer/inflight.json"
    assert (record.read_bytes() if record.exists() else None) == before


@pytest.mark.parametrize(("out", "within", "passes"), [
    (b"3\t1\tpkg/a.py\0", {"files": [1, 1], "insertions": [1, 10], "deletions": [0, 2]}, True),
    (b"3\t1\tpkg/a.py\0", {"files": [1, 1], "insertions": [4, 10], "deletions": None}, False),
    (b"3\t1\tpkg/a.py\x001\t0\tpkg/b.py\0", {"files": [1, 1], "insertions": None, "deletions": None}, False),
    (b"-\t-\tpkg/a.py\0", {"files": [1, 1], "insertions": None, "deletions": None}, True),  # binary: a change
    (b"-\t-\tpkg/a.py\0", {"files": None, "insertions": [1, 10], "deletions": None}, False),
    (b"0\t0\tpkg/a.py\0", {"files": None, "insertions": None, "deletions": None}, False),  # zero changes
    (b"", {"files": None, "insertions": None, "deletions": None}, False),
])
def test_a_count_within_its_bounds_is_what_lets_the_next_request_run(
        client: AgentClient, tmp_path: Path, out: bytes, within: dict[str, list[int] | None], passes: bool) -> None:
    count = client.submit(Run(("printf", out.decode().replace("\0", "\\000")),
                              numstat_within={k: None if v is None else (v[0], v[1]) for k, v in within.items()}))
    marker = tmp_path / "ran"
    behind = client.submit(Run(("touch", str(marker))), after=count)
    assert count.result().ok
    if passes:
        assert behind.result().ok and marker.exists()
    else:
        with pytest.raises(RequestSkipped):
            behind.result()
        assert not marker.exists()
