"""The plans of the steps on the target's git: diff_bounds (the count and the bounds the target checks it against)
and commit (exactly the changed files, its message with the run's trailers, and the reads that prove it)."""

from __future__ import annotations

import pytest
from planning import change, context, does, step
from pydantic import ValidationError

from deployer.steps.action import Action
from deployer.steps.context import Facts

GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "--literal-pathspecs")
A = change("pkg/a.py", b"x = 2\n")
B = change("pkg/b.py", b"y = 2\n")
NEW = change("pkg/new.py", b"z = 1\n", old=None, tracked=False)
COUNT = (*GIT, "diff", "--numstat", "-z", "--no-renames", "--diff-algorithm=myers", "HEAD", "--")
TRAILERS = "\n\nDeployer-Run: <run id>\nDeployer-Log: sha256:<sha256 of the run log up to this step>\n"


def numstat(*dests: str, within: tuple[tuple[str, tuple[int, int] | None], ...]) -> Action:
    return Action.run("numstat", "count the diff against HEAD", (*COUNT, *dests), "/srv/app", within=within)


def test_diff_bounds_counts_the_tracked_files_in_one_command_checked_there_against_its_bounds() -> None:
    plan = step("diff_bounds", {"files": 2, "insertions": [1, 20], "deletions": [0, 5]}).plan(context(changes=[A, B]))
    assert does(plan) == does([numstat("pkg/a.py", "pkg/b.py",
                            within=(("files", (2, 2)), ("insertions", (1, 20)), ("deletions", (0, 5))))])


def test_diff_bounds_without_bounds_still_counts_and_leaves_each_total_unchecked() -> None:
    plan = step("diff_bounds").plan(context(changes=[A]))
    unbounded = (("files", None), ("insertions", None), ("deletions", None))
    assert does(plan) == does([numstat("pkg/a.py", within=unbounded)])


def test_diff_bounds_counts_a_new_file_against_dev_null_in_a_command_of_its_own() -> None:
    plan = step("diff_bounds", {"files": [1, 3]}).plan(context(changes=[A, NEW]))
    assert does(plan) == does([
        numstat("pkg/a.py", within=(("files", (1, 3)), ("insertions", None), ("deletions", None))),
        Action.run("numstat:pkg/new.py", "count the diff against HEAD (a new file)",
                   (*GIT, "diff", "--no-index", "--numstat", "-z", "--diff-algorithm=myers", "--", "/dev/null",
                    "pkg/new.py"), "/srv/app")])


def test_diff_bounds_of_only_new_files_has_no_tracked_count() -> None:
    assert [a.key for a in step("diff_bounds").plan(context(changes=[NEW]))] == ["numstat:pkg/new.py"]


@pytest.mark.parametrize("bounds", [{"files": [3, 1]}, {"insertions": -1}, {"deletions": [-1, 2]}])
def test_diff_bounds_refuses_a_range_that_is_none_before_any_plan(bounds: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        step("diff_bounds", bounds)


def test_commit_stages_and_commits_exactly_the_shipped_files_under_the_runs_trailers() -> None:
    plan = step("commit", {"message": "pkg: fix the abort race\n"}).plan(context(changes=[A, NEW]))
    assert does(plan) == does([
        Action.run("add", "stage the shipped files", (*GIT, "add", "-A", "--", "pkg/a.py", "pkg/new.py"), "/srv/app",
                   failure="git add failed"),
        Action.run("commit", "commit exactly those files",
                   (*GIT, "commit", "-q", "--no-verify", "-m", "pkg: fix the abort race" + TRAILERS,
                    "--", "pkg/a.py", "pkg/new.py"), "/srv/app", failure="git commit failed"),
        Action.run("head", "read the new HEAD", (*GIT, "rev-parse", "HEAD"), "/srv/app", failure="cannot read HEAD"),
        Action.run("files", "list the files the commit holds",
                   (*GIT, "diff-tree", "--no-commit-id", "--name-only", "--no-renames", "-r", "-z", "HEAD"),
                   "/srv/app", failure="cannot list the commit's files", expect=b"pkg/a.py\0pkg/new.py\0")])


def test_commit_with_hooks_lets_the_repos_hooks_run_on_the_commit_only() -> None:
    add, commit, *_ = step("commit", {"message": "fix", "hooks": True}).plan(context(changes=[A]))
    hooked = ("git", "-c", "core.fsmonitor=false", "--literal-pathspecs")
    assert add.argv == (*GIT, "add", "-A", "--", "pkg/a.py")
    assert commit.argv == (*hooked, "commit", "-q", "-m", "fix" + TRAILERS, "--", "pkg/a.py")


def test_commit_on_a_target_without_a_git_identity_commits_as_the_operator() -> None:
    facts = Facts(identity="", operator="alice@example.com")
    _, commit, *_ = step("commit", {"message": "fix"}).plan(context(changes=[A], facts=facts))
    assert commit.argv == (*GIT, "-c", "user.name=deployer (alice@example.com)", "-c", "user.email=alice@example.com",
                           "commit", "-q", "--no-verify", "-m", "fix" + TRAILERS, "--", "pkg/a.py")


def test_commit_leaves_out_the_files_head_already_has_and_expects_only_the_rest() -> None:
    add, commit, _, files = step("commit", {"message": "fix"}).plan(
        context(changes=[A, B], facts=Facts(identity="dev@example.com", unchanged=["pkg/a.py"])))
    assert add.argv[-2:] == ("--", "pkg/b.py") and commit.argv[-2:] == ("--", "pkg/b.py")
    assert files.expect == b"pkg/b.py\0"


def test_commit_of_files_all_already_there_plans_only_its_failure() -> None:
    plan = step("commit", {"message": "fix"}).plan(
        context(changes=[A], facts=Facts(identity="dev@example.com", unchanged=["pkg/a.py"])))
    assert does(plan) == does([Action("nothing to commit: the target already has these bytes (the step fails)")])


def test_commit_expects_the_files_in_gits_bytewise_order() -> None:
    upper = change("pkg/Z.py", b"z\n")
    *_, files = step("commit", {"message": "fix"}).plan(context(changes=[A, upper]))
    assert files.expect == b"pkg/Z.py\0pkg/a.py\0"


def test_commit_refuses_a_blank_message_before_any_plan() -> None:
    with pytest.raises(ValidationError):
        step("commit", {"message": "  \n"})


def test_commit_plan_asks_the_target_for_its_identity_only_when_preflight_did_not_read_it() -> None:
    # A rollback has no preflight: its commit's plan reads `git config user.email` there. Here no target answers.
    with pytest.raises(AssertionError, match=r"plan\(\) reached for the target"):
        step("commit", {"message": "fix"}).plan(context(changes=[A], facts=Facts(identity=None)))
