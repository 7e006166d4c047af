"""What rollback refuses, and the exact words it refuses with: each test answers mutants of tests/MUTATION.md.

Local target only: every rollback command goes through the same agent whichever transport carries it
(tests/test_safety_git.py and tests/test_rollback_lock.py run the same paths over sshd).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project, age_lock, git
from fixtures_services import Stack, kill_naming

from deployer.demo.run import process_alive as alive
from deployer.runlog import GENESIS, seal

FIXED_B = "VALUE = 2\n"
BOTH = [{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}]
BOTH_STEPS = ["upload", {"diff_bounds": {"files": 2}}, {"commit": {"message": "m"}}]

pytestmark = pytest.mark.parametrize("target", ["local"], indirect=True)


def run_end(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in events if e["type"] == "run_end")


def rewrite_run_end(project: Project, run_id: str, **git_and_files: Any) -> None:
    """Rewrite the run_end of a log and recompute every hash, as someone rechaining it wholesale would:
    the log still verifies on its own, so only the target's history can tell."""
    events = project.events(run_id)
    end = run_end(events)
    for key, value in git_and_files.items():
        if key == "files":
            end["files"] = value
        else:
            end["git"][key] = value
    prev, lines = GENESIS, []
    for event in events:
        line = seal({**{k: v for k, v in event.items() if k != "line_sha256"}, "prev": prev})
        lines.append(line + b"\n")
        prev = hashlib.sha256(line).hexdigest()
    (project.runs / run_id / "events.jsonl").write_bytes(b"".join(lines))


def apply_both(project: Project) -> str:
    project.write("fix/b.py", FIXED_B)
    return project.applied(files=BOTH, steps=BOTH_STEPS)


def short(commit: str) -> str:
    return commit[:12]


# -- check: files changed since the run's commit --------------------------------------------------------


def test_a_local_edit_since_the_runs_commit_is_refused_word_for_word_unless_forced(target: Project) -> None:
    run_id = apply_both(target)
    after = target.head()
    # Uncommitted edits that are neither the run's content nor the content before it: rolling back would lose them.
    (target.repo / "pkg/a.py").write_text(FIXED_A + "# edited by hand\n")
    (target.repo / "pkg/b.py").write_text("VALUE = 3\n")
    refused = target.deployer("rollback", run_id)
    assert refused.returncode == 1, refused.stderr
    assert (f"pkg/a.py, pkg/b.py changed on the target since run's commit {short(after)} (later commits or local "
            "edits); rolling back would discard them. Check with git log there, or pass --force\n") in refused.stderr
    assert target.head() == after and target.file("pkg/b.py") == "VALUE = 3\n"

    forced = target.deployer("rollback", run_id, "--force")
    assert forced.returncode == 0, forced.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A and target.file("pkg/b.py") == ORIGINAL_B
    assert git(target.repo, "status", "--porcelain") == ""


def test_a_later_commit_is_refused_even_when_the_work_tree_holds_the_content_from_before_the_run(
        target: Project) -> None:
    run_id = target.applied()
    (target.repo / "pkg/a.py").write_text(FIXED_A + "# later hotfix\n")
    git(target.repo, "commit", "-q", "-am", "later hotfix by hand")
    head = target.head()
    # Only the work tree is back at the old content: HEAD still has the hotfix, so this is no earlier rollback.
    (target.repo / "pkg/a.py").write_text(ORIGINAL_A)
    refused = target.deployer("rollback", run_id)
    assert refused.returncode == 1, refused.stderr
    assert "pkg/a.py changed on the target since run's commit" in refused.stderr
    assert target.head() == head and git(target.repo, "show", "HEAD:pkg/a.py") == FIXED_A + "# later hotfix\n"


# -- check_recorded: an earlier rollback counts -----------------------------------------------------------


def test_a_rollback_is_found_behind_a_later_commit_that_names_the_run(target: Project) -> None:
    run_id = target.applied()
    first = target.deployer("rollback", run_id)
    assert first.returncode == 0, first.stderr
    rollback_id = target.newest_run()
    # Newer than the rollback commit, and its message names the run: git log lists it first.
    (target.repo / "README").write_text(f"see run {run_id}\n")
    git(target.repo, "commit", "-q", "-am", f"notes about run {run_id}")
    head = target.head()
    again = target.deployer("rollback", run_id)
    assert again.returncode == 2, again.stderr
    assert f"run {run_id} was already rolled back by run {rollback_id} (commit " in again.stderr
    assert target.head() == head


