"""A service that is its pod's container (`kubernetes: container`): the restart ends the main process and the
kubelet starts a new container from the image (the stand-in's semantics: layer files gone, volumes kept), proven by
restartCount +1 and a new containerID, then health through a new agent. A dest the new container would not have
is refused before anything changes; so is a restart under the owner's rollout."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fixtures_kube import Container, Kube, Volume
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project, init_repo
from polling import wait_for
from ports import free_port

POD_REPO = "/sgl-workspace"
FILES = {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B}
# The server is the container's main process: it reads pkg/a.py once, at its start, and serves it; TERM ends it.
SERVER = ("import http.server, signal, sys\n"
          "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
          "body = open('{repo}/pkg/a.py', 'rb').read()\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
          "    def log_message(self, *a): pass\n"
          "http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")


def serving(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
        return str(answer.read().decode())


def pod_with_server(kube: Kube, tmp_path: Path, *, on_volume: bool, owner: str | None = None,
                    extra: tuple[Volume, ...] = (), mounts: dict[str, str] | None = None) -> int:
    """Pod sglang-0 whose container `server` is the server; its repo on a hostPath volume, or the image's."""
    repo = tmp_path / "checkout"
    init_repo(repo, FILES)
    port = free_port()
    command = ("python3", "-c", SERVER.format(repo=POD_REPO, port=port))
    if on_volume:
        container = Container("server", command, mounts={"repo": POD_REPO, **(mounts or {})})
        kube.pod("sglang-0", container, volumes=(Volume("repo", "hostPath", str(repo)), *extra), owner=owner)
    else:
        kube.pod("sglang-0", Container("server", command, image_files={POD_REPO: repo}), owner=owner)
    wait_for(lambda: answers(port), f"the pod's server on port {port}", 30)
    return port


def answers(port: int) -> bool:
    try:
        serving(port)
    except OSError:
        return False
    return True


def project(kube: Kube, tmp_path: Path, port: int, way: str = "container") -> Project:
    pod = {"name": "sglang-0", "container": "server", "namespace": kube.namespace, "context": kube.context,
           "kubeconfig": str(kube.kubeconfig)}
    services: dict[str, Any] = {"server": {"kubernetes": way, "health": f"http://127.0.0.1:{port}/",
                                           "health_timeout_s": 60}}
    (tmp_path / "project").mkdir(exist_ok=True)
    made = Project(root=tmp_path / "project", repo=Path(POD_REPO),
                   host={"transport": "kubernetes", "repo": POD_REPO, "python": "python3", "pod": pod,
                         "services": services},
                   extra_env={"PATH": kube.env["PATH"], "KUBECACHEDIR": kube.env["KUBECACHEDIR"]})
    made.write_inventory()
    made.write("fix/a.py", FIXED_A)
    made.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42"}}, "co_restart"])
    return made


def uid(kube: Kube) -> str:
    return str(kube.kubectl_json("get", "pod", "sglang-0")["metadata"]["uid"])


def container(kube: Kube) -> tuple[int, str]:
    with kube.cluster.lock:
        state = kube.cluster.pod("sglang-0", kube.namespace).containers["server"]
        return state.restart_count, state.container_id


