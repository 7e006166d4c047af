"""`deployer demo --container`: the demo's prefill and decode each in a container of their own, the services
being those containers (their engine stops and starts them; inspect's State.Pid proves the restart).

No image and no registry: podman runs this machine's own root as an overlay (`--rootfs /:O`), so the demo's
python is there; the demo's repo is bind-mounted at its own path into both containers, as a bind-mounted
checkout in a real image is, so the fix that lands in it is what the restarted containers run. Both share the
host's network (the router, a process on the host, reaches them on 127.0.0.1), and run under --init: a bare
interpreter as PID 1 ignores the stop's TERM. Docker's own engine cannot run a root directory as a container;
the `docker` command counts when it is podman's (podman-docker).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deployer.config.container import Container
from deployer.config.models import LocalHost
from deployer.demo.run import DemoStack, stacks_in
from deployer.errors import ConfigError, ConnectError
from deployer.text import visible

CONTAINED = ("prefill", "decode")  # the router stays a process on the host
ENGINE_RECORD = "container-engine.json"  # in the workdir: what `demo --stop` removes the containers with
SYSTEM_CONF = Path("/etc/containers/containers.conf")
# What podman needs on these machines when the system has no containers.conf of its own (see the tests'
# fixtures_containers): runc, the cgroupfs manager, no default ulimits.
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
INSTALL = "apt-get install podman runc (and podman-docker for the `docker` command)"
ENGINE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ContainerEngine:
    """The engine the demo runs its containers with: its kind and the absolute path of its command."""

    name: str  # podman or docker (podman-docker)
    command: str

    def run(self, *args: str, workdir: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = None
        if not SYSTEM_CONF.exists():  # only a `run` needs it; the rest work either way
            conf = workdir / "containers.conf"
            conf.write_text(CONTAINERS_CONF)
            env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        done = subprocess.run([self.command, *args], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=ENGINE_TIMEOUT_S)
        if check and done.returncode != 0:  # an engine that cannot run a container here: set-up, as no engine is
            raise ConnectError(f"demo stack: {self.command} {args[0]} failed (exit {done.returncode}): "
                               f"{visible(done.stderr.strip(), multiline=False)[-1000:]} (podman needs runc: "
                               f"{INSTALL})")
        return done


def find_engine() -> ContainerEngine:
    """podman, else a `docker` that is podman's; a ConnectError (exit 4) saying what to install otherwise."""
    seen = []
    for name in ("podman", "docker"):
        command = shutil.which(name)
        if command is None:
            seen.append(f"no {name} on PATH")
            continue
        try:
            version = subprocess.run([command, "--version"], capture_output=True, text=True, timeout=30,
                                     stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            seen.append(f"{command} --version failed: {exc}")
            continue
        said = visible((version.stdout + version.stderr).strip(), multiline=False)[:200]
        if version.returncode == 0 and "podman" in said.lower():
            return ContainerEngine(name, command)
        seen.append(f"{command} is not podman's ({said or f'exit {version.returncode}'}): Docker's own engine "
                    "cannot run this machine's root as a container")
    raise ConnectError(f"deployer demo --container needs podman: {'; '.join(seen)}. Install it: {INSTALL}")


@dataclass
class ContainerStack(DemoStack):
    """The demo's one host with prefill and decode as containers of engine, named after the workdir."""

    engine: ContainerEngine | None = None

    def box(self, service: str) -> Container:
        assert self.engine is not None
        digest = hashlib.sha256(str(self.workdir.resolve()).encode()).hexdigest()[:12]
        return Container(engine="podman" if self.engine.name == "podman" else "docker",
                         name=f"deployer-demo-{digest}-{service}", engine_path=self.engine.command)

    def host(self) -> LocalHost:
        """The plain demo's host, its prefill and decode the containers (their health and grace kept)."""
        host = super().host().model_dump(mode="json", exclude_defaults=True)
        for name in CONTAINED:
            plain = host["services"][name]
            host["services"][name] = {"container": self.box(name).model_dump(exclude_none=True),
                                      "health": plain["health"], "health_timeout_s": plain["health_timeout_s"],
                                      "stop_grace_s": plain["stop_grace_s"]}
        return LocalHost.model_validate(host)

    def create(self) -> None:
        assert self.engine is not None
        super().create()
        (self.workdir / ENGINE_RECORD).write_text(json.dumps({"name": self.engine.name,
                                                              "command": self.engine.command}))

    def launch(self, name: str) -> None:
        if name not in CONTAINED:
            return super().launch(name)
        assert self.engine is not None
        start = super().host().services[name].start  # the plain demo's command, run in the container
        assert start is not None
        repo = str(self.repo.resolve())
        # --rootfs takes the image's place: the command follows it.
        self.engine.run("run", "-d", "--name", self.box(name).name, "--init", "--network", "host",
                        "-v", f"{repo}:{repo}", "-w", f"{repo}/python", "-e", "PYTHONDONTWRITEBYTECODE=1",
                        "--rootfs", "/:O", *start, workdir=self.workdir)

    def container_pids(self) -> dict[str, int]:
        """Each running container's main pid (the host's namespace), as its engine says."""
        if self.engine is None:
            return {}
        pids = {}
        for name in CONTAINED:
            said = self.engine.run("inspect", "--type", "container", "--format", "{{.State.Pid}}",
                                   self.box(name).name, workdir=self.workdir, check=False)
            pid = said.stdout.strip()
            if said.returncode == 0 and pid.isdigit() and int(pid) > 0:
                pids[name] = int(pid)
        return pids

    def live_pids(self) -> dict[str, int]:
        return {**super().live_pids(), **self.container_pids()}

    def stop(self) -> None:
        """Remove the containers (by name: a stopped one too), then stop the router."""
        if self.engine is not None:
            for name in CONTAINED:
                self.engine.run("rm", "-f", "-t", "0", self.box(name).name, workdir=self.workdir, check=False)
        super().stop()


def container_stack(directory: Path) -> DemoStack:
    """The container demo's stack in directory, with the engine its record names (for `demo --stop`)."""
    try:
        record = json.loads((directory / ENGINE_RECORD).read_text())
        name, command = record["name"], record["command"]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{directory / ENGINE_RECORD}: not the record a container demo writes ({exc})") from None
    if name not in ("podman", "docker") or not isinstance(command, str) or not os.path.isabs(command):
        raise ConfigError(f"{directory / ENGINE_RECORD}: names engine {visible(str(name), multiline=False)!r} "
                          f"at {visible(str(command), multiline=False)!r}, not podman or docker at an absolute path")
    return ContainerStack(directory, engine=ContainerEngine(name, command))


def container_stack_of(engine: ContainerEngine) -> Callable[[Path], DemoStack]:
    """What run_demo makes its stack with: the container demo's, its containers run by engine."""
    return lambda directory: ContainerStack(directory, engine=engine)


def demo_stacks_in(directory: Path) -> list[DemoStack]:
    """The demo's stacks in a workdir (run.stacks_in), a container demo's as ContainerStacks (for `demo --stop`)."""
    return [container_stack(stack.workdir) if (stack.workdir / ENGINE_RECORD).is_file() else stack
            for stack in stacks_in(directory)]
