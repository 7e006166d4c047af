"""A run into a pod records which pod and container it left its files in (its `pod` events: the uid, the
containerID, the restartCount, and where each dest lives); `check` and `runs show` read the pod now and say when it
is another pod (the stand-in's StatefulSet makes a new uid under the same name) or a new container from the image
(the layer's files gone), and nothing wrong when it is the one the run left, its own restart included.
`persist: required` refuses, before any change, a dest a new pod would not have."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fixtures_kube import Container, Kube, Volume
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project, init_repo
from polling import wait_for
from ports import free_port

from deployer.run.pods import Left
from deployer.transport.kubernetes import PodSeen

POD_REPO = "/sgl-workspace"
FILES = {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B}
UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
SHIP = ["upload", {"commit": {"message": "pkg: answer is 42"}}]


def layer_pod(kube: Kube, tmp_path: Path, owner: str | None = None) -> None:
    """Pod sglang-0 whose image holds the repo at POD_REPO: what is shipped there lives in the container's layer."""
    repo = tmp_path / "image-checkout"
    init_repo(repo, FILES)
    kube.pod("sglang-0", Container("server", image_files={POD_REPO: repo}), owner=owner)


def project(kube: Kube, tmp_path: Path, services: dict[str, Any] | None = None) -> Project:
    pod = {"name": "sglang-0", "container": "server", "namespace": kube.namespace, "context": kube.context,
           "kubeconfig": str(kube.kubeconfig)}
    (tmp_path / "project").mkdir(exist_ok=True)
    made = Project(root=tmp_path / "project", repo=Path(POD_REPO),
                   host={"transport": "kubernetes", "repo": POD_REPO, "python": "python3", "pod": pod,
                         **({"services": services} if services else {})},
                   extra_env={"PATH": kube.env["PATH"], "KUBECACHEDIR": kube.env["KUBECACHEDIR"]})
    made.write_inventory()
    made.write("fix/a.py", FIXED_A)
    return made


def in_pod(kube: Kube, path: str) -> str:
    return kube.kubectl("exec", "sglang-0", "-c", "server", "--", "cat", path).stdout.decode()


def said(done: Any) -> str:
    """A command's output as one line (rich wraps long rows)."""
    return " ".join((done.stdout + done.stderr).split())


def run_files_row(checked: Any) -> str:
    rows = [line for line in checked.stdout.splitlines() if "run files" in line]
    assert rows, checked.stdout + checked.stderr
    return said(checked)