def test_a_fix_on_a_volume_survives_the_container_restart_is_served_by_the_new_container_and_rolls_back(
        kube: Kube, tmp_path: Path) -> None:
    port = pod_with_server(kube, tmp_path, on_volume=True)
    made = project(kube, tmp_path, port)
    assert serving(port) == ORIGINAL_A
    before = container(kube)

    checked = made.deployer("check", "fix.yaml", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    planned = made.deployer("plan", "fix.yaml", "--host", "box", "--verbose")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "pkg/a.py: a hostPath" in planned.stdout and "kept by the restart of server" in planned.stdout

    applied = made.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    after = container(kube)
    assert after[0] == before[0] + 1 and after[1] != before[1], (before, after)
    assert serving(port) == FIXED_A, "the new container's server loaded the fix"
    run_id = made.newest_run()
    annotations = kube.kubectl_json("get", "pod", "sglang-0")["metadata"]["annotations"]
    assert annotations["deployer.dev/run"] == run_id

    rolled = made.deployer("rollback", run_id)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert container(kube)[0] == after[0] + 1, "the rollback restarted the container too"
    assert serving(port) == ORIGINAL_A
    assert (tmp_path / "checkout" / "pkg" / "a.py").read_text() == ORIGINAL_A


def test_a_dest_in_the_containers_layer_is_refused_for_a_container_restart_before_any_change(
        kube: Kube, tmp_path: Path) -> None:
    port = pod_with_server(kube, tmp_path, on_volume=False)
    made = project(kube, tmp_path, port)
    before = container(kube)

    planned = made.deployer("plan", "fix.yaml", "--host", "box", "--verbose")
    assert "pkg/a.py: the container's own filesystem" in planned.stdout.replace("\n", " "), planned.stdout
    assert "LOST by the restart of server" in planned.stdout.replace("\n", " ")

    applied = made.deployer("apply", "fix.yaml", "--host", "box")
    output = applied.stdout + applied.stderr
    assert applied.returncode == 2, output
    assert "throws away pkg/a.py" in output and "deployer bake" in output and "nothing was changed" in output
    done = kube.kubectl("exec", "sglang-0", "-c", "server", "--", "cat", f"{POD_REPO}/pkg/a.py")
    assert done.stdout.decode() == ORIGINAL_A
    assert container(kube) == before, "the container was not restarted"
    annotations = kube.kubectl_json("get", "pod", "sglang-0")["metadata"].get("annotations") or {}
    assert "deployer.dev/run" not in annotations


def test_a_restart_under_the_owners_rollout_is_refused_before_any_change(kube: Kube, tmp_path: Path) -> None:
    owner = kube.owner("StatefulSet", "sglang", replicas=2)
    port = pod_with_server(kube, tmp_path, on_volume=True, owner="StatefulSet/sglang")
    with kube.cluster.lock:
        owner.updated_replicas = 1
    made = project(kube, tmp_path, port)
    before = container(kube)

    applied = made.deployer("apply", "fix.yaml", "--host", "box")
    output = applied.stdout + applied.stderr
    assert applied.returncode == 1, output
    assert "StatefulSet/sglang is mid-rollout (1 updated" in output, output
    assert (tmp_path / "checkout" / "pkg" / "a.py").read_text() == ORIGINAL_A
    assert container(kube) == before


@pytest.mark.parametrize("where", ["ssh host", "second service"])
def test_kubernetes_container_is_refused_at_load_where_it_cannot_work(where: str, kube: Kube, tmp_path: Path) -> None:
    made = project(kube, tmp_path, 1)
    if where == "ssh host":
        made.host = {"transport": "ssh", "address": "127.0.0.1", "repo": "/srv", "services": made.host["services"]}
    else:
        made.host["services"] = {"other": {"start": "sleep 100"}, **made.host["services"]}
    made.write_inventory()
    done = made.deployer("plan", "fix.yaml", "--host", "box")
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "hosts.box.services.server.kubernetes" in output, output
    assert ("needs a host of transport kubernetes" if where == "ssh host" else "must be its first service") in output


def test_a_pod_restart_deletes_the_pod_its_statefulset_brings_a_new_uid_serving_the_fix_and_rolls_back(
        kube: Kube, tmp_path: Path) -> None:
    kube.owner("StatefulSet", "sglang")
    port = pod_with_server(kube, tmp_path, on_volume=True, owner="StatefulSet/sglang")
    made = project(kube, tmp_path, port, way="pod")
    before = uid(kube)

    applied = made.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert uid(kube) != before
    assert serving(port) == FIXED_A, "the new pod's server loaded the fix from the hostPath volume"
    annotations = kube.kubectl_json("get", "pod", "sglang-0")["metadata"]["annotations"]
    assert annotations["deployer.dev/run"] == made.newest_run(), "the new pod carries the run's id"

    restarted = uid(kube)
    rolled = made.deployer("rollback", made.newest_run())
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert uid(kube) != restarted, "the rollback made a new pod too"
    assert serving(port) == ORIGINAL_A


def test_an_emptydir_dest_is_refused_for_a_pod_restart_before_any_change(kube: Kube, tmp_path: Path) -> None:
    kube.owner("StatefulSet", "sglang")
    port = pod_with_server(kube, tmp_path, on_volume=True, owner="StatefulSet/sglang", extra=(Volume("gen"),),
                           mounts={"gen": f"{POD_REPO}/gen"})
    made = project(kube, tmp_path, port, way="pod")
    made.playbook(files=[{"src": "fix/a.py", "dest": "gen/a.py", "create": True}],
                  steps=["upload", {"commit": {"message": "gen"}}, "co_restart"])
    before = uid(kube)

    applied = made.deployer("apply", "fix.yaml", "--host", "box")
    output = applied.stdout + applied.stderr
    assert applied.returncode == 2, output
    assert "as a new pod from its controller, which throws away gen/a.py (an emptyDir" in output, output
    assert uid(kube) == before
    done = kube.kubectl("exec", "sglang-0", "-c", "server", "--", "ls", f"{POD_REPO}/gen")
    assert done.stdout.decode() == "", "nothing was shipped"
