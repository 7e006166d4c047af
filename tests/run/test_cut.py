"""A run can be cut anywhere: the TCP link to a real sshd is cut at points spread over a whole apply, then
`deployer recover` ends the run. After each cut: the target is byte for byte as before, or holds exactly the
run's commit and the log says so; no temp files, no lock, no intent record; owner and mode kept; the runs
verify.

The relay between deployer and sshd is real TCP on 127.0.0.1; it cuts the first connection after N bytes
(or when the run reaches a phase), with a FIN or an RST, and lets later connections (the recover) through.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import (
    FIXED_A,
    ORIGINAL_A,
    ORIGINAL_B,
    Project,
    act_when,
    age_lock,
    git,
    init_repo,
    recovered_keeping_its_commit,
    wait_until_lock_stale,
    work_tree,
)
from fixtures_services import Stack
from fixtures_ssh import SSHD
from polling import within

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

pytest_plugins = ["fixtures_repo", "fixtures_ssh", "fixtures_services"]

FIXED_B = ORIGINAL_B.rstrip("\n") + "\n\n\ndef more():\n    return 'b'\n"


class CuttingRelay:
    """Relays 127.0.0.1:port to sshd; the first connection is cut once `budget` bytes went through."""

    def __init__(self, target_port: int, delay_s: float = 0.01) -> None:
        # A little latency on every answer: each phase then lasts long enough to be cut inside.
        self.delay_s = delay_s
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.budget: int | None = None
        self.rst = False
        self.relayed = 0
        self.first: list[socket.socket] = []
        self.connections = 0
        self.answers_left: int | None = None  # answers from the target still let through before a cut
        self.frozen = False  # the first connection swallows what either side sends: no FIN, no RST
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, budget: int | None, *, rst: bool) -> None:
        with self.lock:
            self.budget, self.rst, self.relayed, self.first, self.connections = budget, rst, 0, [], 0
            self.answers_left, self.frozen = None, False

    def freeze(self) -> None:
        """A partition on the first connection: both ends stay open, and nothing more gets through."""
        with self.lock:
            self.frozen = True

    def cut_after_answer(self) -> None:
        """Let the target's next answer through whole, then cut: whatever it sends after that is lost."""
        with self.lock:
            self.answers_left = 1

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.connections += 1
                cuttable = self.connections == 1
                if cuttable:
                    self.first = [client, upstream]
            for src, dst, delay in ((client, upstream, 0.0), (upstream, client, self.delay_s)):
                threading.Thread(target=self._pipe, args=(src, dst, cuttable, delay, src is upstream),
                                 daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, cuttable: bool, delay: float,
              answers: bool = False) -> None:
        try:
            while data := src.recv(16384):
                time.sleep(delay)
                if cuttable:
                    with self.lock:
                        if self.frozen:
                            continue
                        room = None if self.budget is None else self.budget - self.relayed
                        if room is not None and room <= len(data):
                            if room > 0:
                                dst.sendall(data[:room])
                            self.relayed += max(room, 0)
                            self._cut_locked()
                            return
                        self.relayed += len(data)
                dst.sendall(data)
                if cuttable and answers:
                    with self.lock:
                        if self.answers_left is not None:
                            self.answers_left -= 1
                            if self.answers_left <= 0:
                                self._cut_locked()
                                return
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def cut(self) -> None:
        with self.lock:
            self._cut_locked()

    def _cut_locked(self) -> None:
        for sock in self.first:
            with contextlib.suppress(OSError):
                if self.rst:  # linger 0: close sends RST, as a dropped NAT entry or a reboot does
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    # A thread blocked reading the socket holds it open: wake it (sending nothing), so the
                    # close below is the last one and the RST goes out now.
                    sock.shutdown(socket.SHUT_RD)
                else:
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        self.budget = -1  # anything after the cut on this connection is dropped

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def relay(sshd: SSHD) -> Iterator[CuttingRelay]:
    proxy = CuttingRelay(sshd.port)
    yield proxy
    proxy.close()