def test_check_and_runs_show_say_the_pod_is_the_one_the_run_left_then_that_it_was_recreated_and_the_fix_gone(
        kube: Kube, tmp_path: Path) -> None:
    kube.owner("StatefulSet", "sglang")
    layer_pod(kube, tmp_path, owner="StatefulSet/sglang")
    made = project(kube, tmp_path)
    run_id = made.applied(steps=SHIP)
    uid = str(kube.kubectl_json("get", "pod", "sglang-0")["metadata"]["uid"])
    recorded = [e for e in made.events(run_id) if e["type"] == "pod"]
    assert [(e["uid"], e["files"]["pkg/a.py"]["kind"]) for e in recorded] == [(uid, "layer")]

    checked = made.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"the ones run {run_id} left (uid {uid}, restartCount 0): its files are there" in run_files_row(checked)
    shown = made.deployer("runs", "show", run_id)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "pkg/a.py: the container's own filesystem" in said(shown)
    assert "its files are there" in said(shown)

    deleted = kube.kubectl("delete", "pod", "sglang-0", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr.decode()
    new = kube.wait_pod(lambda pod: pod.name == "sglang-0" and pod.uid != uid and pod.deletion is None
                        and all(state.running for state in pod.containers.values()), "the StatefulSet's new pod", 60)
    assert in_pod(kube, f"{POD_REPO}/pkg/a.py") == ORIGINAL_A, "a new pod has the image's files"

    gone = (f"pod sglang-0 was recreated since run {run_id} (uid {uid} then, {new.uid} now): its hot-fix is gone "
            "unless its dests are on a PVC or a hostPath (on the same node); lost: pkg/a.py (the container layer)")
    checked = made.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert gone in run_files_row(checked)
    shown = made.deployer("runs", "show", run_id)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert gone in said(shown)


def test_a_container_restart_after_a_run_with_a_layer_dest_is_said_to_have_lost_the_hot_fix(
        kube: Kube, tmp_path: Path) -> None:
    layer_pod(kube, tmp_path)
    made = project(kube, tmp_path)
    run_id = made.applied(steps=SHIP)
    assert in_pod(kube, f"{POD_REPO}/pkg/a.py") == FIXED_A

    kube.kill_main("sglang-0", "server")  # as an OOM kill: the kubelet runs a new container from the image
    kube.wait_pod(lambda pod: pod.name == "sglang-0" and pod.containers["server"].restart_count == 1
                  and pod.containers["server"].running, "the kubelet's new container", 60)
    assert in_pod(kube, f"{POD_REPO}/pkg/a.py") == ORIGINAL_A

    gone = (f"container server of pod sglang-0 restarted since run {run_id} (restartCount 0 then, 1 now: a new "
            "container from the image): the hot-fix in the layer is gone; lost: pkg/a.py (the container layer)")
    checked = made.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert gone in run_files_row(checked)
    shown = made.deployer("runs", "show", run_id)
    assert gone in said(shown), shown.stdout + shown.stderr


def test_the_runs_own_container_restart_is_what_it_left_so_check_finds_its_files_there(
        kube: Kube, tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    init_repo(repo, FILES)
    port = free_port()
    server = ("import http.server, signal, sys\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self):\n"
              "        self.send_response(200); self.end_headers()\n"
              "    def log_message(self, *a): pass\n"
              f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    kube.pod("sglang-0", Container("server", ("python3", "-c", server), mounts={"repo": POD_REPO}),
             volumes=(Volume("repo", "hostPath", str(repo)),))
    wait_for(lambda: answers(port), f"the pod's server on port {port}", 30)
    made = project(kube, tmp_path, {"server": {"kubernetes": "container", "health": f"http://127.0.0.1:{port}/",
                                               "health_timeout_s": 60}})
    run_id = made.applied(steps=[*SHIP, "co_restart"])
    recorded = [e for e in made.events(run_id) if e["type"] == "pod"]
    assert [e["restart_count"] for e in recorded] == [0, 1], "preflight's container, then the restart's new one"
    assert recorded[0]["container_id"] != recorded[1]["container_id"]
    assert recorded[0]["files"]["pkg/a.py"] == {"volume": "repo", "kind": "hostPath"}

    checked = made.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"the ones run {run_id} left (uid" in run_files_row(checked)
    assert "restartCount 1): its files are there" in said(checked)


def answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).close()
    except OSError:
        return False
    return True


def test_persist_required_refuses_a_dest_in_the_containers_layer_before_any_change_with_exit_2(
        kube: Kube, tmp_path: Path) -> None:
    layer_pod(kube, tmp_path)
    made = project(kube, tmp_path)
    made.playbook(steps=SHIP, persist="required")

    checked = made.deployer("check", "fix.yaml", "--host", "box")
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "persist: required refuses pkg/a.py (the container's own filesystem" in said(checked)

    applied = made.deployer("apply", "fix.yaml", "--host", "box")
    output = said(applied)
    assert applied.returncode == 2, output
    assert "fix.yaml:" in output and "persist: required, but a new pod sglang-0 would not have pkg/a.py" in output
    assert "nothing was changed" in output and "a PVC or a hostPath" in output
    assert in_pod(kube, f"{POD_REPO}/pkg/a.py") == ORIGINAL_A


def pod_json(**status: Any) -> str:
    return json.dumps({"metadata": {"uid": status.pop("uid", UID)}, "spec": {"containers": [
        {"name": "server", "image": "sglang:v1"}]}, "status": {"containerStatuses": [
            {"name": "server", "restartCount": 2, "containerID": "containerd://" + "ab" * 32, **status}]}})


def test_what_kubectl_says_of_the_pod_is_read_as_input_and_refused_when_it_is_not_a_pods() -> None:
    seen = PodSeen.parse(pod_json(), "server")
    assert (seen.uid, seen.container_id, seen.restarts, seen.image) == (UID, "containerd://" + "ab" * 32, 2,
                                                                        "sglang:v1")
    for bad, said in [({"containerID": "containerd://ab\nrestarted"}, "containerID is not one"),
                      ({"restartCount": "3"}, "restartCount is not a count"),
                      ({"restartCount": True}, "restartCount is not a count"),
                      ({"uid": "../../x"}, "uid is not a pod's")]:
        with pytest.raises(ValueError, match=said):
            PodSeen.parse(pod_json(**bad), "server")
    with pytest.raises(ValueError, match="no container 'other'"):
        PodSeen.parse(pod_json(), "other")


def test_a_new_pod_keeps_a_hostpath_dest_only_on_the_node_the_run_shipped_to() -> None:
    left = Left("R", "sglang-0", "server", UID, "containerd://" + "ab" * 32, 0, "node-a",
                {"pkg/a.py": ("repo", "hostPath"), "pkg/b.py": ("claim", "persistentVolumeClaim")})
    other = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    same_node = PodSeen(other, "containerd://" + "cd" * 32, 0, "sglang:v1", "", "node-a", {})
    kept, said = left.judge(same_node)
    assert kept and "kept: pkg/a.py (hostPath 'repo'), pkg/b.py (persistentVolumeClaim 'claim')" in said
    kept, said = left.judge(PodSeen(other, "containerd://" + "cd" * 32, 0, "sglang:v1", "", "node-b", {}))
    assert not kept and "on node node-b, not node-a" in said and "lost: pkg/a.py (hostPath 'repo')" in said
