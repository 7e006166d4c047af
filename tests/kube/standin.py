"""The stand-in cluster running, outside pytest too: its API server on 127.0.0.1 in a thread, a kubeconfig of one
context naming it, and the environment to run the real kubectl (or deployer) in. tests/fixtures_kube.py's `kube`
fixture and the benchmarks (bench/bench_rtt.py, bench/bench_fleet.py) start it the same way."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .apiserver import Server
from .cluster import Cluster

NAMESPACE = "serving"
USER = "deployer-test"
CONTEXT = "standin"


@dataclass
class StandIn:
    """A running stand-in: its live state, its URL, a kubeconfig naming it, and kubectl's environment."""

    cluster: Cluster
    url: str
    kubeconfig: Path
    env: dict[str, str]  # KUBECONFIG, a private discovery cache, PATH with this kubectl first


def kubeconfig_text(url: str, namespace: str) -> str:
    """A kubeconfig of one context, `standin`: the server, its namespace, and its user (no credentials: the
    stand-in takes every request as this user's)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": CONTEXT,
        "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
        "users": [{"name": USER, "user": {}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": USER, "namespace": namespace}}],
    }, indent=1)


@contextlib.contextmanager
def running_standin(root: Path, podman_env: dict[str, str], kubectl: Path) -> Iterator[StandIn]:
    """The stand-in under root (its pods' files, the kubeconfig, `kubectl` on PATH as the given binary); every
    container it ran is removed and the server stopped on exit, however it ends."""
    cluster = Cluster(root / "cluster", podman_env)
    cluster.user = USER
    cluster.namespaces.add(NAMESPACE)
    server = Server(cluster)
    serving = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name="kube stand-in")
    serving.start()
    config = root / "kubeconfig"
    config.write_text(kubeconfig_text(server.url, NAMESPACE))
    # `kubectl` on PATH is this one (on these machines /usr/bin/kubectl is google-cloud-sdk's v1.32 dispatcher).
    bin_dir = root / "kube-bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(kubectl)
    env = {**os.environ, "KUBECONFIG": str(config), "KUBECACHEDIR": str(root / "kube-cache"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        yield StandIn(cluster, server.url, config, env)
    finally:
        cluster.shutdown()
        server.shutdown()
        server.server_close()