@pytest.fixture
def cut_target(tmp_path: Path, sshd: SSHD, relay: CuttingRelay) -> Iterator[tuple[Project, Stack]]:
    repo = tmp_path / "target" / "repo"
    init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B, "README": "r\n"})
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{relay.port} {sshd.host_pubkey_line}\n")
    host: dict[str, Any] = {"transport": "ssh", "address": "127.0.0.1", "port": relay.port, "user": sshd.user,
                            "identity_file": str(sshd.client_key), "known_hosts": str(known),
                            "ssh_config": os.devnull, "repo": str(repo), "python": "python3", "lock_ttl_s": 30}
    project = Project(root=tmp_path, repo=repo, host=host)
    project.write_inventory()
    project.write("fix/a.py", FIXED_A)
    project.write("fix/b.py", FIXED_B)
    stack = Stack(project)
    stack.configure()
    project.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                     steps=["local_compile", "upload", "remote_compile",
                            {"diff_bounds": {"files": 2, "insertions": [1, 20], "deletions": [0, 2]}},
                            {"commit": {"message": "pkg: answer is 42"}}, {"co_restart": {}}])
    os.chown(repo / "pkg/a.py", 12345, 12346)
    (repo / "pkg/a.py").chmod(0o640)
    try:
        yield project, stack
    finally:
        stack.kill_all()


def reset(project: Project, stack: Stack, base: str) -> None:
    """Back to the base commit with no service running, for the next cut point."""
    stack.kill_all()
    # The cut run's agent may still finish a git command it had started (it stops at its stdin's end): wait
    # for its index.lock to go. One that stays is a finding, not a race; one that took over 10 s to go was seen
    # once, on a machine at a load of 9-10, right after the two whole applies (no cut run yet).
    lock = project.repo / ".git" / "index.lock"
    assert within(lambda: not lock.exists(), 30), "a git index.lock outlived the cut run and its recover"
    git(project.repo, "reset", "-q", "--hard", base)
    os.chown(project.repo / "pkg/a.py", 12345, 12346)
    (project.repo / "pkg/a.py").chmod(0o640)


def phase_of(run: Path) -> str:
    return str(json.loads((run / "state.json").read_text())["phase"])


def assert_consistent(project: Project, run: Path, base: str, before: dict[str, str]) -> str:
    """Either exactly as before, or exactly the run's commit on top of base; returns which."""
    git_dir = project.repo / ".git"
    assert not (git_dir / "deployer.run.lock").exists(), "lock left"
    assert not (git_dir / "deployer" / "inflight.json").exists(), "intent record left"
    assert [p for p in project.repo.rglob("*deployer*.tmp")] == []
    assert git(project.repo, "status", "--porcelain", "--untracked-files=all") == ""
    st = (project.repo / "pkg/a.py").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (12345, 12346, 0o640)
    assert project.deployer("runs", "verify", run.name).returncode == 0
    if project.head() == base:
        assert work_tree(project.repo) == before
        return "restored"
    assert git(project.repo, "rev-parse", "HEAD~1").strip() == base
    assert f"Deployer-Run: {run.name}" in git(project.repo, "log", "-1", "--format=%B")
    assert project.file("pkg/a.py") == FIXED_A and project.file("pkg/b.py") == FIXED_B
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    said = [e for e in events if e["type"] in ("commit", "recovered_by") and e.get("commit") == project.head()]
    assert said, "the log does not say which commit the run left"
    return "committed"


def agents_of(sshd_port: int) -> list[int]:
    """The pids of deployer agents that sshd on sshd_port runs (its sessions name the port in SSH_CONNECTION)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            environ = (proc / "environ").read_bytes().split(b"\0")
            connection = next((v for v in environ if v.startswith(b"SSH_CONNECTION=")), b"")
            if connection.endswith(f" {sshd_port}".encode()) and b"deployer agent" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def gits_in(repo: Path) -> list[int]:
    """The pids of git processes working in repo."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            cwd = Path(os.readlink(proc / "cwd"))
            if (proc / "comm").read_text().strip() == "git" and (cwd == repo or repo in cwd.parents):
                found.append(int(proc.name))
    return found


