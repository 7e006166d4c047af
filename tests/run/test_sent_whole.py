"""The chain up to the commit sent whole, with the lock (run/whole.py): what a premise that does not hold leaves
(nothing; the run goes on as one that sent the reads alone), and what recover makes of a run cut inside the chain
before this machine heard a word of it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures_memory import MemoryTarget
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git, work_tree
from test_recover import kill_marker, start_and_kill

from deployer.errors import AgentLost
from deployer.run.ahead import Ahead
from deployer.run.lease import Lease
from deployer.run.whole import Whole
from deployer.runlog import utc_now
from deployer.runstate import Phase, RunRecord, RunState
from deployer.steps.playbook import parse_playbook

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]


def events(project: Project) -> list[dict[str, Any]]:
    return project.events()


def kinds(project: Project) -> list[str]:
    return [e["type"] for e in events(project)]


def state_of(project: Project) -> dict[str, Any]:
    return dict(json.loads((project.runs / project.newest_run() / "state.json").read_text()))


def test_a_dirty_dest_declines_the_premise_and_is_refused_as_before_with_nothing_changed(target: Project) -> None:
    target.playbook()
    (target.repo / "pkg/a.py").write_text(ORIGINAL_A + "# local edit\n")
    tree, head = work_tree(target.repo), target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 1, result.stderr
    assert "the target has uncommitted changes in pkg/a.py; nothing was changed" in result.stderr
    assert work_tree(target.repo) == tree and target.head() == head
    assert not (target.repo / ".git/deployer/inflight.json").exists()
    found = kinds(target)
    assert found.index("sent_whole") < found.index("lock_acquired") < found.index("sent_whole_declined")
    declined = next(e for e in events(target) if e["type"] == "sent_whole_declined")
    assert "skipped" in declined["reason"]  # the status read was told to print nothing: the premise never ran
    state = state_of(target)
    assert state["phase"] == "failed_restored" and state["files"] == [] and state["sent_ahead"] == []
    assert [t["phase"] for t in state["history"]] == ["locked", "changing", "locked", "failed_restored"]


def test_a_target_without_a_git_identity_goes_in_two_round_trips_and_commits_as_the_operator(
        target: Project) -> None:
    git(target.repo, "config", "--unset", "user.email")
    target.extra_env["GIT_CONFIG_GLOBAL"] = "/dev/null"  # a local target's agent reads this machine's config
    target.playbook()
    before = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert target.file("pkg/a.py") == FIXED_A and git(target.repo, "rev-parse", "HEAD~1").strip() == before
    found = kinds(target)
    assert "sent_whole_declined" in found and found.count("sent_ahead") == 2  # once whole, once after the upload
    assert git(target.repo, "log", "-1", "--format=%ae").strip() == state_of(target)["operator"]


def test_a_file_that_already_has_its_bytes_declines_the_premise_and_the_run_ends_unchanged(target: Project) -> None:
    target.write("fix/a.py", ORIGINAL_A)
    target.playbook()
    head = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stderr
    assert f"run {target.newest_run()}: unchanged (exit 0)" in result.stdout and target.head() == head
    declined = next(e for e in events(target) if e["type"] == "sent_whole_declined")
    assert "holds its new bytes already" in declined["reason"]
    # Nothing sent whole ran there: not a step of it, nor a commit.
    assert not [e for e in events(target) if e["type"] in ("step_start", "commit")]
    assert [t["phase"] for t in state_of(target)["history"]] == ["locked", "changing", "locked", "unchanged"]


def test_a_read_that_fails_preflight_fails_the_premise_too_and_nothing_changes(target: Project) -> None:
    # A dest larger than a read may bring back: preflight fails on it, so the chain behind it must not run.
    big = "x = 1\n" * (3 << 20)  # 18 MiB, over the 16 MiB a get returns
    (target.repo / "pkg/big.py").write_text(big)
    git(target.repo, "add", "pkg/big.py")
    git(target.repo, "commit", "-qm", "big")
    target.write("fix/big.py", "y = 2\n")  # small: a src over 16 MiB is refused before anything connects
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/big.py", "dest": "pkg/big.py"}],
                    steps=["upload", {"commit": {"message": "m"}}])
    tree, head = work_tree(target.repo), target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode != 0 and "larger than max_bytes" in result.stderr, result.stderr
    assert work_tree(target.repo) == tree and target.head() == head
    assert "sent_whole_declined" in kinds(target) and state_of(target)["phase"] == "failed_restored"
    assert not (target.repo / ".git/deployer/inflight.json").exists()


def test_allow_dirty_is_never_sent_whole_and_ships_over_local_edits_as_before(target: Project) -> None:
    # Its pre-run bytes are in no git object: they are read, and kept here, before anything changes.
    (target.repo / "pkg/b.py").write_text("VALUE = 2\n")
    target.playbook()
    result = target.deployer("apply", "fix.yaml", "--host", "box", "--allow-dirty")
    assert result.returncode == 0, result.stderr
    assert "sent_whole" not in kinds(target) and target.file("pkg/a.py") == FIXED_A


BLOCKING_GIT = """#!/bin/sh
# The target's git, blocking for good in the identity read (the last guard before the premise).
case "$*" in *"config user.email"*) echo $$ > "{marker}"; while :; do sleep 0.05; done;; esac
exec {git} "$@"
"""


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_cut_before_the_premise_ran_recover_finds_nothing_changed(target: Project, tmp_path: Path) -> None:
    # The local transport's agent runs with deployer's own PATH: a git there that blocks holds the chain back.
    bin_dir, marker = tmp_path / "bin", tmp_path / "identity.reached"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(BLOCKING_GIT.format(marker=marker, git=_real_git()))
    (bin_dir / "git").chmod(0o755)
    target.playbook()
    tree, head = work_tree(target.repo), target.head()
    target.extra_env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    try:
        run = start_and_kill(target, marker.exists, "the identity read")  # SIGKILL there, then the lock aged
    finally:
        kill_marker(marker)
    del target.extra_env["PATH"]
    cut = json.loads((run / "state.json").read_text())
    assert cut["phase"] == "changing" and cut["git_before"] is None and cut["sent_ahead"][-1] == "commit"
    recovered = target.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert work_tree(target.repo) == tree and target.head() == head
    assert json.loads((run / "state.json").read_text())["phase"] == "failed_restored"
    assert not (target.repo / ".git/deployer.run.lock").exists()
    assert not (target.repo / ".git/deployer/inflight.json").exists()
    again = target.deployer("recover", run.name)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stdout + again.stderr


def test_cut_after_the_chain_ran_to_its_release_recover_finds_the_commit_and_its_end_note(target: Project) -> None:
    target.playbook()
    before = target.head()
    done = target.deployer("apply", "fix.yaml", "--host", "box")
    assert done.returncode == 0, done.stderr
    run = target.runs / target.newest_run()
    after = target.head()
    # This machine's record and log as a SIGKILL right after the chain was sent leaves them: the target ran all
    # of it (commit, release, end note), this machine learnt nothing, not even HEAD before the run.
    state = json.loads((run / "state.json").read_text())
    history = [t for t in state["history"] if t["phase"] in ("preparing", "locked", "changing")][:3]
    state.update(phase="changing", history=history, git_before=None, git_after=None, error=None,
                 files=[{**f, "sha256": None, "mode": None, "uid": None, "gid": None, "before": None}
                        for f in state["files"]])
    (run / "state.json").write_text(json.dumps(state))
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    sent = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "sent_whole")
    (run / "events.jsonl").write_text("".join(lines[:sent + 1]))
    recovered = target.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert target.head() == after and git(target.repo, "rev-parse", "HEAD~1").strip() == before
    assert target.file("pkg/a.py") == FIXED_A
    assert json.loads((run / "state.json").read_text())["phase"] == "succeeded"
    verified = target.deployer("runs", "verify", run.name)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _real_git() -> str:
    found = shutil.which("git")
    assert found is not None
    return found


def test_every_kind_that_judges_before_the_change_says_whether_it_needs_the_target_to() -> None:
    # A chain is sent whole only when no step needs the target's answers before the first change: a kind that
    # judges the run there (judge_here, refusals) runs here, is decided on the target (diff_bounds), or says so.
    from deployer.steps.git import DiffBounds
    from deployer.steps.kinds import KINDS
    from deployer.steps.optional import Refuses, RunsHere

    judging = {kind: cls for kind, cls in KINDS.items()
               if hasattr(cls, "judge_here") or issubclass(cls, Refuses)}  # JudgesEarly has a ClassVar: no issubclass
    assert judging, "no kind judges before the change: the test would pass on nothing"
    for kind, cls in judging.items():
        assert issubclass(cls, RunsHere | Refuses) or cls is DiffBounds, kind
    assert issubclass(KINDS["co_restart"], Refuses) and issubclass(KINDS["local_compile"], RunsHere)


def test_answers_that_differ_from_what_the_chain_was_built_on_end_the_run_consistently(target: Project) -> None:
    # An empty user.email passes the identity read on the target (exit 0) but is no identity here: the chain
    # has run, its commit included, when this machine learns it. The run keeps that commit and says so.
    git(target.repo, "config", "user.email", "")
    target.playbook()
    before = target.head()
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "user.email" in result.stderr, result.stderr
    state = state_of(target)
    if target.head() == before:
        assert result.returncode == 1 and state["phase"] == "failed_restored" and target.file("pkg/a.py") == ORIGINAL_A
    else:
        assert result.returncode == 5 and state["phase"] == "failed_committed" and target.file("pkg/a.py") == FIXED_A
    assert not (target.repo / ".git/deployer/inflight.json").exists()
    assert not (target.repo / ".git/deployer.run.lock").exists()


def test_plan_says_whether_apply_would_send_the_chain_whole_and_why_not(target: Project) -> None:
    target.playbook()
    shown = target.deployer("plan", "fix.yaml", "--host", "box")
    assert shown.returncode == 0, shown.stderr
    assert "sent whole: the steps up to the commit go with the lock" in shown.stdout
    as_json = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert json.loads(as_json.stdout)["sent_whole"] == {"yes": True, "why_not": None}
    # The target's own state decides too: a dirty dest declines the premise (and apply refuses it).
    (target.repo / "pkg/a.py").write_text(ORIGINAL_A + "# local edit\n")
    as_json = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert json.loads(as_json.stdout)["sent_whole"] == {"yes": False, "why_not": "pkg/a.py has uncommitted changes"}
    git(target.repo, "checkout", "--", "pkg/a.py")
    target.playbook(steps=["upload", {"commit": {"message": "m"}}], files=[
        {"src": "fix/a.py", "dest": "pkg/new.py", "create": True}])
    shown = target.deployer("plan", "fix.yaml", "--host", "box")
    assert "sent in two round trips (the changes wait for preflight's answers): pkg/new.py is not tracked" \
        in shown.stdout, shown.stdout
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stderr
    assert "sent_whole_declined" in kinds(target) and target.file("pkg/new.py") == FIXED_A


def test_a_stream_found_broken_before_the_premise_went_sends_nothing_more_and_the_record_says_nothing_changed(
        memory_target: MemoryTarget) -> None:
    # A client slow to build the chain (a loaded machine) may read a broken reply to the lock's round trip before it
    # sends the premise: then nothing of the chain went, and the run ends as one whose stream broke before any change.
    fixed = {"pkg/a.py": FIXED_A.encode()}
    ctx = memory_target.context(fixed)
    playbook = memory_target.root / "fix.yaml"
    playbook.write_text("name: x\nfiles: [{src: a.py, dest: pkg/a.py}]\n"
                        "steps: [local_compile, upload, remote_compile, {commit: {message: m}}]\n")
    _, chain, _ = parse_playbook(playbook)
    record = RunRecord(memory_target.root / "runs" / ctx.run_id,
                       RunState(run_id=ctx.run_id, host="memory", operator="tester", repo=str(memory_target.repo)))
    record.dir.mkdir(parents=True)
    record.advance(Phase.locked, utc_now())
    ctx.record = record
    whole = Whole(chain, 1, 3, Lease("memory", 120, "tester"), Ahead(chain, None, lambda _: None))
    ctx.transport.agent().abort("a reply that is a JSON list, not an object: the stream is broken")
    with pytest.raises(AgentLost, match="the stream is broken"):
        whole.send(ctx, SimpleNamespace(new=fixed), [])  # type: ignore[arg-type]  # send reads only the new bytes
    assert whole.premise is None and ctx.changes == [] and not ctx.prefetched
    state = record.state
    assert state.phase == Phase.locked and state.files == [] and state.sent_ahead == []
    assert [t.phase for t in state.history] == [Phase.locked, Phase.changing, Phase.locked]
