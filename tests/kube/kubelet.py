"""The stand-in's kubelet: each container of a pod is a podman container, supervised as restartPolicy Always.

A container's "image" is this machine's root as a copy-on-write overlay (`--rootfs /:O`) plus its image_files
(each a host dir mounted copy-on-write, `-v DIR:PATH:O`); its volumes are host dirs bind-mounted. When its main
process exits, for any reason, the old container is removed and a NEW one is run from the same image and
command: what was written into the layer (or over image_files) is gone, the volumes' files stay, restartCount
goes up, and containerID and startedAt are new, as with a real kubelet. Exit is seen at once through a pidfd on
the main process (no polling). Pods use the host's network (as hostNetwork: true), so a server in one answers
on 127.0.0.1.

Not emulated: the kubelet's restart back-off is 0.2 s doubling to 5 s (Kubernetes: 10 s to 5 min), readiness
is probed when the pod is read (not every periodSeconds), no liveness probes, no resource limits, no init or
sidecar containers, no shared PID namespace between a pod's containers.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .objects import ContainerState, Pod, timestamp

FAST_EXIT_S = 10  # a container that ran shorter than this backs off before the next (as CrashLoopBackOff)


class Kubelet:
    """Runs and supervises the containers of pods; every podman name it made is removed by `remove_all`."""

    def __init__(self, env: dict[str, str], prefix: str, root: Path, lock: threading.RLock,
                 changed: Callable[[Pod], None], exited: Callable[[Pod], None]) -> None:
        self.env = env
        self.prefix = prefix
        self.root = root  # the pidfiles podman writes
        self._lock = lock
        self._changed = changed  # called under the lock after a pod's status changed
        self._exited = exited  # called (without the lock) when a container's main process exited
        self._names: list[str] = []
        self._threads: dict[str, list[threading.Thread]] = {}  # pod uid -> its supervisors
        self.stopping = False

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=120,
                              check=check)

    def exec_argv(self, pod: Pod, container: str, command: Sequence[str], stdin: bool) -> list[str]:
        """The podman command that runs `command` in the container running now (kubelet's exec)."""
        return ["podman", "exec", *(["-i"] if stdin else []), pod.containers[container].podman_name, *command]

    def start(self, pod: Pod) -> None:
        """Supervise each container of a new pod in a thread of its own (returns at once)."""
        threads = [threading.Thread(target=self._supervise, args=(pod, state), daemon=True,
                                    name=f"kubelet {pod.name}/{state.spec.name}")
                   for state in pod.containers.values()]
        self._threads[pod.uid] = threads
        for thread in threads:
            thread.start()

    def _supervise(self, pod: Pod, state: ContainerState) -> None:
        failures = 0
        while True:
            began = time.monotonic()
            if not self._run(pod, state):
                return
            self._wait_exit(state.pid)
            if self.stopping:
                return
            # The exited container stays (as a kubelet keeps it for its logs) until remove_all.
            # not inspect: right after the exit podman may not have its code yet (conmon records it): 0 then
            code = self.podman("wait", state.podman_name, check=False)
            with self._lock:
                if pod.deletion is not None or self.stopping:
                    return
                state.last_terminated = {"exitCode": int(code.stdout.strip() or -1), "startedAt": state.started_at,
                                         "finishedAt": timestamp(), "containerID": f"podman://{state.container_id}",
                                         "reason": "Completed" if code.stdout.strip() == "0" else "Error"}
                state.container_id, state.pid = "", 0
                failures = failures + 1 if time.monotonic() - began < FAST_EXIT_S else 0
                state.waiting = "CrashLoopBackOff" if failures > 1 else "ContainerCreating"
                self._changed(pod)
            self._exited(pod)
            with self._lock:
                if pod.deletion is not None or self.stopping:  # the owner recreates the pod instead
                    return
            if failures > 1:
                time.sleep(min(5.0, 0.1 * 2 ** (failures - 1)))
            with self._lock:
                state.restart_count += 1

    def _run(self, pod: Pod, state: ContainerState) -> bool:
        """Run a new container for `state` (False: the pod is going away instead)."""
        spec = state.spec
        name = f"{self.prefix}-{pod.uid[:8]}-{spec.name}-{state.restart_count}"
        with self._lock:
            if pod.deletion is not None or self.stopping:
                return False
            self._names.append(name)
        volumes = [arg for volume, path in spec.mounts.items() for arg in ("-v", f"{pod.volume_dirs[volume]}:{path}")]
        layers = [arg for path, source in spec.image_files.items() for arg in ("-v", f"{source}:{path}:O")]
        env = [arg for key, value in spec.env.items() for arg in ("-e", f"{key}={value}")]
        pidfile = self.root / f"{name}.pid"
        made = self.podman("run", "-d", "--name", name, "--pidfile", str(pidfile), "--network", "host", *volumes,
                           *layers, *env, "--rootfs", "/:O", *spec.command, check=False)
        pid = int(pidfile.read_text().strip() or 0) if made.returncode == 0 else 0
        with self._lock:
            state.podman_name = name
            if made.returncode != 0:  # shown as the waiting reason's message, as kubectl describe would
                state.waiting = f"CreateContainerError: {made.stderr.strip()[-500:]}"
                self._changed(pod)
            else:
                state.container_id, state.pid, state.started_at = made.stdout.strip(), pid, timestamp()
                self._changed(pod)
            going = made.returncode != 0 or pod.deletion is not None or self.stopping
        # A `podman run` that failed may have created the container first (left in state Created, after remove_all
        # when the test ended meanwhile: seen left behind twice); DELETE came while this one was being made: it
        # must not outlive the pod either way.
        if going:
            self.podman("rm", "-f", "--ignore", "-t", "0", name, check=False)
            return False
        return True

    @staticmethod
    def _wait_exit(pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, ValueError, OSError):
            return  # gone already (or it exited before podman reported a pid)
        try:
            select.select([fd], [], [])  # readable when the process has exited
        finally:
            os.close(fd)

    def terminate(self, pod: Pod, grace_s: int) -> None:
        """Stop the pod's containers as a deletion does (SIGTERM, SIGKILL after grace_s) and remove them;
        `pod.deletion` is already set, so no supervisor restarts one."""
        for state in list(pod.containers.values()):
            if state.podman_name:
                self.podman("rm", "-f", "-t", str(grace_s), state.podman_name, check=False)
        for thread in self._threads.pop(pod.uid, []):
            thread.join(timeout=grace_s + 30)

    def kill_main(self, pod: Pod, container: str, sig: int = signal.SIGKILL) -> None:
        """Signal a container's main process from the host (what an OOM kill or a failed liveness probe does)."""
        pid = pod.containers[container].pid
        if pid <= 0:  # os.kill(0, ...) would signal our own process group
            raise ProcessLookupError(f"{pod.name}/{container} runs no main process now")
        os.kill(pid, sig)

    def remove_all(self) -> None:
        """Every container this kubelet ever made (exited ones too), by name."""
        with self._lock:
            self.stopping = True
            names = list(self._names)  # each recorded before its podman run: none can be missed
        if names:  # --ignore: without it podman 4.3 stops at the first name already gone (a deleted pod's)
            self.podman("rm", "-f", "--ignore", "-t", "0", *names, check=False)  # and silently removes none after
        # A supervisor in the middle of its `podman run` makes its container after that rm, then sees `stopping`
        # and removes it itself: wait for each (bounded), or the test process may end first and leave it running.
        deadline = time.monotonic() + 60
        for thread in [t for threads in self._threads.values() for t in threads]:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