def cut_and_recover(project: Project, relay: CuttingRelay, *, budget: int | None, rst: bool,
                    when: Callable[[], bool] | None = None) -> tuple[Path, str, int]:
    relay.arm(budget, rst=rst)
    proc = project.popen("apply", "fix.yaml", "--host", "box")
    if when is not None:
        deadline = time.monotonic() + 60
        while not when() and proc.poll() is None:
            assert time.monotonic() < deadline, "the phase to cut at never came"
            time.sleep(0.01)
        relay.cut()
    try:
        proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    run = project.runs / project.newest_run()
    left = phase_of(run)
    # A lock past its TTL means its run is gone: only once the cut run's agent has noticed the cut and ended,
    # and the git command it had started has ended too.
    assert within(lambda: not agents_of(relay.target[1]) and not gits_in(project.repo), 30), \
        "the cut run's agent or its git outlived the cut"
    age_lock(project.repo)
    relay.arm(None, rst=False)
    recovered = project.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    return run, left, proc.returncode


def test_an_apply_cut_at_twelve_points_is_always_recovered_to_a_consistent_target(
        cut_target: tuple[Project, Stack], relay: CuttingRelay) -> None:
    project, stack = cut_target
    base, before = project.head(), work_tree(project.repo)
    # The whole conversation, measured as every cut run has it: the first apply over this sshd sends the agent's
    # source and leaves it in the target user's cache, so it is measured on a second one (the cache is the sshd's
    # HOME's: alone, this test's first apply is such a first; in a suite run another test's may have been).
    for _ in range(2):
        reset(project, stack, base)
        relay.arm(None, rst=False)
        whole = project.deployer("apply", "fix.yaml", "--host", "box")
        assert whole.returncode == 0, whole.stderr
    total = relay.relayed
    assert total > 10_000
    outcomes = []
    # Eight byte offsets spread over the whole conversation, alternating FIN and RST ...
    for i, fraction in enumerate((0.02, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.97)):
        reset(project, stack, base)
        run, left, code = cut_and_recover(project, relay, budget=int(total * fraction), rst=i % 2 == 1)
        outcomes.append((f"{fraction:.0%}", left, code, assert_consistent(project, run, base, before)))
    # ... and four cuts timed by the run's own phase: inside the upload, the commit and the restart (twice). The
    # commit goes with the upload (sent ahead), so its cut comes once state.json says it was sent: by the commit
    # step's own phase the batch has been answered, and that phase may last less than a poll.
    for phase in ("changing", "committing", "restarting", "restarting"):
        reset(project, stack, base)

        def reached(phase: str = phase) -> bool:
            with contextlib.suppress(ValueError, OSError, json.JSONDecodeError, KeyError):
                state = json.loads((project.runs / project.newest_run() / "state.json").read_text())
                sent = state.get("sent_ahead", [])[-1:] == ["commit"]
                return state["phase"] == phase or (phase == "committing" and sent)
            return False

        run, left, code = cut_and_recover(project, relay, budget=None, rst=phase == "committing", when=reached)
        outcomes.append((phase, left, code, assert_consistent(project, run, base, before)))
    print("\n".join(f"cut at {where}: left {left} (exit {code}) -> {end}" for where, left, code, end in outcomes))
    assert {end for *_, end in outcomes} == {"restored", "committed"}
    # Every cut landed inside the run (the last byte offsets may fall after its end).
    assert all(code != 0 for where, _, code, _ in outcomes if where not in ("85%", "97%"))


def held_after_its_commit(project: Project) -> Path:
    """The playbook ends with a commit whose post-commit hook holds the batch (git made the commit) until the
    marker's pid is killed; the marker, once the hook is there."""
    from test_recover import gate

    script, marker = gate(project, "post-commit")
    project.hook("post-commit", f"#!/bin/sh\nexec {script}\n")
    project.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                     steps=["upload", {"commit": {"message": "pkg: answer is 42", "hooks": True}}])
    return marker


