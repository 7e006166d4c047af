"""`recover --host` reads the intent record on the target, which anyone who can write the repo can write.

Each test leaves what a killed run leaves (its intent record and its stale lock, made by hand here so the
record can be tampered with field by field), tampers with one field, and runs `recover --host` from a runs
dir that knows nothing of the run: over the real sshd, plainly and under `become` (the fake sudo; as root,
which is what become means). Every tamper is refused with exit 6, nothing is touched, and the record and the
lock stay on the target for a person to look at.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, work_tree

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]
pytestmark = pytest.mark.parametrize("target", ["ssh"], indirect=True)

RUN = "20250101T000000.000Z-abcdef"
VICTIM = "not yours\n"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Cut:
    """A target with a killed run's leftovers, and a place outside the repo that must stay as it is."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.git_dir = project.repo / ".git"
        self.record = self.git_dir / "deployer" / "inflight.json"
        self.lock = self.git_dir / "deployer.run.lock"
        self.outside = project.root / "outside"
        self.outside.mkdir()
        self.victim = self.outside / "victim.py"
        self.victim.write_text(VICTIM)
        self.victim.chmod(0o600)
        self.empty_dir = self.outside / "empty"
        self.empty_dir.mkdir()
        # What the cut run had uploaded: the new bytes, owner and mode kept.
        (project.repo / "pkg/a.py").write_text(FIXED_A)

    def file(self, **fields: Any) -> dict[str, Any]:
        """pkg/a.py as the run recorded it: existed, tracked, its true pre-run sha256, owner and mode."""
        st = (self.project.repo / "pkg/a.py").stat()
        entry = {"dest": "pkg/a.py", "path": str(self.project.repo / "pkg/a.py"), "existed": True, "tracked": True,
                 "sha256": sha(ORIGINAL_A), "new_sha256": sha(FIXED_A), "new_blob": None, "mode": 0o644,
                 "uid": st.st_uid, "gid": st.st_gid, "new_dirs": [], "before": None}
        return {**entry, **fields}

    def leave(self, *files: dict[str, Any]) -> None:
        """The intent record naming these files, and the run's lock, its heartbeat long stale."""
        self.record.parent.mkdir(exist_ok=True)
        self.record.write_text(json.dumps({
            "run_id": RUN, "operator": f"{getpass.getuser()}@{socket.gethostname()}", "host": "box",
            "started": "2025-01-01T00:00:00.000Z", "head_before": self.project.head(),
            "trailer": f"Deployer-Run: {RUN}", "files": list(files)}, indent=1))
        own = self.git_dir / f"deployer.run.lock.{RUN}"
        own.mkdir()
        (own / "info.json").write_text(json.dumps({"run_id": RUN, "operator": "someone@elsewhere", "pid": 1,
                                                   "host": "box", "ttl_s": 120, "started": "2025-01-01T00:00:00"}))
        (own / "heartbeat").touch()
        old = time.time() - 3600
        os.utime(own / "heartbeat", (old, old))
        self.lock.symlink_to(own.name)
        self.snapshot = (self.record.read_bytes(), work_tree(self.project.repo), self.outside_state())

    def outside_state(self) -> dict[str, str]:
        return {str(p.relative_to(self.outside)): f"{p.read_text() if p.is_file() else 'dir'} "
                f"{p.stat().st_mode:o} {p.stat().st_uid}:{p.stat().st_gid}"
                for p in sorted(self.outside.rglob("*"))}

    def recover(self) -> str:
        done = self.project.deployer("recover", "--host", "box", "--runs-dir", str(self.project.root / "other"))
        assert done.returncode == 6, done.stdout + done.stderr
        return done.stderr

    def assert_untouched(self) -> None:
        record, tree, outside = self.snapshot
        assert self.outside_state() == outside, "something outside the repo was changed"
        assert work_tree(self.project.repo) == tree, "the repo's files were changed"
        st = (self.project.repo / "pkg/a.py").stat()
        assert st.st_mode & 0o7777 == 0o644
        assert self.record.read_bytes() == record, "the intent record was not kept as it was"
        assert self.lock.is_symlink() and (self.lock / "info.json").is_file(), "the lock was not kept"


@pytest.fixture(params=[False, True], ids=["plain", "become"])
def cut(target: Project, request: pytest.FixtureRequest) -> Iterator[Cut]:
    target.write_inventory(become=request.param)
    yield Cut(target)


def assert_refused(said: str, field: str) -> None:
    said = " ".join(said.split())
    assert "inflight.json on the target is refused" in said and f"{field} is " in said, said
    assert "Nothing was changed" in said and "deployer lock release --host box --force" in said, said