# -- target_problems: every problem named, word for word ----------------------------------------------------


def test_a_rollback_refuses_a_log_whose_before_and_files_disagree_with_the_commit_one_problem_per_line(
        target: Project) -> None:
    run_id = apply_both(target)
    after = target.head()
    parent = git(target.repo, "rev-parse", "HEAD~1").strip()
    rewrite_run_end(target, run_id, before="0" * 40, files=["README", "pkg/a.py"])
    result = target.deployer("rollback", run_id)
    assert result.returncode == 5, result.stderr
    assert (f"the log of run {run_id} does not match the target's history; refusing to roll back from it:\n"
            f"  the log says the run started from {'0' * 12}, but its commit {short(after)} has parent "
            f"{short(parent)}\n"
            f"  the log names the files README, pkg/a.py, but commit {short(after)} touched pkg/a.py, pkg/b.py\n"
            ) in result.stderr, result.stderr
    assert target.head() == after and target.file("pkg/a.py") == FIXED_A


def test_commits_of_a_run_that_recorded_none_are_each_named_with_their_missing_deployer_log(
        target: Project) -> None:
    target.playbook(steps=["upload", {"diff_bounds": {"files": 7}}, {"commit": {"message": "m"}}])
    failed = target.deployer("apply", "fix.yaml", "--host", "box")
    assert failed.returncode == 1, failed.stderr
    run_id = target.newest_run()
    # Two commits by hand that claim the run (a copied trailer) but carry no Deployer-Log.
    made = []
    for n in (1, 2):
        (target.repo / "README").write_text(f"edit {n}\n")
        git(target.repo, "commit", "-q", "-am", f"edit {n}\n\nDeployer-Run: {run_id}")
        made.append(target.head())
    result = target.deployer("runs", "verify", run_id, "--target")
    assert result.returncode == 5, result.stderr
    newest, older = short(made[1]), short(made[0])
    rewritten = ("on the target has Deployer-Log (none), which matches no beginning of this log: the log was "
                 "rewritten after that commit\n")
    assert (f"error: commit {newest} {rewritten}error: commit {older} {rewritten}"
            f"error: the log records no commit, but the target's history has {newest}, {older} made by this run\n"
            ) == result.stderr, result.stderr


# -- on_failure: rollback, the engine's own -------------------------------------------------------------


def test_an_on_failure_rollback_names_every_file_and_says_no_services_restarted_when_none_are(
        target: Project) -> None:
    target.write("fix/b.py", FIXED_B)
    # diff_bounds after the commit sees zero changes against HEAD: a failure past the commit.
    target.playbook(files=BOTH, steps=["upload", {"commit": {"message": "m"}}, {"diff_bounds": {"files": 2}}],
                    on_failure="rollback")
    before = target.head()
    failed = target.deployer("apply", "fix.yaml", "--host", "box")
    assert failed.returncode == 5, failed.stderr
    revert = target.head()
    assert revert != before
    assert f"Rolled back: commit {short(revert)} restores pkg/a.py, pkg/b.py to {short(before)}\n" in failed.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A and target.file("pkg/b.py") == ORIGINAL_B


def test_an_on_failure_rollback_restarts_the_services_again_and_says_so(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=["upload", {"commit": {"message": "m"}}, "co_restart", {"diff_bounds": {"files": 1}}],
                     on_failure="rollback")
    before = project.head()
    failed = project.deployer("apply", "fix.yaml", "--host", "box")
    assert failed.returncode == 5, failed.stderr
    revert = project.head()
    assert f"Rolled back: commit {short(revert)} restores pkg/a.py to {short(before)}; services restarted\n" \
        in failed.stderr, failed.stderr
    assert project.file("pkg/a.py") == ORIGINAL_A
    # The rollback's own restart: new PIDs after the forward restart's, serving the reverted code.
    restarts = [e["pids"] for e in project.events() if e["type"] == "restart"]
    assert len(restarts) == 2, restarts
    forward, rolled_back = restarts
    assert all(rolled_back[n]["old"] == forward[n]["new"] != rolled_back[n]["new"] for n in forward)
    assert all(alive(pid) for pid in stack.pids().values())
    assert stack.pids() == {n: rolled_back[n]["new"] for n in rolled_back}


