"""`runs verify` against each kind of tampering on its own, each aimed at the one check that must catch it.

A careless edit breaks everything at once; these tampers are careful: where a forger could
recompute a line's own hash or re-chain the lines after it, they do, so that a single check
(the line's seal, the chain to the line before, the sequence number, the end of the file)
is left to notice. Each case asserts the line and the kind that `runs verify` names.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from deployer.runlog import GENESIS, RunLogWriter, seal

RUN_ID = "20260101T000000.000Z-abc123"


def write_log(runs: Path) -> list[bytes]:
    """A small real run log (the engine's writer), returned as its lines."""
    writer = RunLogWriter(runs, RUN_ID)
    writer.write({"type": "run_start", "host": "box", "kind": "apply"})
    writer.attach("playbook.yaml", b"name: fix\n")
    for step in ("upload", "diff_bounds", "commit"):
        writer.write({"type": "step_start", "step": step})
        writer.write({"type": "step_end", "step": step, "status": "ok"})
    writer.write({"type": "run_end", "status": "successful", "git": {"before": "a", "after": "b"}})
    writer.close()
    return (runs / RUN_ID / "events.jsonl").read_bytes().splitlines()


def resealed(line: bytes, **changes: object) -> bytes:
    """line with fields changed and its own hash recomputed, as a forger who read runlog.py would."""
    event = {k: v for k, v in json.loads(line).items() if k != "line_sha256"}
    event.update(changes)
    return seal(event)


def rechain(lines: list[bytes]) -> list[bytes]:
    """Every line's `prev` recomputed (and resealed), leaving sequence numbers as they are."""
    out: list[bytes] = []
    prev = GENESIS
    for line in lines:
        out.append(resealed(line, prev=prev))
        prev = hashlib.sha256(out[-1]).hexdigest()
    return out


def edited(lines: list[bytes]) -> bytes:
    lines[3] = lines[3].replace(b'"upload"', b'"uploa5"')  # own hash left stale
    return b"\n".join(lines) + b"\n"


def edited_and_resealed(lines: list[bytes]) -> bytes:
    lines[3] = resealed(lines[3], status="forged")  # its seal fits; line 5's link to it does not
    return b"\n".join(lines) + b"\n"


def removed(lines: list[bytes]) -> bytes:
    return b"\n".join(rechain(lines[:3] + lines[4:])) + b"\n"


def inserted(lines: list[bytes]) -> bytes:
    extra = resealed(lines[3], step="injected")
    return b"\n".join(rechain([*lines[:4], extra, *lines[4:]])) + b"\n"


def reordered(lines: list[bytes]) -> bytes:
    return b"\n".join(rechain([*lines[:3], lines[4], lines[3], *lines[5:]])) + b"\n"


def truncated_line(lines: list[bytes]) -> bytes:
    return b"\n".join(lines)[:-25]  # the run_end line cut mid-write, no final newline


def truncated_end(lines: list[bytes]) -> bytes:
    return b"\n".join(lines[:-1]) + b"\n"  # whole lines, run_end gone


def foreign(lines: list[bytes]) -> bytes:
    lines[3] = resealed(lines[3], run="20260101T000000.000Z-other0")  # a line copied from another run
    return b"\n".join(rechain(lines)) + b"\n"


def garbled(lines: list[bytes]) -> bytes:
    lines[3] = b"not json at all"  # and the lines after it must still be checked
    return b"\n".join(lines) + b"\n"


def garbled_and_rechained(lines: list[bytes]) -> bytes:
    """A garbled line the following lines chain to: only the garbling is reported, not a broken chain."""
    lines[3] = b"not json at all"
    prev = hashlib.sha256(lines[3]).hexdigest()
    for index in range(4, len(lines)):
        lines[index] = resealed(lines[index], prev=prev)
        prev = hashlib.sha256(lines[index]).hexdigest()
    return b"\n".join(lines) + b"\n"


def renumbered(first: int, last: int, shift: int) -> list[str]:
    return [f"line {n}: sequence number {n - 1 - shift} where {n - 1} was expected (a line was removed or inserted)"
            for n in range(first, last + 1)]


NO_END = ("no run_end event: the log was truncated, or the run was killed before it ended (then `deployer recover` "
          "with this run's id ends it)")
NO_CHAIN_5 = "line 5: does not chain to the line before it (edited or removed line)"

# The complete list of problems `runs verify` must print, in order, one per line.
CASES: dict[str, tuple[Callable[[list[bytes]], bytes], list[str]]] = {
    "edited": (edited, ["line 4: its content does not match its own hash (edited line)", NO_CHAIN_5]),
    "edited and resealed": (edited_and_resealed, [NO_CHAIN_5]),
    "removed": (removed, renumbered(4, 8, shift=-1)),
    "inserted": (inserted, renumbered(5, 10, shift=1)),
    "reordered": (reordered, ["line 4: sequence number 4 where 3 was expected (a line was removed or inserted)",
                              "line 5: sequence number 3 where 4 was expected (a line was removed or inserted)"]),
    "foreign": (foreign, ["line 4: belongs to run '20260101T000000.000Z-other0'"]),
    "garbled": (garbled, ["line 4: not valid JSON", NO_CHAIN_5]),
    "garbled and rechained": (garbled_and_rechained, ["line 4: not valid JSON"]),
    "truncated line": (truncated_line, ["the last line is cut short (truncated)", "line 9: not valid JSON", NO_END]),
    "truncated at a line end": (truncated_end, [NO_END]),
}


def verify(runs: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "deployer", "runs", "verify", RUN_ID, "--runs-dir", str(runs)],
                          capture_output=True, text=True, timeout=60, env=env)


