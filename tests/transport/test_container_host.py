"""A container target and the host around it: what a run says when the container is not there to run the agent
(the container and the engine first, then what the engine said), and `become` (sudo on the host, around the
engine's exec). Over the host's own transport: local and the real sshd."""

from __future__ import annotations

import pytest
from fixtures_containers import CONTAINER_REPO, Box
from fixtures_repo import FIXED_A, Project
from fixtures_ssh import SSHD
from test_container_target import in_container


def test_a_stopped_containers_error_begins_with_the_container_and_its_engine(target: Project,
                                                                           container: Box) -> None:
    project = in_container(target, container)
    container.stop()
    said = f"box: the podman container {container.name!r} is not running (start it: podman start {container.name})"
    checked = project.deployer("check", "--host", "box")
    assert checked.returncode == 4, checked.stdout + checked.stderr
    row = next(line for line in checked.stdout.splitlines() if " container " in line)
    # The row points at the error, which is said once, first thing on stderr.
    assert row.split("FAIL", 1)[1].strip() == "see the error below", row
    assert checked.stderr.startswith(f"error: {said}"), checked.stderr
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 4, applied.stdout + applied.stderr
    assert applied.stderr.startswith(f"error: {said}: "), applied.stderr
    assert "agent lost" not in checked.stdout + applied.stderr


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_become_runs_the_engines_exec_under_sudo_on_the_host(target: Project, container: Box, sshd: SSHD) -> None:
    project = in_container(target, container)
    project.write_inventory(become=True)
    before = len(sshd.sudo_calls())
    project.playbook()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert container.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
    # The agent's start `sudo -n -- sh -c ... podman exec ...` and the inspect of the container's mounts (where
    # the shipped files live), both on the host: sudo is the host's, around the engine. The two go at once, so
    # either may reach sudo first (a CI run logged the inspect first).
    assert sorted(sshd.sudo_calls()[before:]) == ["-n -- podman", "-n -- sh"]
    connected = next(e for e in project.events() if e["type"] == "connected")
    assert connected["transport"]["extra"]["become"] == "sudo"
    assert connected["transport"]["extra"]["container"] == container.name


def test_an_exec_that_ended_before_the_first_write_says_the_container_problem_not_a_broken_pipe() -> None:
    """The same stopped container seen from the other side of the race: the exec has exited (EPIPE on the write
    of the agent's source) before the reader saw its end. A real process that says what podman says and exits."""
    from deployer.agent.client import NeverStarted
    from deployer.config.container import Container
    from deployer.transport.container import ContainerExec
    from deployer.transport.pipes import local_pipe

    exec_ = ContainerExec(Container(engine="podman", name="gone"))
    said = "Error: can only create exec sessions on running containers: container state improper"
    pipe = exec_.open(lambda argv: local_pipe(argv, "box"), ["sh", "-c", f"echo '{said}' >&2; exit 125"], "box")
    with pytest.raises(NeverStarted, match="the podman container 'gone' is not running"):
        for _ in range(1000):  # bounded: the exit comes within a few writes
            pipe.write(b"x" * 65536)
    pipe.close()


def test_an_exec_that_refused_the_first_write_is_explained_by_all_its_stderr_not_its_first_line() -> None:
    """kubectl against an API server that is down prints a retry line per discovery attempt, then its reason
    ("The connection to the server ... was refused"), and exits: a reader starved on a loaded machine had read the
    first line only when the failed write was explained (a CI run said only the retry). A real process that closes
    its stdin (the write fails at once), says one line, then after a while its reason, and exits."""
    from deployer.agent.client import NeverStarted
    from deployer.config.container import Container
    from deployer.transport.container import ContainerExec
    from deployer.transport.pipes import local_pipe

    exec_ = ContainerExec(Container(engine="podman", name="gone"))
    script = ("exec 0<&-; echo 'E1203 memcache.go:381] Couldn'\\''t get current server API group list' >&2; "
              "sleep 0.5; echo 'Error: can only create exec sessions on running containers' >&2; exit 125")
    pipe = exec_.open(lambda argv: local_pipe(argv, "box"), ["sh", "-c", script], "box")
    with pytest.raises(NeverStarted) as failed:
        for _ in range(1000):  # bounded: the first write fails (nothing reads the pipe)
            pipe.write(b"x" * 65536)
    pipe.close()
    assert "memcache.go" in str(failed.value)
    assert "the podman container 'gone' is not running" in str(failed.value), str(failed.value)
