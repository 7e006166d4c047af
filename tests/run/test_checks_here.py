"""What can fail without the target fails before the run touches it, whatever order the playbook lists.

A fix that does not compile, or whose projected diff breaks the playbook's bounds, is found from the shipped
bytes and the target's HEAD alone; a baseline listed first (whose storm loads a live server) must never run
for it. The scrapes are counted by a real HTTP server on 127.0.0.1 that the agent reaches over its loopback.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_repo import Project, tree_snapshot
from fixtures_services import GAUGE, Served, metrics_text, served

from deployer.steps.playbook import load_playbook

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def metrics() -> Iterator[Served]:
    with served(lambda path: metrics_text(1.0).encode()) as server:
        yield server


def url_of(server: Served) -> str:
    return f"http://127.0.0.1:{server.port}/metrics"


def baseline_first(target: Project, metrics: Served, bounds: dict[str, object]) -> None:
    target.playbook(steps=[
        {"baseline": {"metric": GAUGE, "url": url_of(metrics), "interval_s": 0.1, "stable_polls": 1}},
        "local_compile", "upload", "remote_compile", {"diff_bounds": bounds},
        {"commit": {"message": "pkg: answer is 42"}}])


def step_starts(target: Project) -> list[str]:
    run = next(target.runs.iterdir())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return [e["step"] for e in events if e["type"] == "step_start"]


def test_a_fix_that_does_not_compile_fails_before_a_baseline_listed_first_reaches_the_target(
        target: Project, metrics: Served) -> None:
    target.write("fix/a.py", "def answer(:\n    return 42\n")
    baseline_first(target, metrics, {"files": 1})
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    # The playbook line of the step that judged it, the file and line to fix, and what was left.
    assert "fix.yaml:" in result.stderr and "step 'local_compile' failed" in result.stderr
    assert "fix/a.py:1:" in result.stderr and "shipped as pkg/a.py" in result.stderr
    assert "nothing on it was changed" in result.stderr
    assert metrics.hits == 0  # the baseline never scraped, let alone stormed
    assert step_starts(target) == []
    assert tree_snapshot(target.repo) == snapshot
    # A failed step, not a refusal, that changed nothing there, so restored nothing: runs list says `failed`.
    [row] = json.loads(target.deployer("runs", "list", "--json").stdout)["runs"]
    assert row["state"] == "failed"


def test_a_projected_diff_outside_the_bounds_fails_before_a_baseline_listed_first(
        target: Project, metrics: Served) -> None:
    baseline_first(target, metrics, {"files": 3})
    snapshot = tree_snapshot(target.repo)
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "step 'diff_bounds' failed: files 1 outside 3" in result.stderr
    assert metrics.hits == 0 and step_starts(target) == []
    assert tree_snapshot(target.repo) == snapshot


def test_a_fix_within_its_bounds_still_runs_the_baseline_first(target: Project, metrics: Served) -> None:
    baseline_first(target, metrics, {"files": 1, "insertions": [1, 10], "deletions": [0, 2]})
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert metrics.hits >= 1
    assert step_starts(target)[:2] == ["baseline", "local_compile"]


def test_plan_reports_a_fix_that_does_not_compile_and_exits_1(target: Project) -> None:
    target.write("fix/a.py", "def answer(:\n    return 42\n")
    target.playbook()
    plan = target.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 1
    assert "compile: FAIL" in plan.stdout and "fix/a.py:1:" in plan.stdout
    as_json = json.loads(target.deployer("plan", "fix.yaml", "--host", "box", "--json").stdout)
    assert as_json["exit_code"] == 1 and "compile: FAIL" in as_json["error"]
    assert as_json["compile"] and as_json["compile"][0].startswith("fix/a.py:1:")


def test_plan_says_the_shipped_python_compiles_here(target: Project) -> None:
    target.playbook()
    plan = target.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "compile: ok" in plan.stdout


def test_the_shipped_playbooks_are_plain_files_that_survive_being_copied(tmp_path: Path) -> None:
    # Users copy the folder; a link into the package would dangle there.
    shipped = REPO / "playbooks"
    links = [p for p in shipped.rglob("*") if p.is_symlink()]
    assert links == []
    copy = tmp_path / "my-playbooks"
    shutil.copytree(shipped, copy, symlinks=True)
    loaded, _ = load_playbook(copy / "kvpoll-fix.yaml")
    assert sorted(loaded.sources) == sorted(f.dest for f in loaded.model.files)
    # The demo's package data names these very files (links that a wheel build turns into copies), so the
    # demo and the example can never drift apart.
    package = REPO / "deployer" / "demo" / "playbook"
    assert sorted(p.name for p in package.iterdir()) == sorted(p.name for p in shipped.iterdir())
    for entry in package.iterdir():
        assert entry.resolve() == (shipped / entry.name).resolve(), entry


def test_the_shipped_playbook_compiles_its_fix_before_the_baseline_storm() -> None:
    _, steps = load_playbook(REPO / "playbooks" / "kvpoll-fix.yaml")
    kinds = [s.kind for s in steps]
    assert kinds.index("local_compile") < kinds.index("baseline")


def checks_of(target: Project) -> tuple[int, dict[str, dict[str, object]]]:
    result = target.deployer("check", "--host", "box", "fix.yaml", "--json")
    report = json.loads(result.stdout)
    return result.returncode, {c["name"]: c for c in report["checks"]}


def test_check_with_a_playbook_reports_a_fix_that_does_not_compile_and_a_projected_diff_out_of_bounds(
        target: Project) -> None:
    target.write("fix/a.py", "def answer(:\n    return 42\n")
    target.playbook(steps=["local_compile", "upload", {"diff_bounds": {"files": 3}}])
    snapshot = tree_snapshot(target.repo)
    code, checks = checks_of(target)
    assert code == 1
    assert checks["compile"]["status"] == "fail" and "fix/a.py:1:" in str(checks["compile"]["detail"])
    assert checks["bounds"]["status"] == "fail" and "files 1 outside 3" in str(checks["bounds"]["detail"])
    assert tree_snapshot(target.repo) == snapshot


def test_check_with_a_playbook_says_the_fix_compiles_and_is_within_its_bounds(target: Project) -> None:
    target.playbook()
    code, checks = checks_of(target)
    assert code == 0, checks
    assert checks["compile"]["status"] == "ok" and checks["bounds"]["status"] == "ok"
    assert "1 file changed" in str(checks["bounds"]["detail"])