def test_an_untouched_log_verifies(tmp_path: Path) -> None:
    write_log(tmp_path)
    result = verify(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("kind", list(CASES))
def test_each_kind_of_tampering_is_named_with_its_line(tmp_path: Path, kind: str) -> None:
    tamper, expected = CASES[kind]
    events = tmp_path / RUN_ID / "events.jsonl"
    events.write_bytes(tamper(write_log(tmp_path)))
    result = verify(tmp_path)
    assert result.returncode == 5, result.stdout + result.stderr
    assert [line.removeprefix("error: ") for line in result.stderr.splitlines()] == expected


def test_verifying_a_run_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    write_log(tmp_path)
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    result = subprocess.run([sys.executable, "-m", "deployer", "runs", "verify", "nosuch", "--runs-dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"error: no run 'nosuch' in {tmp_path} (see 'deployer runs list')"]


@pytest.mark.parametrize(("change", "problem"), [
    ("edit", "artifact playbook.yaml was changed after the run recorded it"),
    ("remove", "artifact playbook.yaml is missing"),
])
def test_a_changed_or_missing_artifact_is_named(tmp_path: Path, change: str, problem: str) -> None:
    write_log(tmp_path)
    artifact = tmp_path / RUN_ID / "playbook.yaml"
    if change == "edit":
        artifact.write_bytes(b"name: forged\n")
    else:
        artifact.unlink()
    result = verify(tmp_path)
    assert result.returncode == 5
    assert [line.removeprefix("error: ") for line in result.stderr.splitlines()] == [problem]


def rollback_run(runs: Path, run_id: str, *, ended: bool) -> None:
    writer = RunLogWriter(runs, run_id)
    writer.write({"type": "run_start", "host": "box", "kind": "rollback", "rollback_of": RUN_ID})
    if ended:
        writer.write({"type": "run_end", "status": "successful"})
    writer.close()


def test_a_rollback_link_removed_from_the_end_is_named_and_a_present_one_verifies(tmp_path: Path) -> None:
    write_log(tmp_path)
    by = "20260102T000000.000Z-def456"
    rollback_run(tmp_path, by, ended=True)
    rollback_run(tmp_path, "20260103T000000.000Z-aaa111", ended=False)  # still going: nothing to link yet
    missing = verify(tmp_path)
    assert missing.returncode == 5
    assert [line.removeprefix("error: ") for line in missing.stderr.splitlines()] == [
        f"run {by} rolled this run back, but the rolled_back_by line for it is missing "
        "(removed from the end of the log?)"]
    writer = RunLogWriter.reopen(tmp_path, RUN_ID)
    writer.write({"type": "rolled_back_by", "by": by, "status": "successful"})
    writer.close()
    linked = verify(tmp_path)
    assert linked.returncode == 0, linked.stderr


def test_an_artifact_is_kept_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A kill between its creation and its last byte cannot be timed from here: a write that fails stands in.
    writer = RunLogWriter(tmp_path, RUN_ID)
    real_fdopen = os.fdopen

    class Cut:
        def __init__(self, handle: object) -> None:
            self.handle = handle

        def __enter__(self) -> Cut:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()  # type: ignore[attr-defined]

        def write(self, data: bytes) -> None:
            self.handle.write(data[:3])  # type: ignore[attr-defined]
            raise OSError("cut")

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: Cut(real_fdopen(fd, mode)))
    with pytest.raises(OSError, match="cut"):
        writer.attach("playbook.yaml", b"name: fix\n")
    assert not (writer.dir / "playbook.yaml").exists()
    monkeypatch.undo()
    writer.attach("diff.txt", b"+x\n")
    assert (writer.dir / "diff.txt").read_bytes() == b"+x\n"
    assert sorted(p.name for p in writer.dir.iterdir() if not p.name.startswith(".playbook")) == [
        "diff.txt", "events.jsonl"]


def test_a_last_line_a_kill_cut_short_is_dropped_by_the_run_that_ends_the_log_which_then_verifies(
        tmp_path: Path) -> None:
    lines = write_log(tmp_path)
    log = tmp_path / RUN_ID / "events.jsonl"
    whole = b"\n".join(lines[:-1]) + b"\n"  # a run killed while it wrote its run_end, as recover finds it
    torn = lines[-1][:-10]  # all but its end: no line written after shares it (its first bytes may: seq and time)
    log.write_bytes(whole + torn)
    assert "the last line is cut short (truncated)" in verify(tmp_path).stderr
    writer = RunLogWriter.reopen(tmp_path, RUN_ID)
    writer.write({"type": "run_end", "status": "failed", "error": "the run was cut; it was ended by deployer recover"})
    writer.close()
    result = verify(tmp_path)
    assert result.returncode == 0, result.stderr
    data = log.read_bytes()
    assert data.startswith(whole) and torn not in data
    dropped = json.loads(data.splitlines()[len(lines) - 1])
    assert dropped["type"] == "torn_line_dropped" and dropped["bytes"] == len(torn)
    assert dropped["sha256"] == hashlib.sha256(torn).hexdigest()
    assert writer.sha256() == hashlib.sha256(data).hexdigest()  # what a commit's Deployer-Log would name
