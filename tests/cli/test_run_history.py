"""A run is named by `last` or by any unique beginning of its id wherever a run id is taken, `runs list` narrows
to a host, states and the newest N, and the history is one per user, found from any directory (issue 34, 3-4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from fixtures_repo import ORIGINAL_A, Project, deployer, deployer_env, hold_lock
from test_cli_json import complete

LOCAL = pytest.mark.parametrize("target", ["local"], indirect=True)


def listed(project: Project, *args: str) -> list[str]:
    shown = project.deployer("runs", "list", *args)
    assert shown.returncode == 0, shown.stderr
    return [line.split()[0] for line in shown.stdout.splitlines()[1:] if line.strip()]


def a_second_name(project: Project) -> None:
    """The inventory names the target twice, as `box` and `other`: runs on two hosts of one repo."""
    project.inventory.write_text(yaml.safe_dump({"hosts": {"box": project.host, "other": project.host}}))


def refused_on_other(project: Project) -> str:
    """A run on `other` (refused: the lock is held), newer than every run before it; the lock is gone after."""
    lock = hold_lock(project)
    assert project.deployer("apply", "fix.yaml", "--host", "other").returncode == 3
    shutil.rmtree(lock)
    return project.newest_run()


def unique_beginning(run_id: str, others: list[str]) -> str:
    beginning = run_id[:-3]
    assert not any(o.startswith(beginning) for o in others if o != run_id), others
    return beginning


@LOCAL
def test_runs_list_shows_only_the_runs_on_host_in_the_states_asked_and_the_newest_n(target: Project) -> None:
    a_second_name(target)
    first = target.applied()
    assert target.deployer("rollback", first).returncode == 0
    rollback = target.newest_run()
    assert target.deployer("apply", "fix.yaml", "--host", "other").returncode == 0
    on_other = target.newest_run()
    (target.root / "fix" / "a.py").write_text("def answer(:\n")  # uploaded, then remote_compile fails
    target.playbook(steps=["upload", "remote_compile"])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 1
    failed = target.newest_run()

    assert listed(target) == [first, rollback, on_other, failed]
    assert listed(target, "--host", "box") == [first, rollback, failed]
    assert listed(target, "--host", "other") == [on_other]
    assert listed(target, "--state", "succeeded") == [first, on_other]
    assert listed(target, "--state", "failed_restored", "--state", "rolled_back") == [rollback, failed]
    assert listed(target, "--last", "2") == [on_other, failed]
    assert listed(target, "--host", "box", "--state", "succeeded", "--last", "1") == [first]
    as_json = json.loads(target.deployer("runs", "list", "--host", "other", "--json").stdout)
    assert [r["run_id"] for r in as_json["runs"]] == [on_other]

    nothing = target.deployer("runs", "list", "--host", "nowhere")
    assert (nothing.returncode, nothing.stdout) == (0, f"no runs in {target.runs} match the filters\n")
    bad = target.deployer("runs", "list", "--state", "suceeded")
    assert bad.returncode == 2 and "--state suceeded: no run has that state" in bad.stderr, bad.stderr
    assert "succeeded" in bad.stderr.split("the states are", 1)[1]
    assert target.deployer("runs", "list", "--last", "0").returncode == 2


@LOCAL
def test_last_and_any_unique_beginning_of_an_id_name_a_run_wherever_a_run_id_is_taken(target: Project) -> None:
    a_second_name(target)
    on_box = target.applied()
    newest = refused_on_other(target)
    ids = [p.name for p in target.runs.iterdir()]

    shown = target.deployer("runs", "show", "last")
    assert shown.returncode == 0 and f"run {newest}  state refused  host other" in shown.stdout, shown.stdout
    verified = target.deployer("runs", "verify", unique_beginning(on_box, ids))
    assert verified.returncode == 0 and verified.stdout.startswith(f"run {on_box}: log verifies"), verified.stderr
    preview = target.deployer("plan", "--rollback", "last", "--host", "box", "--json")
    assert preview.returncode == 0, preview.stderr
    assert json.loads(preview.stdout)["steps"][0]["name"] == "rollback"

    rolled = target.deployer("rollback", "last", "--host", "box", "--json")  # the newest on box, not `newest`
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
    assert target.events()[0]["rollback_of"] == on_box
    recovered = target.deployer("recover", unique_beginning(on_box, ids), "--json")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert target.events(json.loads(recovered.stdout)["run_id"])[0]["recover_of"] == on_box


@LOCAL
def test_an_ambiguous_beginning_of_a_run_id_is_a_usage_error_naming_each_run_it_begins(target: Project) -> None:
    first = target.applied()
    assert target.deployer("rollback", first).returncode == 0
    second = target.newest_run()
    common = next(first[:end] for end in range(len(first), 0, -1) if second.startswith(first[:end]))
    for args in (("runs", "show", common), ("runs", "verify", common), ("rollback", common),
                 ("plan", "--rollback", common), ("recover", common)):
        result = target.deployer(*args)
        assert result.returncode == 2, (args, result.stdout + result.stderr)
        assert f"run id {common!r} is ambiguous: 2 runs in {target.runs} begin so, {first}, {second}; give more " \
               "of the id" in " ".join(result.stderr.split()), (args, result.stderr)
    as_json = json.loads(target.deployer("rollback", common, "--json").stdout)
    assert as_json["exit_code"] == 2 and first in as_json["error"] and second in as_json["error"]
    assert target.deployer("runs", "list").stdout.count("\n") == 3  # nothing was added by a refused lookup


def test_completion_offers_last_every_run_id_and_the_states(tmp_path: Path) -> None:
    history = tmp_path / "state" / "deployer" / "runs"
    ids = ["20260101T000000.000Z-aaaaaa", "20260102T000000.000Z-bbbbbb"]
    for run_id in ids:
        (history / run_id).mkdir(parents=True)
        (history / run_id / "events.jsonl").write_text("")
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    assert complete(tmp_path, "deployer rollback ", env) == ["last", *ids]
    assert complete(tmp_path, "deployer runs show l", env) == ["last"]
    assert complete(tmp_path, "deployer plan --rollback 20260102", env) == [ids[1]]
    assert complete(tmp_path, "deployer runs list --state re") == ["restarting", "refused"]


@LOCAL
def test_runs_are_one_history_per_user_found_and_rolled_back_from_any_directory(target: Project,
                                                                              tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = deployer_env(DEPLOYER_INVENTORY=str(target.inventory), XDG_STATE_HOME=str(state))
    target.playbook()
    applied = deployer("apply", "fix.yaml", "--host", "box", cwd=target.root, env=env)
    assert applied.returncode == 0, applied.stderr
    [run] = (state / "deployer" / "runs").iterdir()
    assert not (target.root / ".deployer").exists() and not target.runs.exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = deployer("runs", "list", cwd=elsewhere, env=env)
    assert shown.stdout.splitlines()[1].split()[:3] == [run.name, "succeeded", "box"], shown.stdout
    rolled = deployer("rollback", run.name, cwd=elsewhere, env=env)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
    assert "notice" not in applied.stderr + shown.stderr + rolled.stderr

    home = tmp_path / "home"
    bare = {k: v for k, v in env.items() if k != "XDG_STATE_HOME"} | {"HOME": str(home)}
    listed_json = json.loads(deployer("runs", "list", "--json", cwd=elsewhere, env=bare).stdout)
    assert listed_json["runs_dir"] == str(home / ".local" / "state" / "deployer" / "runs")


def test_a_lookup_that_misses_says_which_runs_dir_it_searched(tmp_path: Path) -> None:
    history = tmp_path / "state" / "deployer" / "runs"
    env = deployer_env(XDG_STATE_HOME=str(tmp_path / "state"))
    empty = deployer("runs", "list", cwd=tmp_path, env=env)
    assert (empty.returncode, empty.stdout) == (0, f"no runs in {history}\n")
    for args in (("runs", "show", "2026"), ("rollback", "2026"), ("runs", "verify", "last"), ("recover", "last")):
        missed = deployer(*args, cwd=tmp_path, env=env)
        assert missed.returncode == 2, (args, missed.stderr)
        assert f" in {history} (see 'deployer runs list')" in missed.stderr, (args, missed.stderr)
    named = deployer("runs", "show", "nosuch", "--runs-dir", str(tmp_path / "mine"), cwd=tmp_path, env=env)
    assert f"no run 'nosuch' in {tmp_path / 'mine'}" in named.stderr, named.stderr


@LOCAL
def test_a_deployer_runs_folder_in_the_cwd_is_still_the_runs_dir_there_with_a_one_line_notice(
        target: Project, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = deployer_env(DEPLOYER_INVENTORY=str(target.inventory), XDG_STATE_HOME=str(state))
    target.playbook()  # a run made where the cwd's .deployer/runs was the default
    made = deployer("apply", "fix.yaml", "--host", "box", "--runs-dir", ".deployer/runs", cwd=target.root, env=env)
    assert made.returncode == 0, made.stderr
    [run] = (target.root / ".deployer" / "runs").iterdir()

    shown = deployer("runs", "list", cwd=target.root, env=env)
    assert shown.stdout.splitlines()[1].split()[0] == run.name, shown.stdout
    notices = [line for line in shown.stderr.splitlines() if line.startswith("notice:")]
    assert notices == [f"notice: using ./.deployer/runs, this directory's run history; deployer's default is now "
                       f"one history per user, found from any directory ({state / 'deployer' / 'runs'}): move these "
                       "runs there and remove ./.deployer/runs to use it"], shown.stderr
    rolled = deployer("rollback", "last", "--json", cwd=target.root, env=env)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert json.loads(rolled.stdout)["run_id"] in {p.name for p in (target.root / ".deployer" / "runs").iterdir()}
    assert not state.exists()

    for chosen in (["--runs-dir", ".deployer/runs"], []):
        quiet = deployer("runs", "list", *chosen, cwd=target.root,
                         env=env if chosen else {**env, "DEPLOYER_RUNS_DIR": str(tmp_path / "elsewhere")})
        assert quiet.returncode == 0 and "notice" not in quiet.stderr, quiet.stderr
