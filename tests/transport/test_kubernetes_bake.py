"""`deployer bake` of a run into a pod: the Dockerfile is FROM the image the pod's container runs, as kubectl says
(its imageID, pinned by digest, where that is a pullable reference), with the files the run shipped at their paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_kube import Container, Kube
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project, init_repo
from kube.objects import IMAGE, IMAGE_ID

from deployer.app.bakes import pod_base
from deployer.errors import StepFailed

POD_REPO = "/sgl-workspace"


def test_a_pods_dockerfile_is_from_the_image_its_container_runs_pinned_by_digest(kube: Kube, tmp_path: Path) -> None:
    repo = tmp_path / "image-checkout"
    init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B})
    kube.pod("sglang-0", Container("server", image_files={POD_REPO: repo}))
    pod = {"name": "sglang-0", "container": "server", "namespace": kube.namespace, "context": kube.context,
           "kubeconfig": str(kube.kubeconfig)}
    (tmp_path / "project").mkdir()
    project = Project(root=tmp_path / "project", repo=Path(POD_REPO),
                      host={"transport": "kubernetes", "repo": POD_REPO, "python": "python3", "pod": pod},
                      extra_env={"PATH": kube.env["PATH"], "KUBECACHEDIR": kube.env["KUBECACHEDIR"]})
    project.write_inventory()
    project.write("fix/a.py", FIXED_A)
    run_id = project.applied(steps=["upload", {"commit": {"message": "pkg: answer is 42"}}])

    out = tmp_path / "baked"
    done = project.deployer("bake", run_id, "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    dockerfile = (out / "Dockerfile").read_text()
    instructions = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    assert instructions == [f"FROM {IMAGE_ID}", f"COPY files/pkg/a.py {POD_REPO}/pkg/a.py"]
    assert IMAGE_ID.startswith("standin.local/host-rootfs@sha256:")  # a pullable reference pinned by digest
    assert f"kubectl get pod sglang-0: container server's image {IMAGE}, pinned by the digest it runs" in dockerfile
    assert (out / "files" / "pkg" / "a.py").read_text() == FIXED_A
    assert f"FROM {IMAGE_ID}" in (out / "README.txt").read_text()


HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"


@pytest.mark.parametrize(("image_id", "base", "digest"), [
    (f"docker.io/lmsysorg/sglang@{DIGEST}", f"docker.io/lmsysorg/sglang@{DIGEST}", DIGEST),  # containerd, CRI-O
    (f"docker-pullable://lmsysorg/sglang@{DIGEST}", f"lmsysorg/sglang@{DIGEST}", DIGEST),  # docker
    (f"docker://{DIGEST}", "lmsysorg/sglang:v0.4", DIGEST),  # an image id alone: not pullable
    ("", "lmsysorg/sglang:v0.4", ""),
    (f"evil\nRUN curl x | sh@{DIGEST}", "lmsysorg/sglang:v0.4", ""),  # input, not truth
])
def test_the_base_is_the_digest_the_container_runs_when_pullable_else_the_specs_image(
        image_id: str, base: str, digest: str) -> None:
    found = pod_base("lmsysorg/sglang:v0.4", image_id, "pod p: container c")
    assert (found.name, found.id) == (base, digest)


def test_an_image_that_is_not_a_reference_is_refused_not_written() -> None:
    with pytest.raises(StepFailed, match="not an image reference"):
        pod_base("sglang:v1\nRUN rm -rf /", "", "pod p: container c")
