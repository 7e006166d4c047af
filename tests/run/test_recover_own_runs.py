"""This machine's own runs: a run killed here holds the target's lock only as long as its process lived.

The target's lock (the pid it names included) is the target's word; a run's `state.json` here names the process
of this machine that runs it (pid, start time, boot, pid namespace). Recover takes over the lock of a run whose
process is gone at once, and still waits for the heartbeat of one whose process runs, or that this machine cannot
judge (another boot: perhaps another machine sharing the runs dir). The next apply calls no run dead whose
process still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures_repo import FIXED_A, Project, act_when, age_lock, git, staged_bytes, target_python, work_tree
from fixtures_services import served
from polling import wait_for
from test_recover import gate, kill_marker, state_of

from deployer.agent.client import CUT_SHORT
from deployer.runlog import EVENTS

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]

TTL_S = 600  # no heartbeat goes stale while a test runs: only the record here can let recover in early


def parked_in_compile(project: Project) -> Path:
    """fix.yaml, whose remote_compile blocks for good on the target; the marker names the blocked process."""
    script, marker = gate(project, "compile")
    project.write_inventory(python=target_python(project, f"exec {script}"), lock_ttl_s=TTL_S)
    project.playbook()
    return marker


def lock_of(project: Project) -> Path:
    return project.repo / ".git" / "deployer.run.lock"


def killed_holding_the_lock(project: Project) -> Path:
    """The run dir of an apply SIGKILLed in its remote_compile: its lock on the target, its heartbeat fresh."""
    marker = parked_in_compile(project)
    try:
        act_when(project, ("apply", "fix.yaml", "--host", "box"), marker.exists,
                 lambda proc: proc.send_signal(signal.SIGKILL), "the apply's remote_compile")
    finally:
        kill_marker(marker)
    assert time.time() - (lock_of(project) / "heartbeat").stat().st_mtime < TTL_S / 2
    return project.runs / project.newest_run()


@contextmanager
def running_apply(project: Project) -> Iterator[subprocess.Popen[str]]:
    """An apply of this machine, alive and holding the target's lock, parked in its remote_compile."""
    marker = parked_in_compile(project)
    proc = project.popen("apply", "fix.yaml", "--host", "box")
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, "the apply's remote_compile")
        assert proc.poll() is None, proc.communicate()
        yield proc
    finally:
        proc.kill()
        proc.communicate(timeout=30)
        kill_marker(marker)


def settled_as_before(project: Project, tree: dict[str, str], head: str) -> None:
    assert work_tree(project.repo) == tree and project.head() == head
    assert git(project.repo, "status", "--porcelain") == ""
    assert not lock_of(project).exists() and not lock_of(project).is_symlink()


def test_a_run_killed_on_this_machine_is_recovered_at_once_though_its_heartbeat_is_fresh(target: Project) -> None:
    tree, head = work_tree(target.repo), target.head()
    run = killed_holding_the_lock(target)
    # Named as cut wherever a person looks first: `runs list` and a recover given no run.
    listed = target.deployer("runs", "list")
    # Beside whichever phase its record reached before the kill (locked, changing or changed: the chain runs ahead
    # of the record, and the kill lands anywhere in that).
    assert re.search(rf"{run.name} +{state_of(run)['phase']} \(cut\)", listed.stdout), listed.stdout
    assert "`deployer recover RUN` finishes it or puts the target back" in listed.stdout, listed.stdout
    asked = target.deployer("recover")
    assert asked.returncode == 2 and f"deployer recover {run.name}" in asked.stderr, asked.stdout + asked.stderr
    recovered = target.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "its lock was released" in recovered.stdout, recovered.stdout
    settled_as_before(target, tree, head)
    # The state recover says it left is the one `runs list` shows (`failed` where it had changed nothing yet).
    said = re.search(rf"run {run.name} -> (\w+)", recovered.stdout)
    assert said and re.search(rf"{run.name} +{said[1]} ", target.deployer("runs", "list").stdout), recovered.stdout
    runs = json.loads(target.deployer("runs", "list", "--json").stdout)["runs"]
    assert [r["cut"] for r in runs] == [False, False], runs  # recovered, and the recover's own run
    assert "was cut" in target.deployer("recover").stderr
    [adopted] = [e for e in target.events() if e["type"] == "lock_adopted"]
    assert adopted["of_run"] == run.name and adopted["because"] == "its process on this machine is gone", adopted
    # And said where the person looks: "acquired" alone read as if nothing had held it.
    assert f"[lock] took over from run {run.name}: its process on this machine is gone" in recovered.stdout, \
        recovered.stdout