def test_a_recover_refuses_a_new_file_whose_path_is_outside_the_repo(cut: Cut) -> None:
    # Would have deleted the outside file ("removed pkg/new.py", exit 0).
    cut.leave(cut.file(dest="pkg/new.py", path=str(cut.victim), existed=False, tracked=False, sha256=None,
                       new_sha256=sha(VICTIM), mode=None, uid=None, gid=None))
    assert_refused(cut.recover(), "files[0].path")
    cut.assert_untouched()


def test_a_recover_refuses_to_write_outside_the_repo_with_a_setuid_mode(cut: Cut) -> None:
    # The true pre-run sha256 and an outside path: would have written a.py's old bytes there, mode 04777.
    cut.leave(cut.file(path=str(cut.victim), mode=0o4777))
    assert_refused(cut.recover(), "files[0].mode")
    cut.assert_untouched()
    # The path alone is refused too.
    cut.record.write_text(cut.record.read_text().replace(f'"mode": {0o4777}', f'"mode": {0o644}'))
    cut.snapshot = (cut.record.read_bytes(), *cut.snapshot[1:])
    assert_refused(cut.recover(), "files[0].path")
    cut.assert_untouched()


def test_a_recover_refuses_new_dirs_outside_the_work_tree(cut: Cut) -> None:
    cut.leave(cut.file(dest="pkg/newdir/x.py", path=str(cut.project.repo / "pkg/newdir/x.py"), existed=False,
                       tracked=False, sha256=None, mode=None, uid=None, gid=None, new_dirs=[str(cut.empty_dir)]))
    assert_refused(cut.recover(), "files[0].new_dirs")
    cut.assert_untouched()
    assert cut.empty_dir.is_dir()


def test_a_recover_refuses_a_setuid_mode_for_a_repo_file(cut: Cut) -> None:
    cut.leave(cut.file(mode=0o4755))
    assert_refused(cut.recover(), "files[0].mode")
    cut.assert_untouched()


def test_a_recover_refuses_an_owner_the_file_does_not_have(cut: Cut) -> None:
    cut.leave(cut.file(uid=4242, gid=4343))
    assert_refused(cut.recover(), "files[0].uid/gid")
    cut.assert_untouched()
    st = (cut.project.repo / "pkg/a.py").stat()
    assert (st.st_uid, st.st_gid) != (4242, 4343)


def test_a_recover_refuses_a_sha256_naming_bytes_git_does_not_hold_at_head(cut: Cut) -> None:
    # The record says the run's new bytes were the pre-run ones: they would have been kept, exit 0.
    cut.leave(cut.file(sha256=sha(FIXED_A)))
    assert_refused(cut.recover(), "files[0].sha256")
    cut.assert_untouched()
    assert cut.project.file("pkg/a.py") == FIXED_A


def test_a_recover_refuses_a_dest_through_a_symlink_out_of_the_repo(cut: Cut) -> None:
    (cut.project.repo / "pkg/out").symlink_to(cut.outside)
    cut.leave(cut.file(dest="pkg/out/victim.py", path=str(cut.project.repo / "pkg/out/victim.py"), existed=False,
                       tracked=False, sha256=None, new_sha256=sha(VICTIM), mode=None, uid=None, gid=None))
    assert_refused(cut.recover(), "files[0].dest")
    cut.assert_untouched()


def test_a_recover_refuses_a_dest_inside_the_git_dir(cut: Cut) -> None:
    description = cut.git_dir / "description"
    kept = description.read_bytes()
    cut.leave(cut.file(dest=".git/description", path=str(description), existed=False, tracked=False,
                       sha256=None, mode=None, uid=None, gid=None))
    assert_refused(cut.recover(), "files[0].dest")
    cut.assert_untouched()
    assert description.read_bytes() == kept


def test_a_refused_value_is_shown_with_its_control_characters_escaped(cut: Cut) -> None:
    cut.leave(cut.file(dest="pkg/\x1b]0;owned\x07\x1b[2J.py"))
    said = cut.recover()
    assert "\x1b" not in said and "\x07" not in said
    assert "\\x1b]0;owned\\x07\\x1b[2J" in said
    cut.assert_untouched()


def test_a_genuine_record_still_recovers_from_gits_objects(cut: Cut) -> None:
    cut.leave(cut.file())
    done = cut.project.deployer("recover", "--host", "box", "--runs-dir", str(cut.project.root / "other"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert cut.project.file("pkg/a.py") == ORIGINAL_A
    assert not cut.record.exists() and not cut.lock.exists()
    assert cut.outside_state() == cut.snapshot[2]
