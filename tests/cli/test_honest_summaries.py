"""A run's summary lists only what was due in it: a drain the run never came to (an unchanged run, a refused
one, one stopped before its commit) is no `drain: not run`; the words a summary uses for a run's state are the
run-state words apply prints. Real services (tests/fixtures_services.py), real runs over the CLI."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
from fixtures_repo import Project, act_when, deployer, hold_lock
from fixtures_services import GAUGE, Stack, code_following

LOCAL = pytest.mark.parametrize("target", ["local"], indirect=True)


def fix_playbook(project: Project, baseline: dict[str, object] | None = None) -> None:
    project.playbook(steps=[{"baseline": {"metric": GAUGE, "interval_s": 0.1, **(baseline or {})}}, "upload",
                            {"commit": {"message": "fix"}}, "co_restart",
                            {"drain": {"metric": GAUGE, "to": 3, "interval_s": 0.1, "within_s": 2}}])


def facts(out: str) -> list[str]:
    """The report's fact lines (indented under `run ...:`)."""
    return [line.strip() for line in out.splitlines() if line.startswith("  ") and not line.startswith("    ")]


@LOCAL
def test_an_unchanged_or_refused_run_lists_no_drain_it_never_came_to(stack: Stack) -> None:
    project = code_following(stack)
    fix_playbook(project)
    first = project.deployer("apply", "fix.yaml", "--host", "box")
    assert first.returncode == 0, first.stdout + first.stderr
    unchanged = project.deployer("apply", "fix.yaml", "--host", "box")
    assert unchanged.returncode == 0 and ": unchanged (exit 0)" in unchanged.stdout, unchanged.stdout
    assert facts(unchanged.stdout) == [], unchanged.stdout
    lock = hold_lock(project)
    locked = project.deployer("apply", "fix.yaml", "--host", "box")
    assert locked.returncode == 3 and ": refused (exit 3)" in locked.stdout, locked.stdout + locked.stderr
    assert facts(locked.stdout) == [], locked.stdout
    shutil.rmtree(lock)
    project.write("fix/a.py", "def answer():\n    return 42\n\n\nFIXED = True\n")
    (project.repo / "pkg" / "a.py").write_text("edited by hand on the target\n")
    dirty = project.deployer("apply", "fix.yaml", "--host", "box")
    assert dirty.returncode == 1 and ": refused (exit 1)" in dirty.stdout, dirty.stdout + dirty.stderr
    assert facts(dirty.stdout) == [], dirty.stdout


@LOCAL
def test_a_run_stopped_by_sigint_before_its_commit_lists_its_baseline_but_no_drain(stack: Stack) -> None:
    project = code_following(stack)
    fix_playbook(project, baseline={"stable_polls": 10_000, "within_s": 600})  # samples until stopped
    before = set(project.runs.iterdir())

    def sampling() -> bool:
        runs = [p / "events.jsonl" for p in set(project.runs.iterdir()) - before]
        return any(log.is_file() and '"type": "sample"' in log.read_text() for log in runs)

    stopped = act_when(project, ["apply", "fix.yaml", "--host", "box"], sampling,
                       lambda proc: proc.send_signal(signal.SIGINT), "the baseline's first sample")
    assert stopped.returncode != 0, stopped.stdout + stopped.stderr
    lines = facts(stopped.stdout)
    assert [line for line in lines if line.startswith("baseline: ")], stopped.stdout
    assert not [line for line in lines if "drain" in line], stopped.stdout


@LOCAL
def test_a_rollback_says_it_gives_one_file_its_content_and_its_plan_says_what_bounds_it(target: Project) -> None:
    run_id = target.applied()  # the default playbook has a diff_bounds step
    preview = target.deployer("plan", "--rollback", run_id, "--host", "box")
    assert preview.returncode == 0, preview.stdout + preview.stderr
    assert "no diff_bounds step" not in preview.stdout, preview.stdout
    assert "bounds: a rollback restores the run's files as they were before it; the playbook's diff_bounds judge " \
           "the fix, not its revert" in preview.stdout, preview.stdout
    rolled = target.deployer("rollback", run_id, "--host", "box")
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    before = next(e for e in target.events(run_id) if e["type"] == "run_end")["git"]["before"]
    said = next(line for line in rolled.stdout.splitlines() if line.startswith("[rollback] commit "))
    assert said.endswith(f" gives pkg/a.py its content at {before[:12]}"), said


def test_the_demo_report_names_its_run_in_the_state_words_apply_ends_with(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    result = deployer("demo", "--workdir", str(workdir), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = next(p.name for p in (workdir / "runs").iterdir())
    report = result.stdout[result.stdout.index("demo report"):]
    assert f"  run       {run_id}: succeeded\n" in report, report
    assert "successful" not in report, report
