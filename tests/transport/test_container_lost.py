"""What a run says when the container its agent would run in is not there to run it: the container and the
engine first, then what the engine said (over the host's own transport: local and the real sshd)."""

from __future__ import annotations

from fixtures_containers import Box
from fixtures_repo import Project
from test_container_target import in_container


def test_a_stopped_containers_error_begins_with_the_container_and_its_engine(target: Project,
                                                                           container: Box) -> None:
    project = in_container(target, container)
    container.stop()
    said = f"box: the podman container {container.name!r} is not running (start it: podman start {container.name})"
    checked = project.deployer("check", "--host", "box")
    assert checked.returncode == 4, checked.stdout + checked.stderr
    row = next(line for line in checked.stdout.splitlines() if " container " in line)
    assert row.split("FAIL", 1)[1].strip().startswith(said), row
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 4, applied.stdout + applied.stderr
    assert applied.stderr.startswith(f"error: {said}: "), applied.stderr
    assert "agent lost" not in checked.stdout + applied.stderr
