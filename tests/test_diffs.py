"""The counts made here before a run (one local git for every file) equal what git counts in the repo after it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from deployer import diffs

OLD = {
    "pkg/a.py": b"def answer():\n    return 41\n",
    "pkg/same.py": b"unchanged = True\n",
    "pkg/blob.bin": b"\0\1\2old",
    "pkg/emptied.py": b"one\ntwo\nthree\n",
    "odd\tname\n.py": b"x = 1\n",
}
NEW = {
    "pkg/a.py": b"def answer():\n    return 42\n\n\ndef extra():\n    return 'new'\n",
    "pkg/same.py": OLD["pkg/same.py"],
    "pkg/blob.bin": b"\0\1\2new!",
    "pkg/emptied.py": b"",
    "odd\tname\n.py": b"x = 2\ny = 3\n",
    "pkg/brand_new.py": b"print('hi')\n" * 3,
}


def git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def test_one_git_counts_every_file_as_the_commit_does(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for rel, data in OLD.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "old")
    for rel, data in NEW.items():
        (repo / rel).write_bytes(data)
    git(repo, "add", "-A")
    counted = {s.path: s for s in diffs.parse_numstat(
        git(repo, "diff", "--cached", "--numstat", "-z", "--no-renames", diffs.DIFF_ALGORITHM, "HEAD").decode())}

    changes = [(rel, OLD.get(rel), data) for rel, data in NEW.items()]
    projected = diffs.numstats(changes)

    assert [s.path for s in projected] == list(NEW)  # in the order given, every file named as given
    assert {s.path: s for s in projected if s != diffs.FileStat(s.path, 0, 0)} == counted
    assert projected[1] == diffs.FileStat("pkg/same.py", 0, 0)  # unchanged bytes: listed by neither
    assert projected[2].binary and counted["pkg/blob.bin"].binary
    assert projected[5] == diffs.FileStat("pkg/brand_new.py", 3, 0)
    assert diffs.numstat("pkg/a.py", OLD["pkg/a.py"], NEW["pkg/a.py"]) == counted["pkg/a.py"]
    assert diffs.numstats([]) == []
