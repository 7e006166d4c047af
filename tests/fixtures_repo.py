"""A throwaway target: a real git repo, an inventory naming it, fix files and a playbook writer.

The `target` fixture is parametrized over transports: the same tests run against a `local`
host and against the real sshd from fixtures_ssh (the repo is on this machine either way).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import prefork
import pytest
import yaml
from fixtures_netns import Netns
from polling import within
from pydantic import TypeAdapter

from deployer.command import Masker
from deployer.config.models import AnyHost, FileSpec, Playbook
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Context, EventBus, LoadedPlaybook
from deployer.transport.factory import open_transport

ORIGINAL_A = "def answer():\n    return 41\n"
FIXED_A = "def answer():\n    return 42\n\n\ndef extra():\n    return 'new'\n"
ORIGINAL_B = "VALUE = 1\n"


def deployer_env(**extra: str) -> dict[str, str]:
    """This process's environment less any DEPLOYER_* setting (a test names each one it means), colour off; its
    XDG_STATE_HOME, and so the default runs dir, is the test's own (conftest's own_history)."""
    # DEPLOYER_DAEMON off: never a daemon this user started (deployer/daemon); a test that wants one starts its own.
    return ({k: v for k, v in os.environ.items() if not k.startswith("DEPLOYER_")}
            | {"NO_COLOR": "1", "DEPLOYER_DAEMON": "off", **extra})


def deployer(*args: str, cwd: Path, env: dict[str, str] | None = None,
             timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`python -m deployer *args` run to its end in cwd, stdin closed; env defaults to deployer_env().
    Forked from a server that has imported deployer (tests/prefork.py): the suite's CPU is mostly start-up."""
    return prefork.run(list(args), cwd, deployer_env() if env is None else env, timeout)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    # Its stderr in the failure: a CalledProcessError says only the exit status (a CI run's `reset --hard` failed so).
    assert done.returncode == 0, f"git {' '.join(args)} in {repo} exited {done.returncode}: {done.stderr.strip()}"
    return done.stdout


def init_repo(repo: Path, files: dict[str, str]) -> None:
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "target@example.invalid")
    git(repo, "config", "user.name", "target")
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")


def tree_snapshot(root: Path) -> dict[str, str]:
    """sha256 and mode of every file under root, .git included, for byte-identical comparisons."""
    snap = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() or path.is_symlink():
            data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            snap[str(path.relative_to(root))] = f"{hashlib.sha256(data).hexdigest()} {path.lstat().st_mode:o}"
    return snap


def target_python(project: Project, before: str, *, then: str | None = None) -> str:
    """A venv python for the target whose step calls (remote_compile) run the shell `before` first.

    deployer's agent starts with the same python (`python -I -S -c <bootstrap>`, the bootstrap names
    AGENT_SOURCE) and passes straight through, so only the steps' own python is slowed or paused. `then`
    replaces the final exec."""
    finish = then if then is not None else f'exec {sys.executable} "$@"'
    wrapper = project.write("venv/bin/python", f'#!/bin/sh\ncase "$4" in *AGENT_SOURCE*) exec {sys.executable} "$@";; '
                                               f"esac\n{before}\n{finish}\n")
    wrapper.chmod(0o755)
    return str(wrapper)


# A failure after the upload that nothing judged before the run could foresee (a bounds or compile problem
# fails before the target is touched): the target's python refuses to compile, so what follows is the restore.
AFTER_UPLOAD_FAILS = ["upload", "remote_compile"]
COMPILE_REFUSED = "compile refused by the test"


def refusing_python(project: Project) -> str:
    """The target's python for AFTER_UPLOAD_FAILS: the agent starts, remote_compile exits 3."""
    return target_python(project, f"echo '{COMPILE_REFUSED}' >&2; exit 3")


def signal_one(pid: int, signum: int, *, to_a_worker_thread: bool = False) -> None:
    """Send signum to the process, or to one of its threads that is not the main one: kill(2) of a thread id makes
    that thread take it (the kernel may hand any thread a process's signal; Python runs the handler in the main
    thread only). A thread that ended meanwhile is skipped."""
    if not to_a_worker_thread:
        os.kill(pid, signum)
        return
    for tid in (int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid):
        try:
            os.kill(tid, signum)
            return
        except ProcessLookupError:
            continue
    raise AssertionError(f"process {pid} has no thread but its main one to signal")