def test_a_cut_inside_the_commit_batch_says_the_commit_may_have_landed_and_recover_records_it(
        cut_target: tuple[Project, Stack], relay: CuttingRelay) -> None:
    from test_recover import kill_marker

    project, _ = cut_target
    base = project.head()
    # A post-commit hook holds the commit's batch after git made the commit: the link is cut right there.
    marker = held_after_its_commit(project)
    project.write_inventory(lock_ttl_s=2)  # recover waits for the cut run's heartbeat to go stale: not long
    relay.arm(None, rst=True)
    cut = act_when(project, ("apply", "fix.yaml", "--host", "box"), marker.exists, lambda _: relay.cut(),
                   "the post-commit hook", cleanup=lambda: kill_marker(marker))
    err = cut.stderr
    assert project.head() != base, "the commit did not land before the cut"
    assert cut.returncode == 6, err
    assert f"HEAD should be {base}" not in err and "may be this run's commit" in err, err
    run = project.runs / project.newest_run()
    # The commit went with the upload, behind it, in one batch: the cut lands inside that batch.
    assert json.loads((run / "state.json").read_text())["sent_ahead"][-1:] == ["commit"]
    relay.arm(None, rst=False)
    wait_until_lock_stale(project.repo, 2)
    recovered_keeping_its_commit(project, run)


def test_a_release_whose_reply_is_lost_after_the_commit_exits_0_saying_its_outcome_is_unknown(
        cut_target: tuple[Project, Stack], relay: CuttingRelay) -> None:
    from test_recover import kill_marker

    project, _ = cut_target
    base = project.head()
    # The commit is the last step: the release goes right behind its batch. A post-commit hook holds the batch
    # until the relay is set to let exactly its answer through: the release's answer is lost with the link.
    marker = held_after_its_commit(project)
    relay.arm(None, rst=True)

    def answer_then_cut(_: object) -> None:
        relay.cut_after_answer()
        kill_marker(marker)  # the hook ends: the commit's batch answers, then the release runs

    def parked_and_waited_for() -> bool:
        # The commit went with the upload: the hook may hold it before the upload's answers reached the run.
        # Only once the run waits at its commit is the commit's the one answer left to let through.
        with contextlib.suppress(ValueError, OSError, json.JSONDecodeError):
            return marker.exists() and phase_of(project.runs / project.newest_run()) == "committing"
        return False
    ended = act_when(project, ("apply", "fix.yaml", "--host", "box"), parked_and_waited_for, answer_then_cut,
                     "the post-commit hook", cleanup=lambda: kill_marker(marker))
    out, err = ended.stdout, ended.stderr
    run = project.runs / project.newest_run()
    assert git(project.repo, "rev-parse", "HEAD~1").strip() == base
    assert f"Deployer-Run: {run.name}" in git(project.repo, "log", "-1", "--format=%B")
    # The record says succeeded, and so does the exit code; what is unknown is said, not guessed.
    assert phase_of(run) == "succeeded"
    assert ended.returncode == 0, out + err
    assert "was left on the target" not in err and "its reply was lost" in err, err
    assert "deployer lock status --host box" in err, err
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events][-2:] == ["lock_release_unknown", "run_end"]
    assert events[-1]["status"] == "successful" and events[-1]["exit_code"] == 0
    relay.arm(None, rst=False)
    status = project.deployer("lock", "status", "--host", "box")
    assert status.returncode in (0, 3), status.stdout + status.stderr