def test_a_forced_release_of_a_fresh_lock_says_its_run_is_still_going_here(target: Project) -> None:
    with running_apply(target) as proc:
        status = target.deployer("lock", "status", "--host", "box")
        assert status.returncode == 3 and f"still going on this machine (pid {proc.pid}): wait for it" in \
            status.stdout, status.stdout + status.stderr
        going = target.deployer("lock", "release", "--host", "box", "--force")
        assert going.returncode == 0, going.stdout + going.stderr
        assert f"is still going on this machine (pid {proc.pid})" in going.stderr, going.stderr
        assert "was cut" not in going.stdout + going.stderr, going.stdout  # its intent record is a live run's


def test_a_forced_release_of_a_fresh_lock_says_its_run_was_cut_here(target: Project) -> None:
    run = killed_holding_the_lock(target)
    # Where the person looks first: the status names the recover (it said only who held the lock, and when stale,
    # "remove it with: deployer lock release --force", which leaves what the run changed).
    mid_change = (f"run {run.name} was cut while it changed files here (its intent record is on the target): end it "
                  f"with: deployer recover {run.name} --host box")
    status = target.deployer("lock", "status", "--host", "box")
    assert status.returncode == 3 and mid_change in status.stdout, status.stdout + status.stderr
    # `check` judges it as the refused apply does (it said "if run R is gone (killed, disconnected)").
    checked = target.deployer("check", "--host", "box")
    assert re.search(rf"run {run.name} was cut \(its process on this machine, pid \d+, is gone\)", checked.stdout), \
        checked.stdout
    assert json.loads(target.deployer("lock", "status", "--host", "box", "--json").stdout)["next"].startswith(
        mid_change)
    cut = target.deployer("lock", "release", "--host", "box", "--force")
    assert mid_change in cut.stdout, cut.stdout  # released, and the run is still to be ended
    # Before: "that run may still be going", where a refused apply said the same run's process here is gone.
    assert cut.returncode == 0 and "the lock was NOT stale" in cut.stderr, cut.stdout + cut.stderr
    assert re.search(rf"run {run.name} was cut \(its process on this machine, pid \d+, is gone\); `deployer "
                     rf"recover {run.name} --host box` still ends it", cut.stderr), cut.stderr


def test_recover_last_recovers_the_newest_cut_run_not_the_refused_apply_after_it(target: Project) -> None:
    tree, head = work_tree(target.repo), target.head()
    run = killed_holding_the_lock(target)
    again = target.deployer("apply", "fix.yaml", "--host", "box")
    assert again.returncode != 0 and f"deployer recover {run.name}" in again.stderr, again.stdout + again.stderr
    assert target.newest_run() != run.name  # the refused apply is the newest run now
    # Before: `last` was that refused apply, which had nothing to recover (exit 0), the cut run left as it was.
    recovered = target.deployer("recover", "last")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert re.search(rf"run {run.name} -> \w+", recovered.stdout), recovered.stdout
    settled_as_before(target, tree, head)
    # The recover's own record names the run it finished, where `runs show` and `runs list` say what a run was.
    recover_id = target.newest_run()
    assert f"recover of run {run.name}" in target.deployer("runs", "show", recover_id).stdout
    assert re.search(rf"{recover_id} .* recover of {run.name}", target.deployer("runs", "list").stdout)
    done = target.deployer("recover", "last")  # none cut now: said, and no run of its own made for nothing
    assert done.returncode == 0 and "was cut (the newest, " in done.stdout, done.stdout + done.stderr
    assert recover_id == target.newest_run()
    # Asked to revert too: nothing would be reverted, so never a quiet exit 0 (it was: a recover of the recover).
    reverting = target.deployer("recover", "last", "--rollback")
    assert reverting.returncode == 2 and "To undo a run's commit: deployer rollback last" in reverting.stderr, \
        reverting.stdout + reverting.stderr