def staged_bytes(repo: Path, dest: str) -> str | None:
    """What an upload staged for dest beside it (for remote_compile to compile before it goes live); None: none."""
    path = repo / dest
    for temp in path.parent.glob(f".{path.name}.deployer-staged-*.tmp"):
        try:
            return temp.read_text()
        except FileNotFoundError:  # renamed into place meanwhile
            continue
    return None


def age_lock(repo: Path) -> None:
    """Backdate the heartbeat of the lock a killed run left, as if its TTL had passed (recover takes over only
    a stale lock). The killed run's agent exited when its stdin closed, so nothing beats it again."""
    heartbeat = repo / ".git" / "deployer.run.lock" / "heartbeat"
    if heartbeat.exists():
        old = time.time() - 24 * 3600
        os.utime(heartbeat, (old, old))


def wait_until_lock_stale(repo: Path, ttl_s: float, seconds: float = 60) -> None:
    """Wait, as a person would, until the heartbeat of the lock a cut run left is older than its TTL: the cut
    run's agent beats until its end of the link notices, so backdating could race its last beat. The target
    reads ages in whole seconds (`date +%s`, `stat -c %Y`): one more second before it sees the TTL passed."""
    heartbeat = repo / ".git" / "deployer.run.lock" / "heartbeat"
    deadline = time.monotonic() + seconds
    while heartbeat.exists() and time.time() - heartbeat.stat().st_mtime <= ttl_s + 1.5:
        assert time.monotonic() < deadline, "the cut run's agent never stopped beating"
        time.sleep(0.1)


