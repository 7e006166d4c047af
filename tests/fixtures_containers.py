"""Real containers for the container-target tests: podman running this machine's own root as an overlay.

No image and no registry: `podman run --rootfs /:O` gives a container whose root is the host's, with every
write landing in the container's own upper layer (the host's files are untouched), so the git, python and
shell the tests need are there. On these machines podman needs runc, the cgroupfs manager and no default
ulimits; the fixture writes that containers.conf for its own `podman run` (CONTAINERS_CONF), so the tests do
not depend on /etc/containers (which .ci/run writes anyway). An exec, inspect, stop or start of the container
made here works without it: deployer's own calls (over sshd too) need nothing set.

Locally a machine without podman skips these tests; with CI=true they fail, as the sshd fixture does.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from polling import wait_for

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
# The repo inside the container (in its writable layer): no such path on the host.
CONTAINER_REPO = "/srv/deployer-target-repo"
# podman-docker's `docker` (a shell shim that execs podman). /usr/local/bin/docker on these machines is a
# real Docker CLI without a daemon that shadows it on PATH: an inventory names this one with engine_path.
PODMAN_DOCKER = "/usr/bin/docker"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"podman unavailable on CI (never skipped there): {reason}", pytrace=False)
    pytest.skip(f"podman unavailable: {reason}")


@dataclass
class Box:
    """One running container, by name (every command names it: cleanup needs nothing else)."""

    name: str
    env: dict[str, str]

    def podman(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=120,
                              check=check, input=stdin)

    def sh(self, script: str) -> str:
        """script run by sh inside the container; its stdout."""
        return self.podman("exec", "-i", self.name, "sh", "-euc", script).stdout

    def read(self, path: str) -> str | None:
        found = self.podman("exec", self.name, "cat", path, check=False)
        return found.stdout if found.returncode == 0 else None

    def git(self, *args: str) -> str:
        return self.podman("exec", self.name, "git", "-C", CONTAINER_REPO, *args).stdout

    def stop(self) -> None:
        self.podman("stop", "-t", "0", self.name)

    def remove(self) -> None:
        self.podman("rm", "-f", "-t", "0", self.name, check=False)


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment the fixture runs podman in (its containers.conf)."""
    if shutil.which("podman") is None:
        _unavailable("no podman on PATH (apt-get install podman runc podman-docker)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@pytest.fixture
def container(podman_env: dict[str, str]) -> Iterator[Box]:
    """A running container (PID 1 a `sleep`) holding a git repo at CONTAINER_REPO; removed by name after."""
    box = Box(f"deployer-test-{uuid.uuid4().hex[:12]}", podman_env)
    try:
        started = box.podman("run", "-d", "--name", box.name, "--rootfs", "/:O", "sleep", "infinity", check=False)
        if started.returncode != 0:
            _unavailable(f"podman run failed: {started.stderr.strip()[-500:]}")
        yield box
    finally:
        box.remove()


def fill_repo(box: Box, files: dict[str, str]) -> None:
    """A git repo at CONTAINER_REPO inside the container, with files committed."""
    box.sh(f"mkdir -p {CONTAINER_REPO} && cd {CONTAINER_REPO} && git init -q -b main && "
           "git config user.email target@example.invalid && git config user.name target")
    for rel, text in files.items():
        box.podman("exec", "-i", box.name, "sh", "-euc", 'mkdir -p "$(dirname "$0")" && cat > "$0"',
                   f"{CONTAINER_REPO}/{rel}", stdin=text)
    box.sh(f"cd {CONTAINER_REPO} && git add -A && git commit -qm initial")
    assert not Path(CONTAINER_REPO).exists(), "the container's repo must not be on the host"


@dataclass
class Served:
    """A container whose PID 1 (or its init's child) is an HTTP server on the host's loopback."""

    box: Box
    health: str

    def state(self) -> tuple[int, str]:
        """Its main pid (the host's namespace) and start time, as the engine says."""
        pid, started = self.box.podman("inspect", "--format", "{{.State.Pid}}\t{{.State.StartedAt}}",
                                       self.box.name).stdout.strip().split("\t")
        return int(pid), started


@pytest.fixture
def serving_container(podman_env: dict[str, str]) -> Iterator[Callable[..., Served]]:
    """Makes containers that serve `python3 -m http.server` on a free port of the host's network (with
    podman's --init when asked, else the interpreter is PID 1); each removed by name after the test."""
    made: list[Box] = []

    def serve(*, init: bool) -> Served:
        box = Box(f"deployer-test-{uuid.uuid4().hex[:12]}", podman_env)
        made.append(box)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        started = box.podman("run", "-d", "--name", box.name, "--network", "host", *(["--init"] if init else []),
                             "--rootfs", "/:O", "python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", "/", check=False)
        if started.returncode != 0:
            _unavailable(f"podman run failed: {started.stderr.strip()[-500:]}")
        health = f"http://127.0.0.1:{port}/"
        wait_for(lambda: _answers(health), f"{box.name} serving {health}")
        return Served(box, health)

    try:
        yield serve
    finally:
        for box in made:
            box.remove()


def _answers(url: str) -> bool:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with direct.open(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False