def test_recover_rollback_of_a_run_already_rolled_back_names_that_rollback_not_a_refused_command(
        target: Project) -> None:
    target.playbook()
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    run = target.newest_run()
    rolled = target.deployer("rollback", run)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    again = target.deployer("recover", run, "--rollback")
    # Before: "To undo its commit C: deployer rollback R", which is refused ("was already rolled back by run X").
    assert again.returncode == 2, again.stdout + again.stderr
    assert f"was already rolled back by run {target.newest_run()}: nothing to undo" in again.stderr, again.stderr
    assert f"deployer rollback {run}" not in again.stderr


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
@contextmanager
def metrics_that_never_answer(reached: threading.Event) -> Iterator[str]:
    """A metrics URL on 127.0.0.1 whose reads are held (reached set) until the test ends, at most a minute."""
    done = threading.Event()

    def held(path: str) -> bytes:
        reached.set()
        done.wait(60)
        return b""

    with served(held) as server:
        try:
            yield f"http://127.0.0.1:{server.port}/metrics"
        finally:
            done.set()


def test_a_run_killed_before_it_changed_anything_is_recovered_as_failed(target: Project) -> None:
    # `failed_restored` says a run had begun changing the target; one killed in its baseline had not.
    tree, head = work_tree(target.repo), target.head()
    target.write_inventory(lock_ttl_s=TTL_S)
    reached = threading.Event()
    with metrics_that_never_answer(reached) as url:
        target.playbook(steps=[{"baseline": {"metric": "m", "url": url, "within_s": 30}}, "local_compile", "upload",
                               {"commit": {"message": "pkg: answer is 42"}}])
        act_when(target, ("apply", "fix.yaml", "--host", "box"), reached.is_set,
                 lambda proc: proc.send_signal(signal.SIGKILL), "the apply's baseline read")
        run = target.runs / target.newest_run()
        recovered = target.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert f"run {run.name} -> failed;" in recovered.stdout, recovered.stdout
    assert re.search(rf"{run.name} +failed ", target.deployer("runs", "list").stdout)
    settled_as_before(target, tree, head)


def test_rollback_last_with_only_a_cut_run_names_it_and_recover(target: Project) -> None:
    run = killed_holding_the_lock(target)
    refused = target.deployer("rollback", "last")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "left a commit to roll back" in said, said
    assert f"run {run.name} was cut" in said and f"end it with: deployer recover {run.name}" in said, said


def test_a_recover_waits_for_a_run_whose_process_on_this_machine_still_runs(target: Project) -> None:
    with running_apply(target) as proc:
        run = target.newest_run()
        refused = target.deployer("recover", run)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "heartbeat is fresh" in refused.stderr, refused.stderr
        assert f"its process on this machine (pid {proc.pid}) still runs" in refused.stderr, refused.stderr
        asked = target.deployer("recover")  # going, not cut: never offered
        assert asked.returncode == 2 and "none of the newest" in asked.stderr and run not in asked.stderr, asked.stderr
        assert [r["cut"] for r in json.loads(target.deployer("runs", "list", "--json").stdout)["runs"]] == [False]
        assert staged_bytes(target.repo, "pkg/a.py") == FIXED_A and lock_of(target).is_symlink()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
