"""`deployer demo`: the whole story on this machine, no SSH and no configuration.

A scratch git repo holds the buggy serving stack; its prefill, decode and router run as
real processes (started the way deployer's co_restart starts services, so the apply finds
their PIDs); then the demo playbook runs on it as a `local` host. Every process started
here is stopped again unless the caller keeps the stack.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployer.config import Host, Inventory, resolve_env
from deployer.context import CancelToken, Listener
from deployer.engine import Engine, RunResult
from deployer.errors import ConfigError, DeployerError
from deployer.playbook import load_playbook
from deployer.transport.local import LocalTransport

STACK = Path(__file__).parent / "stack"
PLAYBOOK = Path(__file__).parent / "playbook" / "kvpoll-fix.yaml"  # package data: works from a wheel too
HOST = "demo"
GAUGE = "sglang:num_prefill_inflight_queue_reqs"



def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status of a GET from this machine (the demo's own stack), None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DemoStack:
    workdir: Path
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def repo(self) -> Path:
        return self.workdir / "repo"

    @property
    def state(self) -> Path:
        return self.repo / ".git" / "deployer"

    def url(self, service: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}{path}"

    def host(self) -> Host:
        py = sys.executable
        p = self.ports
        common = ["--model-path", "demo-model", "--disaggregation-transfer-backend", "nixl",
                  "--disaggregation-bootstrap-port", str(p["bootstrap"]), "--enable-metrics"]
        services: dict[str, Any] = {
            "prefill": {"start": [py, "-m", "sglang.launch_server", "--disaggregation-mode", "prefill",
                                  "--port", str(p["prefill"]), *common],
                        "cwd": "python", "health": self.url("prefill", "/health"), "health_timeout_s": 30,
                        "stop_grace_s": 5},
            "decode": {"start": [py, "-m", "sglang.launch_server", "--disaggregation-mode", "decode",
                                 "--port", str(p["decode"]), "--base-gpu-id", "1", *common],
                       "cwd": "python", "health": self.url("decode", "/health"), "health_timeout_s": 30,
                       "stop_grace_s": 5},
            "router": {"start": [py, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                                 "--prefill", self.url("prefill", ""), str(p["bootstrap"]),
                                 "--decode", self.url("decode", ""), "--port", str(p["router"])],
                       "cwd": "python", "health": self.url("router", "/health"), "health_timeout_s": 30,
                       "stop_grace_s": 5},
        }
        return Host.model_validate({
            "transport": "local", "repo": str(self.repo), "python": py, "env": {"PYTHONDONTWRITEBYTECODE": "1"},
            "metrics": self.url("prefill", "/metrics"), "endpoint": self.url("router", ""),
            "services": services, "lock_ttl_s": 60})

    def create(self) -> None:
        shutil.copytree(STACK, self.repo, ignore=shutil.ignore_patterns("__pycache__", ".mypy_cache", "*.pyc"))
        (self.repo / ".gitignore").write_text("__pycache__/\n")
        for args in (("init", "-q", "-b", "main"), ("add", "-A"),
                     ("-c", "user.name=demo", "-c", "user.email=demo@localhost", "commit", "-q", "-m",
                      "sglang demo stack (buggy: KVPoll terminal states are not sticky)")):
            subprocess.run(["git", *args], cwd=self.repo, check=True, capture_output=True)
        self.ports = {name: free_port() for name in ("prefill", "decode", "router", "bootstrap")}
        inventory = Inventory(hosts={HOST: self.host()})
        (self.workdir / "hosts.yaml").write_text(
            yaml.safe_dump(inventory.model_dump(exclude_defaults=True), sort_keys=False))

    def start(self, cancel: CancelToken) -> None:
        """Bring the 'production' stack up, as an operator would have before the hotfix."""
        self.state.mkdir(parents=True, exist_ok=True)
        host = self.host()
        for name, service in host.services.items():
            assert service.start is not None
            with open(self.state / f"{name}.log", "ab") as log:
                proc = subprocess.Popen(service.start, cwd=self.repo / "python", stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        env={**os.environ, **resolve_env(host.env)})
            (self.state / f"{name}.pid").write_text(f"{proc.pid}\n")
            assert service.health is not None
            wait_healthy(service.health, 30, cancel, self.state / f"{name}.log")

    def pids(self) -> dict[str, int]:
        return {p.stem: int(p.read_text()) for p in self.state.glob("*.pid")} if self.state.exists() else {}

    def live_pids(self) -> dict[str, int]:
        """The stack's processes still running. A pid file can outlive its process and the number be
        reused, so a pid counts only while its process runs in this stack's repo."""
        live = {}
        for name, pid in self.pids().items():
            try:
                cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                continue
            if process_alive(pid) and cwd.is_relative_to(self.repo.resolve()):
                live[name] = pid
        return live

    def stop(self) -> None:
        live = self.live_pids()
        for pid in live.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for pid in live.values():
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def process_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan can linger unreaped for a while)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] != "Z"


def kept_workdirs() -> list[Path]:
    """Demos left running with --keep in the default place (a temp dir named deployer-demo-*)."""
    return [d for d in sorted(Path(tempfile.gettempdir()).glob("deployer-demo-*")) if DemoStack(d).live_pids()]


def stop_kept_stacks(workdir: Path | None) -> dict[Path, dict[str, int]]:
    """Stop what `deployer demo --keep` left running: in workdir, or in the one kept demo in the temp dir."""
    if workdir is not None:
        if not (workdir / "repo" / ".git").is_dir():
            raise ConfigError(f"{workdir} holds no demo (no repo/.git there)")
        chosen = [workdir]
    else:
        chosen = kept_workdirs()
        if len(chosen) > 1:
            raise ConfigError("several kept demos are running; pick one with --workdir: "
                              + ", ".join(map(str, chosen)))
    stopped = {}
    for directory in chosen:
        stack = DemoStack(directory)
        stopped[directory] = stack.live_pids()
        stack.stop()
        still = stack.live_pids()
        if still:
            raise DeployerError(f"{directory}: still running after SIGKILL: {still}")
    return stopped


def wait_healthy(url: str, seconds: float, cancel: CancelToken, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while http_status(url) != 200:
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise DeployerError(f"demo stack: {url} did not become healthy in {seconds:g}s\n{tail}")
        cancel.wait(0.1)


@dataclass
class DemoOutcome:
    stack: DemoStack
    result: RunResult
    kept: bool


def run_demo(workdir: Path | None, *, keep: bool, listeners: list[Listener], cancel: CancelToken) -> DemoOutcome:
    stack = DemoStack(Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="deployer-demo-")))
    stack.workdir.mkdir(parents=True, exist_ok=True)
    if stack.repo.exists():
        raise DeployerError(f"{stack.repo} exists already; give an empty --workdir")
    keep_running = False
    try:
        stack.create()
        stack.start(cancel)
        playbook, steps = load_playbook(PLAYBOOK)
        host = stack.host()
        engine = Engine(host_name=HOST, host=host, playbook=playbook, steps=steps,
                        runs_dir=stack.workdir / "runs", listeners=listeners, cancel=cancel,
                        connect=lambda bus: LocalTransport(HOST))
        result = engine.apply()
        keep_running = keep
        return DemoOutcome(stack, result, keep_running)
    finally:
        if not keep_running:
            stack.stop()
