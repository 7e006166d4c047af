"""`recover` finishes what a run cut in its restart left: the services restarted and checked as the run would
have, or a failure that names the services still down and the exact `deployer restart` command. Real services,
a real SIGKILL of the apply (local and over a real sshd)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from fixtures_repo import FIXED_A, ORIGINAL_A, Project, act_when, age_lock
from fixtures_services import GAUGE, Stack, kill_naming, processes_naming
from polling import wait_for

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]

CHAIN: list[Any] = ["local_compile", "upload", "remote_compile",
                    {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
                    {"commit": {"message": "pkg: answer is 42"}}, {"co_restart": {}},
                    {"drain": {"metric": GAUGE, "to": 0, "within_s": 30, "interval_s": 0.1}}]


DECODE_STARTING = '"service": "decode", "phase": "starting"'


def state_of(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "state.json").read_text()))


def logged_since(target: Project, before: set[Path], text: str) -> bool:
    """Whether a run that began after `before` (the runs dir's entries then) has logged `text`."""
    runs = [p for p in set(target.runs.iterdir()) - before if (p / "events.jsonl").is_file()]
    return any(text in (p / "events.jsonl").read_text() for p in runs)


def cut_at(target: Project, args: list[str], text: str, what: str) -> Path:
    """`deployer ARGS` SIGKILLed once the run it began has logged `text`: that run's dir."""
    before = set(target.runs.iterdir())
    cut = act_when(target, args, lambda: logged_since(target, before, text),
                   lambda proc: proc.send_signal(signal.SIGKILL), what)
    assert cut.returncode == -signal.SIGKILL
    [run] = set(target.runs.iterdir()) - before
    return run


def killed_in_its_restart(target: Project, stack: Stack, steps: list[Any] = CHAIN) -> Path:
    """An apply of steps (by default CHAIN) SIGKILLed once co_restart has stopped a service; then every service is
    down (as a kill that took the services with it leaves them)."""
    stack.start_services()
    target.playbook(steps=steps)
    run = cut_at(target, ["apply", "fix.yaml", "--host", "box"], '"type": "service_stopped"',
                 "co_restart's first stop")
    stack.kill_all()
    age_lock(target.repo)
    assert state_of(run)["phase"] == "restarting"
    return run


def healthy(stack: Stack) -> bool:
    return all(stack.fetch(f"http://127.0.0.1:{port}/health") == "ok\n" for port in stack.ports.values())


def test_a_run_cut_in_its_restart_is_finished_by_recover_services_healthy_and_checks_run(
        target: Project, stack: Stack) -> None:
    run = killed_in_its_restart(target, stack)
    stack.set_gauge(0.0)
    done = target.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert healthy(stack) and target.file("pkg/a.py") == FIXED_A
    assert state_of(run)["phase"] == "succeeded"
    recover_id = target.newest_run()
    ran = [e["step"] for e in target.events(recover_id) if e["type"] == "step_end" and e["status"] == "ok"]
    assert ran == ["co_restart", "drain"]
    for one in (run.name, recover_id):
        verified = target.deployer("runs", "verify", one, "--target")
        assert verified.returncode == 0, verified.stdout + verified.stderr
    again = target.deployer("recover", run.name)
    assert again.returncode == 0 and "nothing to recover" in again.stdout


def test_recover_whose_restart_cannot_succeed_exits_5_naming_the_service_and_the_restart_command(
        target: Project, stack: Stack) -> None:
    run = killed_in_its_restart(target, stack)
    stack.configure(prefill=stack.service("prefill", start=[sys.executable, "-c", "raise SystemExit(3)"],
                                          health_timeout_s=3), decode=stack.service("decode"))
    failed = target.deployer("recover", run.name)
    assert failed.returncode == 5, failed.stdout + failed.stderr
    assert "Down on box: prefill (" in failed.stderr
    assert "Bring them back with: deployer restart --host box prefill" in failed.stderr
    # The cut run is settled (its commit kept), so the printed command is not refused by its intent record.
    assert state_of(run)["phase"] == "failed_committed"
    stack.configure()
    stack.set_gauge(0.0)
    back = target.deployer("restart", "--host", "box", "prefill", "decode")
    assert back.returncode == 0, back.stdout + back.stderr
    assert healthy(stack)
    assert target.deployer("runs", "verify", run.name).returncode == 0


def test_recover_rollback_from_a_machine_without_the_run_dir_restarts_and_verifies(target: Project,
                                                                                  stack: Stack) -> None:
    killed_in_its_restart(target, stack)
    elsewhere = target.root / "other-runs"
    done = target.deployer("recover", "--host", "box", "--rollback", "--runs-dir", str(elsewhere))
    assert done.returncode == 0, done.stdout + done.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A and healthy(stack)
    recover_id = sorted(p.name for p in elsewhere.iterdir())[-1]
    events = [json.loads(line) for line in (elsewhere / recover_id / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["type"] == "step_end"][-1] == "rollback:co_restart"
    verified = target.deployer("runs", "verify", recover_id, "--target", "--runs-dir", str(elsewhere))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_recover_rollback_of_a_run_that_already_ended_points_to_deployer_rollback(target: Project) -> None:
    run_id = target.applied()
    head = target.head()
    pointed = target.deployer("recover", run_id, "--rollback")
    assert pointed.returncode == 2, pointed.stdout + pointed.stderr
    assert f"To undo its commit {head[:12]}: deployer rollback {run_id}" in pointed.stderr
    assert target.head() == head


def gated_decode(target: Project, stack: Stack) -> Path:
    """decode's start waits until the returned gate file exists (its launcher, not yet the server)."""
    gate = target.root / "decode.gate"
    gated = [*stack.service("decode")["start"]]
    stack.configure(prefill=stack.service("prefill"), decode=stack.service("decode", start=[
        "sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.02; done; exec "$0" "$@"', *gated]))
    assert str(stack.ports["decode"]) in gated
    return gate


def restart_cut_at_decode(target: Project) -> Path:
    """`deployer restart prefill decode` SIGKILLed once decode's start is under way (prefill is up again): its run."""
    run = cut_at(target, ["restart", "--host", "box", "prefill", "decode"], DECODE_STARTING,
                 "decode's start under way")
    age_lock(target.repo)
    assert state_of(run)["phase"] == "restarting"
    return run


def test_a_restart_cut_after_its_first_service_came_up_is_finished_by_recover_keeping_that_one(
        target: Project, stack: Stack) -> None:
    """`deployer restart` SIGKILLed once prefill is up again and decode's start is under way (its launcher waits
    at a gate, so the kill lands while decode cannot answer yet): recover keeps prefill (the process the cut
    restart started, healthy) and restarts decode; the cut run ends succeeded, not settled with decode down."""
    stack.start_services()
    gate = gated_decode(target, stack)
    run = restart_cut_at_decode(target)
    gate.touch()
    prefill = stack.pids()["prefill"]
    done = target.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kept prefill (restarted by it already)" in done.stdout, done.stdout
    assert healthy(stack) and stack.pids()["prefill"] == prefill
    assert state_of(run)["phase"] == "succeeded"
    recover_id = target.newest_run()
    started = [e["service"] for e in target.events(recover_id) if e["type"] == "service_started"]
    assert started == ["decode"]
    again = target.deployer("restart", "--host", "box", "decode")  # nothing of the cut run holds the host
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_recover_cut_after_it_brought_a_service_up_leaves_it_to_the_next_recover_which_keeps_it(
        target: Project, stack: Stack) -> None:
    """An apply SIGKILLed while decode's start waits at a gate (prefill up on the fix); its recover keeps prefill,
    restarts decode (the cut run never saw it healthy) and is SIGKILLed in turn while its drain waits. The next
    recover keeps both, prefill (the cut run's) and decode (the cut recover's): no second outage for either, and
    it says who started each."""
    stack.start_services()
    gate = gated_decode(target, stack)
    target.playbook(steps=CHAIN)
    run = cut_at(target, ["apply", "fix.yaml", "--host", "box"], DECODE_STARTING, "decode's start under way")
    gate.touch()
    age_lock(target.repo)
    first = cut_at(target, ["recover", run.name], '"type": "step_start", "host": "box", "step": "drain"',
                   "the recover's drain").name
    assert [e["service"] for e in target.events(first) if e["type"] == "service_started"] == ["decode"]
    age_lock(target.repo)
    # One notice, one command: recovering the run settles its cut recover too (it named both, each with its own).
    noticed = [line for line in target.deployer("check", "--host", "box").stderr.splitlines() if "never ended" in line]
    assert len(noticed) == 1 and f"run {run.name} on box never ended" in noticed[0], noticed
    assert f"deployer recover {run.name} (which ends its cut recover {first} too)" in noticed[0], noticed
    pids = stack.pids()
    stack.set_gauge(0.0)
    # Named by the cut recover's id (`runs list` shows it cut too): the run it was recovering is what is finished.
    done = target.deployer("recover", first)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run {first} is a recover of run {run.name}, which is not finished: recovering run {run.name}" in \
        done.stderr, done.stderr
    assert "kept prefill (already serving its commit)" in done.stdout, done.stdout
    assert f"kept decode (started by recover {first}, which stopped before its end)" in done.stdout, done.stdout
    # The step's own line names that recover too (it said "started by the earlier run this one finishes").
    assert re.search(rf"\] kept decode \(pid \d+\): started by run {first}, still that process", done.stdout), \
        done.stdout
    assert stack.pids() == pids and healthy(stack)
    assert state_of(run)["phase"] == "succeeded"
    events = target.events(target.newest_run())
    assert sorted(e["service"] for e in events if e["type"] == "service_kept") == ["decode", "prefill"]
    assert not [e for e in events if e["type"] in ("service_stopped", "service_started")]
    # The cut recover is settled with it: nothing of its own was left (the lock it held was taken over).
    listed = json.loads(target.deployer("runs", "list", "--json").stdout)["runs"]
    assert [r["state"] for r in listed if r["run_id"] == first] == ["canceled"], listed
    verified = target.deployer("runs", "verify", first)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    again = target.deployer("recover", first)
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stdout + again.stderr


def test_a_first_ctrl_c_in_recovers_restart_lets_it_finish_then_stops_and_the_next_recover_keeps_it(
        target: Project, stack: Stack) -> None:
    """An apply cut at decode's start; its recover gets a Ctrl-C while its own start of decode waits at the gate.
    That start is not abandoned half way (decode launched, never proven): the restart goes on to its end, decode
    serves, and the recover stops before its drain. The next recover keeps both services and drains."""
    stack.start_services()
    gate = gated_decode(target, stack)
    target.playbook(steps=CHAIN)
    run = cut_at(target, ["apply", "fix.yaml", "--host", "box"], DECODE_STARTING, "decode's start under way")
    age_lock(target.repo)
    before = set(target.runs.iterdir())

    def ctrl_c(proc: Any) -> None:
        proc.send_signal(signal.SIGINT)
        gate.touch()

    stopped = act_when(target, ["recover", run.name], lambda: logged_since(target, before, DECODE_STARTING), ctrl_c,
                       "recover's start of decode")
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    assert "the cut run's restart goes on to its end first" in stopped.stderr, stopped.stderr
    assert f"Run {run.name} is not finished: deployer recover {run.name} --host box" in stopped.stderr
    first = target.newest_run()
    ends = {e["step"]: e["status"] for e in target.events(first) if e["type"] == "step_end"}
    assert ends == {"co_restart": "ok", "drain": "canceled"}, ends
    assert healthy(stack)
    pids = stack.pids()
    stack.set_gauge(0.0)
    done = target.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"kept decode (started by recover {first}, which stopped before its end)" in done.stdout, done.stdout
    assert stack.pids() == pids and state_of(run)["phase"] == "succeeded"


def held_mv(root: Path) -> tuple[Path, Path, Path]:
    """A folder with an `mv` that, while the file HOLD exists, holds any rename of a `.proc` record (the pid record
    of a start) after saying so in HELD; the folder, HOLD and HELD."""
    folder, hold, held = root / "held-bin", root / "HOLD", root / "HELD"
    folder.mkdir()
    real = shutil.which("mv")
    (folder / "mv").write_text(f"""#!/bin/sh
case "$*" in *.proc*) if [ -e "{hold}" ]; then : >"{held}"; i=0
  while [ -e "{hold}" ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i + 1)); done; fi;; esac
exec {real} "$@"
""")
    (folder / "mv").chmod(0o755)
    return folder, hold, held


def test_a_start_cut_before_its_pid_was_recorded_is_still_the_service_recover_restarts(
        target: Project, stack: Stack) -> None:
    """The run is SIGKILLed while prefill's launch is between starting the server and renaming its pid record into
    place (held there by an `mv` on the service's PATH); the run's agent then kills what it runs, the launch with
    it. The server must not be left running unrecorded: recover would find a process answering that no record
    names and refuse to restart over it ("started outside deployer"). Recover restarts onto the fix."""
    stack.start_services()
    folder, hold, held = held_mv(target.root)
    path = {"env": {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}}
    stack.configure(prefill=stack.service("prefill", **path), decode=stack.service("decode", **path))
    target.playbook(steps=CHAIN)
    stack.set_gauge(0.0)
    before = set(target.runs.iterdir())
    hold.touch()
    launches: set[int] = set()

    def cut(proc: Any) -> None:
        launches.update(processes_naming("deployer-launch", str(target.repo)))
        proc.send_signal(signal.SIGKILL)

    try:
        done = act_when(target, ["apply", "fix.yaml", "--host", "box"], held.exists, cut,
                        "prefill's pid record held")
        assert done.returncode == -signal.SIGKILL
        assert launches, "prefill's launch was not running at the cut"
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in launches),
                 "the cut run's agent killing the launch", 30)
    finally:
        hold.unlink()
    try:
        run = next(iter(set(target.runs.iterdir()) - before))
        age_lock(target.repo)
        recovered = target.deployer("recover", run.name)
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        assert healthy(stack) and target.file("pkg/a.py") == FIXED_A
        assert state_of(run)["phase"] == "succeeded"
        serving = processes_naming("http.server", str(stack.ports["prefill"]))
        assert serving == {stack.pids()["prefill"]}, (serving, stack.pids())
    finally:
        kill_naming("http.server", str(stack.www))  # a server the run left unrecorded is no fixture's to stop


def test_a_start_whose_pid_record_cannot_be_written_starts_nothing_and_says_why(
        target: Project, stack: Stack) -> None:
    stack.start_services()
    (target.repo / ".git" / "deployer" / "decode.proc.tmp").mkdir()  # where the record is written first
    target.playbook(steps=[{"co_restart": {}}])
    failed = target.deployer("apply", "fix.yaml", "--host", "box")
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert "cannot record this start in" in failed.stderr and "so nothing was started" in failed.stderr, failed.stderr
    assert not processes_naming("http.server", str(stack.ports["decode"])), "a server no record names"
    (target.repo / ".git" / "deployer" / "decode.proc.tmp").rmdir()
    again = target.deployer("restart", "--host", "box", "decode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert healthy(stack)


def test_the_lineage_read_takes_a_recover_of_that_is_no_run_id_as_naming_no_run(tmp_path: Path) -> None:
    """A log is input: a run_start whose recover_of is a list (a log edited by hand) names no run, rather than
    failing the recover that reads the runs dir."""
    from deployer.run.serving import with_its_recovers

    first, odd, recover = "20261205T000000.000Z-aaaaaa", "20261205T000001.000Z-bbbbbb", "20261205T000002.000Z-cccccc"
    for run_id, start in ((first, {}), (odd, {"recover_of": [first]}), (recover, {"recover_of": first})):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "events.jsonl").write_text(json.dumps({"type": "run_start", **start}) + "\n")
    assert [run.run_id for run in with_its_recovers(tmp_path, first)] == [first, recover]


def test_unproven_names_who_restarted_each_service_since_the_cut_run_took_its_load() -> None:
    """A later recover that restarted nothing itself said "recover restarted decode" of what a cut recover had
    restarted (the summary's why; the step-level behaviour is above)."""
    from types import SimpleNamespace

    from deployer.run.recover import _unproven
    from deployer.steps.base import Effect

    after = [SimpleNamespace(name="storm", effect=Effect.loads), SimpleNamespace(name="drain", effect=Effect.verifies)]
    earlier = {"decode": "R2", "router": "R2"}
    assert _unproven(after, None, [], earlier) == (
        "recover R2 had restarted decode, router, and no storm is sent again, so the drain read servers that never "
        "saw the run's load")
    assert _unproven(after, None, ["prefill"], earlier).startswith(
        "recover restarted prefill and recover R2 had restarted decode, router, and no storm")
    assert _unproven(after[1:], None, ["prefill"], earlier) is None  # no load: proven