@pytest.mark.parametrize(("recorded", "waits"), [("another boot", True), ("a pid used again", False)])
def test_a_killed_run_recorded_in_another_boot_waits_for_its_heartbeat_and_one_whose_pid_was_reused_does_not(
        target: Project, recorded: str, waits: bool) -> None:
    tree, head = work_tree(target.repo), target.head()
    run = killed_holding_the_lock(target)
    state = state_of(run)
    if recorded == "another boot":  # or another machine sharing the runs dir: nothing here can tell it is gone
        state["owner"]["boot_id"] = str(uuid.uuid4())
    else:  # this test's own process, alive, but started long before the killed run's
        state["owner"]["pid"] = os.getpid()
    (run / "state.json").write_text(json.dumps(state))
    recovered = target.deployer("recover", run.name)
    if waits:
        assert recovered.returncode == 3, recovered.stdout + recovered.stderr
        assert "heartbeat is fresh" in recovered.stderr, recovered.stderr
        assert staged_bytes(target.repo, "pkg/a.py") == FIXED_A and lock_of(target).is_symlink()
    else:
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        settled_as_before(target, tree, head)


# A ProxyCommand that keeps its connection to sshd open when its stdin closes (the deployer that started it was
# killed) and drops what sshd sends: the target never hears the link close, as when it is cut under a live session.
DEAF_RELAY = """
import os, socket, sys, threading
with open(sys.argv[1], "a") as pids:
    pids.write(f"{os.getpid()}\\n")
link = socket.create_connection((sys.argv[2], int(sys.argv[3])))

def down():
    while data := link.recv(65536):
        try:
            os.write(1, data)
        except OSError:
            pass
    os._exit(0)

threading.Thread(target=down, daemon=True).start()
while data := os.read(0, 65536):
    link.sendall(data)
threading.Event().wait()
"""


@contextmanager
def deaf_link(target: Project) -> Iterator[Path]:
    """target reached through a relay whose end sshd never hears close until kill_relays(the yielded pids file)."""
    relay, pids = target.write("relay.py", DEAF_RELAY), target.root / "relays.pids"
    config = target.write("ssh_config", f"Host relayed\n    HostName {target.host['address']}\n"
                                        f"    Port {target.host['port']}\n"
                                        f"    ProxyCommand {sys.executable} {relay} {pids} %h %p\n")
    config.chmod(0o600)
    target.host.update(address="relayed", ssh_config=str(config))
    try:
        yield pids
    finally:
        kill_relays(pids)