def test_a_fleet_host_cut_mid_upload_is_reported_interrupted_with_the_recover_command(
        cut_target: tuple[Project, Stack], relay: CuttingRelay, sshd: SSHD, tmp_path: Path) -> None:
    project, _ = cut_target
    # A second host straight to sshd, beside the one behind the relay: a fleet of two.
    other = tmp_path / "other" / "repo"
    init_repo(other, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B, "README": "r\n"})
    known = tmp_path / "known_hosts"
    known.write_text(known.read_text() + f"[127.0.0.1]:{sshd.port} {sshd.host_pubkey_line}\n")
    hosts = {"box": project.host, "plain": {**project.host, "port": sshd.port, "repo": str(other)}}
    project.inventory.write_text(json.dumps({"hosts": hosts}))
    # A new file: its count cannot be told ahead, so the commit is sent in its turn, after the checks' answers
    # came back here; the cut between the files going live and the commit then always comes first.
    project.write("fix/new_mod.py", "NEW = True\n")
    project.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"},
                            {"src": "fix/new_mod.py", "dest": "pkg/new_mod.py", "create": True}],
                     steps=["upload", "remote_compile", {"diff_bounds": {"files": 2}},
                            {"commit": {"message": "pkg: answer is 42"}}])
    base = project.head()
    relay.arm(None, rst=False)
    cut = act_when(project, ("apply", "fix.yaml", "--host", "box,plain", "--json"),
                   lambda: project.file("pkg/a.py") == FIXED_A and (project.repo / "pkg/new_mod.py").exists(),
                   lambda _: relay.cut(), "the upload")
    report = json.loads(cut.stdout)
    fleet = json.loads((project.runs / report["fleet_id"] / "fleet.json").read_text())
    for row in (report["hosts"], fleet["hosts"]):
        # The host behind the cut link holds the new bytes, its intent record and lock: interrupted, as its
        # record says; `status` stays what it was, for scripts that read it.
        assert (row["box"]["state"], row["box"]["status"]) == ("interrupted", "failed"), row
        assert (row["plain"]["state"], row["plain"]["status"]) == ("succeeded", "successful"), row
    assert (project.repo / ".git" / "deployer" / "inflight.json").exists()
    assert f"deployer recover {report['fleet_id']}" in report["error"], report["error"]
    shown = project.deployer("runs", "show", report["fleet_id"])
    assert "interrupted" in shown.stdout, shown.stdout
    listed = project.deployer("runs", "list")
    assert "box:interrupted" in listed.stdout and "plain:succeeded" in listed.stdout, listed.stdout
    relay.arm(None, rst=False)
    age_lock(project.repo)
    recovered = project.deployer("recover", report["fleet_id"])
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert project.head() == base and project.file("pkg/a.py") == ORIGINAL_A
    assert not (project.repo / "pkg/new_mod.py").exists()
    fleet = json.loads((project.runs / report["fleet_id"] / "fleet.json").read_text())
    assert fleet["hosts"]["box"]["state"] == "failed_restored", fleet["hosts"]["box"]


def test_a_link_that_freezes_after_the_commit_batch_ran_ends_as_the_end_note_says_once_recovered(
        cut_target: tuple[Project, Stack], relay: CuttingRelay) -> None:
    from test_recover import kill_marker

    project, _ = cut_target
    base = project.head()
    marker = held_after_its_commit(project)
    project.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                     steps=["upload", {"commit": {"message": "pkg: answer is 42", "hooks": True, "timeout_s": 2}}])
    relay.arm(None, rst=False)

    def freeze_then_go(_: object) -> None:
        relay.freeze()  # the agent keeps its stdin: it runs the batch, the release and the note behind it
        kill_marker(marker)

    def parked_and_waited_for() -> bool:
        with contextlib.suppress(ValueError, OSError, json.JSONDecodeError):
            return marker.exists() and phase_of(project.runs / project.newest_run()) == "committing"
        return False
    try:
        frozen = act_when(project, ("apply", "fix.yaml", "--host", "box"), parked_and_waited_for, freeze_then_go,
                          "the post-commit hook", cleanup=lambda: kill_marker(marker))
    finally:
        relay.cut()  # the frozen link's agent ends with its stdin
    run = project.runs / project.newest_run()
    # The client lost the answer; the target holds the commit, released, with the note that says it succeeded.
    assert frozen.returncode == 6, frozen.stdout + frozen.stderr
    assert git(project.repo, "rev-parse", "HEAD~1").strip() == base
    assert "status=successful exit_code=0 phase=succeeded" in git(project.repo, "notes", "--ref", "deployer", "show",
                                                                  "HEAD")
    assert within(lambda: not (project.repo / ".git" / "deployer.run.lock").exists(), 10)
    relay.arm(None, rst=False)
    recovered = project.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    state = json.loads((run / "state.json").read_text())
    assert (state["phase"], state["git_after"]) == ("succeeded", project.head()), state
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    link = events[-1]
    assert link["type"] == "recovered_by" and link["end"] == {"status": "successful", "exit_code": 0,
                                                               "phase": "succeeded"}, link
    assert "end note" in link["learnt"], link
    verified = project.deployer("runs", "verify", run.name, "--target")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    rolled = project.deployer("rollback", run.name)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert git(project.repo, "rev-parse", "HEAD~1").strip() == state["git_after"]
    assert project.file("pkg/a.py") == ORIGINAL_A
