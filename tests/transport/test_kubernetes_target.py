"""A `transport: kubernetes` host: the agent runs in a pod's container through the real kubectl's `exec -i`
(against the stand-in cluster, tests/fixtures_kube.py), kubectl on this machine or on a bastion over the real
sshd; check and apply work unchanged, and kubectl's own failures are exit 4 naming the pod and where it is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_kube import Container, Kube, Volume
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project, init_repo
from fixtures_ssh import SSHD

from deployer.transport.kubernetes import placements

POD_REPO = "/sgl-workspace"
FILES = {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B}


def checkout(tmp_path: Path) -> Path:
    """The repo the pod's image holds at POD_REPO (its writes go to the container's layer, never to this dir)."""
    repo = tmp_path / "image-checkout"
    init_repo(repo, FILES)
    return repo


def pod_project(kube: Kube, tmp_path: Path, *, pod: dict[str, Any] | None = None, **host: Any) -> Project:
    """A project whose host `box` is the container `server` of pod sglang-0, kubectl on this machine."""
    spec = {"name": "sglang-0", "container": "server", "namespace": kube.namespace, "context": kube.context,
            "kubeconfig": str(kube.kubeconfig), **(pod or {})}
    project = Project(root=tmp_path, repo=Path(POD_REPO),
                      host={"transport": "kubernetes", "repo": POD_REPO, "python": "python3", "pod": spec, **host},
                      extra_env={"PATH": kube.env["PATH"], "KUBECACHEDIR": kube.env["KUBECACHEDIR"]})
    project.write_inventory()
    project.write("fix/a.py", FIXED_A)
    return project


def in_pod(kube: Kube, command: str, pod: str = "sglang-0") -> str:
    done = kube.kubectl("exec", pod, "-c", "server", "--", "sh", "-c", command)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


@pytest.fixture
def sglang(kube: Kube, tmp_path: Path) -> Kube:
    kube.pod("sglang-0", Container("server", image_files={POD_REPO: checkout(tmp_path)}))
    return kube


def test_check_and_apply_ship_into_the_pods_repo_and_rollback_undoes_it(sglang: Kube, tmp_path: Path) -> None:
    project = pod_project(sglang, tmp_path)
    project.playbook()
    checked = project.deployer("check", "fix.yaml", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "kubectl" in checked.stdout and "the agent runs in it" in checked.stdout
    assert f"{POD_REPO}/pkg/a.py: the container's own filesystem: gone when the container restarts" in \
        checked.stdout.replace("\n", " ")

    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert in_pod(sglang, f"cat {POD_REPO}/pkg/a.py") == FIXED_A
    assert in_pod(sglang, f"git -C {POD_REPO} log -1 --format=%s").strip() == "pkg: answer is 42"
    assert not Path(POD_REPO).exists(), "this machine is untouched"
    run_id = project.newest_run()
    connected = next(e for e in project.events(run_id) if e["type"] == "connected")["transport"]
    assert connected["kind"] == "kubernetes"
    assert {k: connected["extra"][k] for k in ("pod", "container", "namespace", "context", "via")} == \
        {"pod": "sglang-0", "container": "server", "namespace": "serving", "context": "standin", "via": "local"}

    rolled = project.deployer("rollback", run_id)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert in_pod(sglang, f"cat {POD_REPO}/pkg/a.py") == ORIGINAL_A


@pytest.mark.parametrize("failure", ["no context", "forbidden", "no pod", "not running"])
def test_kubectls_own_failures_are_exit_4_naming_the_pod_its_container_namespace_and_context(
        failure: str, kube: Kube, tmp_path: Path) -> None:
    pod: dict[str, Any] = {}
    said = {"no context": "has no context 'elsewhere'", "forbidden": "RBAC forbids it",
            "no pod": "no such pod", "not running": "the container is not running"}[failure]
    if failure == "no context":
        pod["context"] = "elsewhere"
    elif failure == "forbidden":
        kube.pod("sglang-0", Container("server"))
        kube.forbid("create", "pods/exec")
    elif failure == "not running":
        # Never started (its program is missing): a crash loop's container runs again between its back-offs, and an
        # exec that came then was answered as a running container's (a flake in CI).
        kube.pod("sglang-0", Container("server", ("/no/such/server",)), running=False)
        kube.wait_pod(lambda p: p.containers["server"].waiting.startswith("CreateContainerError"), "a failed create")
    project = pod_project(kube, tmp_path, pod=pod)
    project.playbook()
    context = pod.get("context", "standin")
    for args in (("check", "fix.yaml", "--host", "box"), ("apply", "fix.yaml", "--host", "box")):
        done = project.deployer(*args)
        output = done.stdout + done.stderr
        assert done.returncode == 4, output
        assert said in output, output
        assert f"pod 'sglang-0' (container 'server', namespace 'serving', context '{context}')" in output, output


def test_kubectl_runs_on_a_bastion_over_ssh(sglang: Kube, sshd: SSHD, tmp_path: Path) -> None:
    """The host's via: an ssh host of the inventory; kubectl runs there (this machine, reached over sshd), with
    the kubeconfig path it has."""
    project = pod_project(sglang, tmp_path, pod={"kubectl": str(sglang.kubectl_path)}, via="bastion")
    bastion = {"transport": "ssh", "address": sshd.host, "port": sshd.port, "user": sshd.user,
               "identity_file": str(sshd.client_key), "known_hosts": str(sshd.known_hosts), "repo": "/unused",
               "python": sys.executable}
    project.inventory.write_text(yaml.safe_dump({"hosts": {"box": project.host, "bastion": bastion}},
                                                sort_keys=False))
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert in_pod(sglang, f"cat {POD_REPO}/pkg/a.py") == FIXED_A
    connected = next(e for e in project.events() if e["type"] == "connected")["transport"]
    assert (connected["kind"], connected["extra"]["via"]) == ("kubernetes", "ssh")


def test_a_label_selector_is_one_host_per_pod_it_selects_named_like_a_group(kube: Kube, tmp_path: Path) -> None:
    image = checkout(tmp_path)
    for name, role in (("decode-0", "decode"), ("decode-1", "decode"), ("prefill-0", "prefill")):
        kube.pod(name, Container("server", image_files={POD_REPO: image}), labels={"role": role})
    project = pod_project(kube, tmp_path, pod={"name": None, "selector": "role=decode"})
    project.host["pod"] = {k: v for k, v in project.host["pod"].items() if v is not None}
    project.write_inventory()
    project.playbook()
    checked = project.deployer("check", "fix.yaml", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "box.decode-0" in checked.stdout and "box.decode-1" in checked.stdout
    assert "prefill-0" not in checked.stdout

    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for pod, shipped in (("decode-0", FIXED_A), ("decode-1", FIXED_A), ("prefill-0", ORIGINAL_A)):
        assert in_pod(kube, f"cat {POD_REPO}/pkg/a.py", pod) == shipped, pod


def test_each_path_is_placed_on_the_volume_it_is_under_in_the_pods_spec_or_on_the_layer(
        kube: Kube, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    volumes = (Volume("cache"), Volume("models", "hostPath", str(tmp_path / "models")),
               Volume("data", "persistentVolumeClaim", "claim-0"))
    mounts = {"cache": "/srv/cache", "models": "/srv/models", "data": "/srv/models/data"}
    kube.pod("sglang-0", Container("server", mounts=mounts), volumes=volumes)
    spec = kube.kubectl_json("get", "pod", "sglang-0")["spec"]
    paths = ["/srv/cache/a.py", "/srv/models/b.py", "/srv/models/data/c.py", "/srv/cached.py", "/srv/models"]
    assert placements(spec, "server", paths) == [
        ("cache", "emptyDir"), ("models", "hostPath"), ("data", "persistentVolumeClaim"), (None, "layer"),
        ("models", "hostPath")]
    assert placements(spec, "sidecar", paths[:1]) == [(None, "layer")]  # another container's mounts are not its