def unlogged_agent(run: Path) -> None:
    """run's log as a kill between sending its lock's take and reading its agent's hello leaves it: no `agent`
    event, so no pid of its agent (that kill's window is about a millisecond wide: made here, not waited for)."""
    log = run / EVENTS
    lines = log.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["type"] != "agent"]
    assert len(kept) < len(lines)
    log.write_bytes(b"".join(kept))


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
@pytest.mark.parametrize("logged", [True, False], ids=["agent-logged", "agent-unlogged"])
@pytest.mark.parametrize("stale", [False, True], ids=["fresh", "stale"])
def test_a_recover_waits_while_the_killed_runs_agent_still_runs_on_a_target_that_never_heard_the_link_close(
        target: Project, stale: bool, logged: bool) -> None:
    # Stale (its TTL passed, or a person says so by backdating it): the heartbeat stopped, but an agent still busy
    # with the run's last command would race recover; it was taken over all the same. Unlogged: the lock's heartbeat
    # names the agent that beats it.
    tree, head = work_tree(target.repo), target.head()
    with deaf_link(target) as pids:
        run = killed_holding_the_lock(target)
        if not logged:
            unlogged_agent(run)
        if stale:
            age_lock(target.repo)
        refused = target.deployer("recover", run.name)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        found = re.search(r"its agent on the target \(pid (\d+)\) still runs 5s later", refused.stderr)
        assert found is not None, refused.stderr
        assert CUT_SHORT.encode() in Path(f"/proc/{found[1]}/cmdline").read_bytes()  # the killed run's agent
        assert ("lock is stale" in refused.stderr) == stale, refused.stderr
        assert staged_bytes(target.repo, "pkg/a.py") == FIXED_A and lock_of(target).is_symlink()
        kill_relays(pids)  # now sshd hears the link close, and the agent leaves with it
        wait_for(lambda: not Path(f"/proc/{found[1]}").exists(), "the killed run's agent's end")
        recovered = target.deployer("recover", run.name)
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        settled_as_before(target, tree, head)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_recover_right_behind_the_kill_waits_for_the_killed_runs_agent_to_end(target: Project) -> None:
    # An agent ends as soon as it reads its client's end: a recover started a moment before must not refuse.
    tree, head = work_tree(target.repo), target.head()
    with deaf_link(target) as pids:
        run = killed_holding_the_lock(target)
        theirs = pids.read_text()  # the killed run's relay: recover's own goes through one too
        recovering = target.popen("recover", run.name)
        try:
            wait_for(lambda: waiting_for_agent(target), "the recover's wait for the killed run's agent", seconds=30)
            kill_relays(theirs)  # its agent ends now, while recover waits for it
            out, err = recovering.communicate(timeout=60)
        finally:
            if recovering.poll() is None:
                recovering.kill()
                recovering.wait()
    assert recovering.returncode == 0, out + err
    settled_as_before(target, tree, head)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_run_killed_before_its_log_named_its_agent_is_recovered_at_once(target: Project) -> None:
    # Its agent read the kill's end of the link and left; its lock's heartbeat says which agent that was.
    tree, head = work_tree(target.repo), target.head()
    run = killed_holding_the_lock(target)
    unlogged_agent(run)
    recovered = target.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    settled_as_before(target, tree, head)
    [adopted] = [e for e in target.events() if e["type"] == "lock_adopted"]
    assert adopted["because"] == "its process on this machine is gone", adopted


def waiting_for_agent(target: Project) -> bool:
    """The newest run (a recover's, once it has a log) says it waits for a killed run's agent to end."""
    try:
        events = target.events()
    except FileNotFoundError:  # its dir is made a moment before its log
        return False
    return any(e["type"] == "notice" and "still runs: waiting up to 5s for it to end" in e["message"] for e in events)


def kill_relays(pids: Path | str) -> None:
    """Each relay pids (a file of them, or its text read earlier) names."""
    listed = pids if isinstance(pids, str) else pids.read_text() if pids.exists() else ""
    for pid in listed.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_second_apply_calls_no_run_dead_whose_process_on_this_machine_still_runs(target: Project) -> None:
    with running_apply(target):
        running = target.newest_run()
        second = target.deployer("apply", "fix.yaml", "--host", "box")
        assert second.returncode == 3, second.stdout + second.stderr
        assert f"held by run {running}" in second.stderr, second.stderr
        assert running not in second.stderr.split("held by run")[0], second.stderr
        assert "never ended" not in second.stderr, second.stderr
        said = " ".join(second.stderr.split())
        assert f"Run {running} is still going on this machine (pid " in said and "recover" not in said, said


def test_an_apply_refused_by_a_cut_runs_lock_says_it_was_cut_and_how_to_end_it(target: Project) -> None:
    run = killed_holding_the_lock(target)
    refused = target.deployer("apply", "fix.yaml", "--host", "box")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 3 and f"Run {run.name} was cut (its process on this machine, pid " in said, said
    assert f"end it with: deployer recover {run.name} --host box" in said, said


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_run_this_machine_cannot_judge_is_named_without_being_called_dead(target: Project) -> None:
    run = killed_holding_the_lock(target)
    state = state_of(run)
    state["owner"]["boot_id"] = str(uuid.uuid4())
    (run / "state.json").write_text(json.dumps(state))
    second = target.deployer("apply", "fix.yaml", "--host", "box")
    assert second.returncode == 3, second.stdout + second.stderr
    assert "never ended" not in second.stderr, second.stderr
    assert f"notice: run {run.name} on box has no run_end" in second.stderr, second.stderr
    assert f"deployer recover {run.name}" in second.stderr, second.stderr
