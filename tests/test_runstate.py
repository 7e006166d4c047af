"""The run's state machine and its write-ahead record, on their own (no target needed but in the last test)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from pathlib import Path

import pytest
from fixtures_repo import Project, git

from deployer.cli import main
from deployer.runstate import (
    FORWARD,
    TERMINAL,
    FileRecord,
    Phase,
    RunRecord,
    RunRecordError,
    RunState,
    allowed,
    ensure_headroom,
)


def new_record(tmp_path: Path) -> RunRecord:
    return RunRecord(tmp_path, RunState(run_id="r1", host="h", operator="me@here", repo="/srv/repo"))


def test_the_forward_chain_is_allowed_step_by_step_and_never_backwards() -> None:
    for old, new in itertools.pairwise(FORWARD):
        assert allowed(old, new)
        assert not allowed(new, old) or {old, new} in ({Phase.changing, Phase.changed},
                                                       {Phase.restarting, Phase.verifying},
                                                       {Phase.locked, Phase.changing})
    assert not allowed(Phase.committed, Phase.changing)
    # The one way back: a chain sent with the lock whose premise the agent answered did not hold (run/whole.py).
    assert allowed(Phase.changing, Phase.locked) and not allowed(Phase.changed, Phase.locked)


def test_a_terminal_state_has_no_way_out() -> None:
    for end in TERMINAL:
        assert not any(allowed(end, other) for other in Phase)


def test_a_failure_before_the_commit_restores_and_after_it_keeps_or_rolls_back() -> None:
    assert allowed(Phase.changing, Phase.failed_restored)
    assert allowed(Phase.committing, Phase.failed_restored)  # the commit step undoes its own commit
    assert allowed(Phase.restarting, Phase.failed_restored)  # a restart-only playbook commits nothing
    assert not allowed(Phase.rolling_back, Phase.failed_restored)
    assert allowed(Phase.verifying, Phase.failed_committed)
    assert not allowed(Phase.changed, Phase.failed_committed)
    assert allowed(Phase.verifying, Phase.rolling_back) and allowed(Phase.rolling_back, Phase.rolled_back)
    assert not allowed(Phase.changed, Phase.rolled_back)
    assert all(allowed(p, Phase.interrupted) for p in Phase if p not in TERMINAL)


def test_advance_writes_the_state_before_returning_and_records_history(tmp_path: Path) -> None:
    record = new_record(tmp_path)
    record.advance(Phase.locked, "t1", git_dir="/srv/repo/.git")
    on_disk = json.loads((tmp_path / "state.json").read_text())
    assert on_disk["phase"] == "locked" and on_disk["git_dir"] == "/srv/repo/.git"
    assert [h["phase"] for h in on_disk["history"]] == ["locked"]
    assert RunRecord.load(tmp_path) is not None and RunRecord.load(tmp_path).state.phase == Phase.locked  # type: ignore[union-attr]
    assert oct((tmp_path / "state.json").stat().st_mode & 0o777) == "0o600"


def test_advance_refuses_a_transition_the_machine_does_not_have_and_keeps_the_old_record(tmp_path: Path) -> None:
    record = new_record(tmp_path)
    record.advance(Phase.locked, "t1")
    with pytest.raises(ValueError, match="locked -> rolled_back"):
        record.advance(Phase.rolled_back, "t2")
    assert json.loads((tmp_path / "state.json").read_text())["phase"] == "locked"


def test_kept_pre_run_bytes_come_back_only_while_their_hash_matches(tmp_path: Path) -> None:
    record = new_record(tmp_path)
    name = record.keep_before(0, b"old bytes\n")
    rec = FileRecord(dest="a.py", path="/srv/repo/a.py", existed=True, tracked=True,
                     sha256=hashlib.sha256(b"old bytes\n").hexdigest(), new_sha256="x", before=name)
    assert record.before_bytes(rec) == b"old bytes\n"
    (tmp_path / name).write_bytes(b"tampered\n")
    assert record.before_bytes(rec) is None


def test_a_full_run_dir_is_a_typed_error_and_leaves_no_temp_file(tmp_path: Path) -> None:
    # /dev/full answers every write with ENOSPC: a real full disk, without mounting one.
    record = RunRecord(tmp_path, RunState(run_id="r1", host="h", operator="o", repo="/r"))
    (tmp_path / ".state.json.tmp").symlink_to("/dev/full")
    with pytest.raises(RunRecordError, match="No space left"):
        record.advance(Phase.locked, "t1")
    assert not (tmp_path / "state.json").exists()


def test_headroom_is_checked_before_a_run_starts(tmp_path: Path) -> None:
    ensure_headroom(tmp_path / "runs", 1024)
    with pytest.raises(RunRecordError, match="KiB free"):
        ensure_headroom(tmp_path / "runs", 1 << 60)
    blocked = tmp_path / "file"
    blocked.write_text("not a dir")
    with pytest.raises(RunRecordError, match="not writable"):
        ensure_headroom(blocked / "runs", 1)


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_the_run_log_is_on_disk_before_each_state_record_and_before_a_commit_names_its_hash(
        target: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a machine crash tells a written log from an fsynced one, and a test cannot crash the machine: os.fsync
    # is watched here (and still called) to check what is on disk when. The events are not fsynced one by one.
    synced: list[tuple[str, int, int]] = []  # file name, its size when fsynced, the run log's size then
    real_fsync = os.fsync

    def watched(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        log = next((p / "events.jsonl" for p in (path, path.parent) if (p / "events.jsonl").is_file()), None)
        synced.append((path.name, os.fstat(fd).st_size, log.stat().st_size if log else -1))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watched)
    monkeypatch.chdir(target.root)
    monkeypatch.setenv("DEPLOYER_INVENTORY", str(target.inventory))
    monkeypatch.setenv("DEPLOYER_RUNS_DIR", str(target.runs))
    target.playbook()
    with pytest.raises(SystemExit) as exited:
        main(["apply", "fix.yaml", "--host", "box"])
    assert exited.value.code == 0
    log_syncs = [size for name, size, _ in synced if name == "events.jsonl"]
    records = [(index, log_size) for index, (name, _, log_size) in enumerate(synced) if name == ".state.json.tmp"]
    assert len(records) >= 4  # preparing, locked, changing, committing, ...
    for index, log_size in records:
        durable = [0, *(size for name, size, _ in synced[:index] if name == "events.jsonl")][-1]
        assert durable == log_size, f"fsync {index}, a state record, is ahead of the run log"
    events = (next(target.runs.iterdir()) / "events.jsonl").read_bytes()
    assert log_syncs[-1] == len(events)  # closed durable
    assert len(log_syncs) < events.count(b"\n")
    message = git(target.repo, "log", "-1", "--format=%B")
    anchor = re.search(r"Deployer-Log: sha256:([0-9a-f]{64})", message)
    assert anchor is not None, message
    named = next(n for n in range(len(events) + 1) if hashlib.sha256(events[:n]).hexdigest() == anchor[1])
    assert named in log_syncs  # the bytes the trailer names were on disk before the commit was made