# -- a run cut during its own on_failure rollback ------------------------------------------------------------


def cut_during_its_own_rollback(stack: Stack) -> str:
    """An on_failure rollback SIGKILLed after its revert commit, while its restart starts prefill again.

    prefill's start command waits for a gate only when pkg/a.py holds the old code again, i.e. in the
    rollback's restart, never in the forward one: the kill lands at a known point. Returns the run id."""
    project = stack.project
    entered, gate = project.root / "rollback-restart-entered", project.root / "gate"
    prefill = stack.service("prefill")
    prefill["start"] = ["sh", "-c", f"if grep -q 'return 41' '{project.repo}/pkg/a.py'; then touch '{entered}'; "
                                    f"i=0; while [ ! -e '{gate}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); "
                                    "done; fi; exec \"$@\"", "sh", *prefill["start"]]
    stack.configure(prefill=prefill, decode=stack.service("decode"))
    project.playbook(steps=["upload", {"commit": {"message": "m"}}, "co_restart", {"diff_bounds": {"files": 1}}],
                     on_failure="rollback")
    proc = project.popen("apply", "fix.yaml", "--host", "box")
    try:
        deadline = time.monotonic() + 60
        while not entered.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the rollback's restart never began"
            time.sleep(0.02)
        proc.kill()
        proc.communicate(timeout=30)
        # The rollback's start of prefill, held at the gate, dies with the run: released, it would become a
        # server the cut run never recorded, which recover cannot tell from one started by hand (issue 20).
        kill_naming(str(gate))
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
    age_lock(project.repo)
    run_id = project.newest_run()
    subjects = git(project.repo, "log", "--format=%s", "-3").splitlines()
    assert subjects == [f"Roll back answer fix (run {run_id})", "m", "initial"], subjects
    return run_id


@pytest.mark.parametrize("flags", [(), ("--rollback",)], ids=["recover", "recover-rollback"])
def test_a_run_cut_during_its_own_rollback_is_recovered_by_finishing_that_rollback(
        stack: Stack, flags: tuple[str, ...]) -> None:
    # The run had chosen to roll back, so plain `recover` (what the next apply tells the operator to run)
    # finishes that rollback as `recover --rollback` does: the revert commit the run made is kept, not made
    # twice, the services restart on the old code, and the run's commit is still its forward one.
    project = stack.project
    before = project.head()
    run_id = cut_during_its_own_rollback(stack)
    revert, cut_pids = project.head(), stack.pids()
    assert (project.repo / ".git" / "deployer" / "inflight.json").exists()
    recovered = project.deployer("recover", run_id, *flags)
    assert recovered.returncode == 0, recovered.stderr
    recover_id = project.newest_run()
    assert f"run {run_id} -> rolled_back; its commit " in recovered.stdout + recovered.stderr
    assert f"rolled back by {revert[:12]}" in recovered.stdout + recovered.stderr
    assert project.head() == revert and git(project.repo, "rev-parse", "HEAD~2").strip() == before
    assert project.file("pkg/a.py") == ORIGINAL_A
    state = json.loads((project.runs / run_id / "state.json").read_text())
    assert state["phase"] == "rolled_back"
    assert state["git_after"] == git(project.repo, "rev-parse", "HEAD~1").strip()
    restarted = stack.pids()
    assert restarted.keys() == cut_pids.keys() and all(restarted[n] != cut_pids[n] for n in restarted)
    assert all(alive(pid) for pid in restarted.values())
    assert not (project.repo / ".git" / "deployer" / "inflight.json").exists()
    verified = project.deployer("runs", "verify", run_id, "--target")
    assert verified.returncode == 0, verified.stderr
    again = project.deployer("rollback", run_id)
    assert (again.returncode, again.stderr) == (2, f"error: run {run_id} was already rolled back, finished by "
                                                   f"deployer recover (run {recover_id}, commit "
                                                   f"{revert[:12]})\n")