def act_when(project: Project, args: Sequence[str], reached: Callable[[], bool],
             act: Callable[[subprocess.Popen[str]], None], what: str, *,
             cleanup: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `deployer *args`; once `reached()` (polled, within a minute) do `act` (given the deployer's process),
    and let the run end: its outcome.
    `cleanup` runs whatever happens (a gate to open); a run still going then is killed."""
    proc = project.popen(*args)
    try:
        deadline = time.monotonic() + 60
        while not reached():
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"{what} never came: deployer ended first, exit {proc.returncode}\n{out}{err}")
            assert time.monotonic() < deadline, f"{what} never came within a minute"
            time.sleep(0.01)
        act(proc)
        out, err = proc.communicate(timeout=120)
    finally:
        if cleanup is not None:
            cleanup()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def recovered_keeping_its_commit(project: Project, run: Path) -> None:
    """`recover RUN` exits 0 and records HEAD as the cut run's commit; its log then verifies against the target."""
    recovered = project.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    state = json.loads((run / "state.json").read_text())
    assert (state["phase"], state["git_after"]) == ("failed_committed", project.head())
    # The commit is the cut run's, and the recover's summary says whose: `commit F (was B)` read as the recover's.
    assert f"commit {project.head()} (run {run.name}'s commit; was " in recovered.stdout, recovered.stdout
    verified = project.deployer("runs", "verify", run.name, "--target")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def hold_lock(project: Project) -> Path:
    """The target's deploy lock held by a live-looking run of someone else (fresh heartbeat); its dir."""
    lock = project.repo / ".git" / "deployer.run.lock"
    lock.mkdir()
    (lock / "info.json").write_text(json.dumps({"run_id": "20260101T000000.000Z-abcdef", "operator": "alice@ops",
                                                "pid": 4242, "ttl_s": 600}))
    (lock / "heartbeat").write_text("")
    return lock


def work_tree(root: Path) -> dict[str, str]:
    """tree_snapshot without .git: the files a run may change (git's own bookkeeping moves anyway)."""
    return {k: v for k, v in tree_snapshot(root).items() if not k.startswith(".git/")}


@dataclass
class Project:
    root: Path
    repo: Path
    host: dict[str, Any]
    host_name: str = "box"
    extra_env: dict[str, str] = field(default_factory=dict)
    # Set when the target is an sshd in its own network namespace: its 127.0.0.1 is not ours.
    netns: Netns | None = None

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def inventory(self) -> Path:
        return self.root / "hosts.yaml"

    def newest_run(self) -> str:
        return sorted(self.runs.iterdir())[-1].name

    def events(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The run log of run_id (by default the newest run), one dict per line. A line without its newline is
        not written yet (a live run's log is read while deployer appends to it): it is left out."""
        data = (self.runs / (run_id or self.newest_run()) / "events.jsonl").read_bytes()
        return [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines()]

    def applied(self, **playbook: Any) -> str:
        """fix.yaml written with these playbook fields and applied successfully; the run's id."""
        self.playbook(**playbook)
        result = self.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 0, result.stderr
        return self.newest_run()

    def write_inventory(self, **host_overrides: Any) -> Path:
        host = {**self.host, **host_overrides}
        self.inventory.write_text(yaml.safe_dump({"hosts": {self.host_name: host}}, sort_keys=False))
        return self.inventory

    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def playbook(self, *, files: list[dict[str, str]] | None = None, steps: list[Any] | None = None,
                 name: str = "fix.yaml", **extra: Any) -> Path:
        body: dict[str, Any] = {"name": "answer fix"}
        if "patch" not in extra:
            body["files"] = files if files is not None else [{"src": "fix/a.py", "dest": "pkg/a.py"}]
        body["steps"] = steps if steps is not None else [
            "local_compile", "upload", "remote_compile",
            {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
            {"commit": {"message": "pkg: answer is 42"}}]
        body.update(extra)
        return self.write(name, yaml.safe_dump(body, sort_keys=False))

    def env(self) -> dict[str, str]:
        """The environment deployer runs in for this project: its inventory and runs dir, then extra_env."""
        return deployer_env(**{"DEPLOYER_INVENTORY": str(self.inventory), "DEPLOYER_RUNS_DIR": str(self.runs),
                               **self.extra_env})

    def deployer(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return deployer(*args, cwd=self.root, env=self.env(), timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "deployer", *args], cwd=self.root, env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)

    def hook(self, name: str, body: str) -> None:
        """Install a git hook in the target repo (runs only under `hooks: true`, or for hooks git always runs)."""
        hook = self.repo / ".git" / "hooks" / name
        hook.write_text(body)
        hook.chmod(0o755)

    def head(self) -> str:
        return git(self.repo, "rev-parse", "HEAD").strip()

    def sealed(self, commit: str = "HEAD") -> str:
        """The seal on commit (refs/notes/deployer-seal), once there: a run sends it as it closes the connection
        and does not wait for it, so over SSH it may land a moment after deployer exited."""
        def shown() -> str:
            return subprocess.run(["git", "-C", str(self.repo), "notes", "--ref", "deployer-seal", "show", commit],
                                  capture_output=True, text=True).stdout
        assert within(lambda: shown() != "", 30), f"no seal on {commit} (refs/notes/deployer-seal)"
        return shown()

    def file(self, rel: str) -> str:
        return (self.repo / rel).read_text()


# Opt in per test with @pytest.mark.parametrize("target", LOOPBACK_TRANSPORTS, indirect=True): the tests
# that reach URLs on the target's loopback, which only a namespace tells apart from ours. ssh-netns is the ssh
# transport as `ssh` is, on a loopback of its own: a plain `ssh` target there would run the same path again.
LOOPBACK_TRANSPORTS = ["local", "ssh-netns"]


@pytest.fixture(params=["local", "ssh"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    repo = tmp_path / "target" / "repo"
    init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B,
                     "README": "target repo\n"})
    host: dict[str, Any] = {"repo": str(repo), "python": sys.executable}
    netns = None
    if request.param == "local":
        host["transport"] = "local"
    else:
        if request.param == "ssh-netns":
            isolated = request.getfixturevalue("netns_sshd")
            sshd, netns = isolated.sshd, isolated.netns
        else:
            sshd = request.getfixturevalue("sshd")
        host.update({"transport": "ssh", "address": sshd.host, "port": sshd.port, "user": sshd.user,
                     "identity_file": str(sshd.client_key), "known_hosts": str(sshd.known_hosts)})
    project = Project(root=tmp_path, repo=repo, host=host, netns=netns)
    project.write_inventory()
    project.write("fix/a.py", FIXED_A)
    yield project


@pytest.fixture
def context(target: Project) -> Iterator[Context]:
    """A Context on the target, for calling deployer's functions directly (with inputs the loader would refuse)."""
    host = TypeAdapter(AnyHost).validate_python(target.host)
    bus = EventBus(Masker(), target.host_name)
    model = Playbook(name="t", files=[FileSpec(src="a.py", dest="pkg/a.py")], steps=["upload"])
    playbook = LoadedPlaybook(path=target.root / "fix.yaml", raw=b"", model=model, sources={}, patch=None)
    transport = open_transport(target.host_name, host, bus)
    try:
        yield Context(run_id="t", host_name=target.host_name, host=host, transport=transport, playbook=playbook,
                      bus=bus, cancel=CancelToken())
    finally:
        transport.close()
