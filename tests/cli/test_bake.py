"""`deployer bake RUN_ID`: a successful run's fix written out to make it permanent, read from the real target (the
real sshd, and a real podman container made from an image): the patch `git am` applies onto the commit the run
started from, giving the run's very tree; a Dockerfile FROM the image the target runs, each shipped file COPYed to
its absolute path with the commit's bytes and mode (built with podman where it can, and the file read back from
the image); and the runs that must not be baked refused, with exit 2 or 5 and why."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_containers import CONTAINER_REPO, Box, fill_repo
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git

# The base image of the container tests: the host's /usr and /etc mounted read-only into an image of a few
# directories and the merged-/usr symlinks, so the agent's python and git run in a container that names an image.
MOUNTS = ("-v", "/usr:/usr:ro", "-v", "/etc:/etc:ro")
TOOL = "#!/bin/sh\necho tool\n"
FIXED_TOOL = "#!/bin/sh\necho fixed tool\n"


def baked(project: Project, run_id: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return project.deployer("bake", run_id, "--out", str(out), *extra)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_the_baked_patch_applies_onto_the_commit_the_run_started_from_and_gives_the_runs_tree(target: Project,
                                                                                          tmp_path: Path) -> None:
    before = target.head()
    run_id = target.applied()
    after = target.head()
    out = tmp_path / "baked"
    done = baked(target, run_id, out)
    assert done.returncode == 0, done.stdout + done.stderr
    patch = out / "0001-pkg-answer-is-42.patch"
    assert patch.is_file(), sorted(p.name for p in out.iterdir())
    assert patch.read_text().startswith(f"From {after} ")

    source = tmp_path / "image-source"
    subprocess.run(["git", "clone", "-q", str(target.repo), str(source)], check=True)
    git(source, "checkout", "-q", before)
    git(source, "-c", "user.name=builder", "-c", "user.email=builder@example.invalid", "am", "-q", str(patch))
    assert (source / "pkg/a.py").read_text() == FIXED_A
    # The whole tree as the run committed it: nothing else changed, nothing left out.
    assert git(source, "rev-parse", "HEAD^{tree}") == git(target.repo, "rev-parse", f"{after}^{{tree}}")
    assert git(source, "log", "-1", "--format=%s").strip() == "pkg: answer is 42"


def test_a_plain_hosts_dockerfile_takes_its_image_as_an_argument_and_copies_each_file_to_its_path(
        target: Project, tmp_path: Path) -> None:
    (target.repo / "tool.sh").write_text(TOOL)
    (target.repo / "tool.sh").chmod(0o755)
    git(target.repo, "add", "tool.sh")
    git(target.repo, "commit", "-qm", "a tool")
    target.write("fix/tool.sh", FIXED_TOOL)
    run_id = target.applied(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/tool.sh", "dest": "tool.sh"}],
                            steps=["upload", {"commit": {"message": "pkg: answer is 42, and a fixed tool"}}])
    out = tmp_path / "baked"
    done = baked(target, run_id, out, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["image"] is None
    assert {f["dest"]: f["mode"] for f in document["files"]} == {"pkg/a.py": "0644", "tool.sh": "0755"}

    lines = (out / "Dockerfile").read_text().splitlines()
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions == ["ARG BASE_IMAGE", "FROM ${BASE_IMAGE}",
                            f"COPY files/pkg/a.py {target.repo}/pkg/a.py", f"COPY files/tool.sh {target.repo}/tool.sh"]
    assert (out / "files/pkg/a.py").read_text() == FIXED_A
    assert (out / "files/tool.sh").read_text() == FIXED_TOOL
    # COPY keeps the context file's mode: the commit's, whatever the umask here.
    assert (out / "files/pkg/a.py").stat().st_mode & 0o777 == 0o644
    assert (out / "files/tool.sh").stat().st_mode & 0o777 == 0o755
    readme = (out / "README.txt").read_text()
    assert "--build-arg BASE_IMAGE=" in readme and "git am 0001-pkg-answer-is-42-and-a-fixed-tool.patch" in readme


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_run_that_never_committed_is_refused_with_exit_2(target: Project, tmp_path: Path) -> None:
    target.playbook(steps=["upload", {"diff_bounds": {"files": 1, "insertions": [0, 1], "deletions": [0, 0]}},
                           {"commit": {"message": "never"}}])
    failed = target.deployer("apply", "fix.yaml", "--host", "box")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    out = tmp_path / "baked"
    done = baked(target, target.newest_run(), out)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "made no commit" in done.stderr and "no fix to bake" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_rolled_back_run_is_refused_with_exit_2(target: Project, tmp_path: Path) -> None:
    run_id = target.applied()
    rolled = target.deployer("rollback", run_id)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    done = baked(target, run_id, tmp_path / "baked")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "rolled back since" in done.stderr


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_log_that_does_not_verify_is_refused_with_exit_5(target: Project, tmp_path: Path) -> None:
    run_id = target.applied()
    log = target.runs / run_id / "events.jsonl"
    log.write_text(log.read_text().replace("pkg/a.py", "pkg/b.py"))
    done = baked(target, run_id, tmp_path / "baked", "--json")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "does not verify" in json.loads(done.stdout)["error"]
    assert not (tmp_path / "baked").exists()


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_commit_the_targets_history_no_longer_holds_is_refused_with_exit_5(target: Project,
                                                                              tmp_path: Path) -> None:
    run_id = target.applied()
    # History rewritten on the target: the run's commit is no longer in HEAD's history.
    git(target.repo, "reset", "-q", "--hard", "HEAD~1")
    done = baked(target, run_id, tmp_path / "baked")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "does not vouch for run" in done.stderr and "not a commit of run" in done.stderr


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_an_out_dir_in_use_is_refused_before_anything_is_read(target: Project, tmp_path: Path) -> None:
    run_id = target.applied()
    out = tmp_path / "baked"
    out.mkdir()
    (out / "mine.txt").write_text("keep\n")
    done = baked(target, run_id, out)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not an empty directory" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


@pytest.fixture
def image_container(podman_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[Box, str]]:
    """A running container made from an image (podman import of a few directories; the host's /usr and /etc mounted
    read-only), holding a git repo at CONTAINER_REPO; the container and the images removed after."""
    root = tmp_path / "rootfs"
    for name in ("etc", "tmp", "srv", "usr", "proc", "sys", "dev", "root"):
        (root / name).mkdir(parents=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            (root / name).symlink_to(os.readlink(f"/{name}"))
    subprocess.run(["tar", "-C", str(root), "-cf", str(tmp_path / "rootfs.tar"), "."], check=True)
    tag = uuid.uuid4().hex[:12]
    image = f"localhost/deployer-test-bake:{tag}"
    box = Box(f"deployer-test-{tag}", podman_env)
    try:
        box.podman("import", str(tmp_path / "rootfs.tar"), image)
        box.podman("run", "-d", "--name", box.name, *MOUNTS, image, "sleep", "infinity")
        fill_repo(box, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
        yield box, image
    finally:
        box.remove()
        box.podman("rmi", "-f", image, f"{image}-fixed", check=False)


def test_a_container_targets_dockerfile_is_from_its_image_and_builds_with_the_fix_inside(
        target: Project, image_container: tuple[Box, str], tmp_path: Path) -> None:
    box, image = image_container
    host = {**target.host, "repo": CONTAINER_REPO, "python": "python3",
            "container": {"engine": "podman", "name": box.name}}
    project = Project(root=target.root, repo=Path(CONTAINER_REPO), host=host)
    project.write_inventory()
    run_id = project.applied(steps=["upload", {"commit": {"message": "pkg: answer is 42"}}])
    out = tmp_path / "baked"
    done = baked(project, run_id, out)
    assert done.returncode == 0, done.stdout + done.stderr
    image_id = box.podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    dockerfile = (out / "Dockerfile").read_text()
    instructions = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    assert instructions == [f"FROM {image}", f"COPY files/pkg/a.py {CONTAINER_REPO}/pkg/a.py"]
    assert f"podman inspect of container {box.name}, image id {image_id}" in dockerfile

    # podman builds it with no registry (the base is local) and no RUN (nothing runs in the build).
    built = box.podman("build", "-q", "-t", f"{image}-fixed", str(out), check=False)
    if built.returncode != 0:
        pytest.fail(f"podman build failed: {built.stderr[-500:]}")
    inside = box.podman("run", "--rm", *MOUNTS, f"{image}-fixed", "stat", "-c", "%a", f"{CONTAINER_REPO}/pkg/a.py")
    assert inside.stdout.strip() == "644"
    shown = box.podman("run", "--rm", *MOUNTS, f"{image}-fixed", "cat", f"{CONTAINER_REPO}/pkg/a.py")
    assert shown.stdout == FIXED_A




@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_path_a_dockerfile_cannot_name_literally_is_refused_with_exit_2_and_nothing_written(
        target: Project, tmp_path: Path) -> None:
    target.write("fix/odd.py", "ODD = '${HOME}'\n")
    run_id = target.applied(files=[{"src": "fix/odd.py", "dest": "pkg/odd $HOME.py", "create": True}],
                            steps=["upload", {"commit": {"message": "an odd name"}}])
    out = tmp_path / "baked"
    done = baked(target, run_id, out)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pkg/odd $HOME.py cannot be named literally in a Dockerfile" in done.stderr
    assert f"apply the patch to the image's source instead (git format-patch -1 {target.head()[:12]} in " \
           f"{target.repo} on the target)" in done.stderr
    assert not out.exists()
