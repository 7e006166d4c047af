"""A container that is its own service (the stock SGLang image: `docker run ... python3 -m sglang.launch_server`,
the server the container's main process, the code the image's checkout in its writable layer): the patch lands
inside through the agent in the container, the engine restarts the container from the host side, State.Pid and
State.StartedAt prove it, and the steps after it (here a drain of a gauge that follows the code the server loaded)
run through a new agent in the restarted container. Against real podman containers (fixtures_containers),
with the host's transport local and over the real sshd."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_containers import CONTAINER_REPO, Box, Served, _answers, _unavailable, fill_repo
from fixtures_repo import FIXED_A, ORIGINAL_A, ORIGINAL_B, Project
from polling import wait_for

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

# The server the container runs as its main process: it serves the code it loaded (the gauge is answer()), so
# only a restart makes the fix's bytes served.
SERVER = """
import http.server, sys
sys.path.insert(0, sys.argv[2])
from pkg.a import answer

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (b"ok" if self.path == "/health" else
                f"# TYPE deployer_answer gauge\\ndeployer_answer {answer()}\\n".encode())
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
FILES = {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B, "serve.py": SERVER}
RESTART = ["upload", {"commit": {"message": "pkg: answer is 42"}}, "co_restart",
           {"drain": {"metric": "deployer_answer", "op": "==", "to": 42, "within_s": 20, "stable_polls": 2}}]


@pytest.fixture
def own_container(podman_env: dict[str, str]) -> Iterator[Served]:
    """A container whose main process (under podman's --init) is SERVER from the repo in its own writable layer:
    it waits for the repo, which the test fills after the container started, then serves on a free port."""
    box = Box(f"deployer-test-{uuid.uuid4().hex[:12]}", podman_env)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = "/srv/deployer-target-ready"  # made once the repo is committed: the server loads it from then on
    wait = f"until [ -f {ready} ]; do sleep 0.1; done; "
    try:
        started = box.podman("run", "-d", "--name", box.name, "--network", "host", "--init",
                             "-e", "PYTHONDONTWRITEBYTECODE=1", "--rootfs", "/:O", "sh", "-c",
                             f"{wait}exec python3 {CONTAINER_REPO}/serve.py {port} {CONTAINER_REPO}", check=False)
        if started.returncode != 0:
            _unavailable(f"podman run failed: {started.stderr.strip()[-500:]}")
        fill_repo(box, FILES)
        box.sh(f"touch {ready}")
        served = Served(box, f"http://127.0.0.1:{port}/health")
        wait_for(lambda: _answers(served.health), f"{box.name} serving {served.health}")
        yield served
    finally:
        box.remove()


def own_service(target: Project, served: Served, **service: Any) -> Project:
    """target's host (local or over sshd) in served's container, whose one service is that container."""
    box, url = served.box.name, served.health.removesuffix("/health")
    host = {**target.host, "repo": CONTAINER_REPO, "python": "python3", "metrics": f"{url}/metrics",
            "container": {"engine": "podman", "name": box},
            "services": {"server": {"container": {"engine": "podman", "name": box}, "health": served.health,
                                    "stop_grace_s": 5, **service}}}
    project = dataclasses.replace(target, repo=Path(CONTAINER_REPO), host=host)
    project.write_inventory()
    project.playbook(steps=RESTART)
    return project


def events_of(project: Project, kind: str, run_id: str | None = None) -> list[dict[str, Any]]:
    return [e for e in project.events(run_id) if e["type"] == kind]


def value_mark(path: Path, keys: tuple[str, ...]) -> str:
    """`line:col` of the value at keys in the YAML file, as PyYAML's own composer places it."""
    node = yaml.compose(path.read_text())
    for key in keys:
        node = next(value for name, value in node.value if name.value == key)
    return f"{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def metric(served: Served) -> str:
    return served.box.podman("exec", served.box.name, "python3", "-c", (
        "import urllib.request; print(urllib.request.urlopen("
        f"{served.health.removesuffix('/health') + '/metrics'!r}).read().decode().split()[-1])")).stdout.strip()


def test_the_fix_lands_in_the_container_and_its_engine_restarts_it_from_the_host(
        target: Project, own_container: Served) -> None:
    project = own_service(target, own_container)
    pid, started = own_container.state()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    new_pid, new_started = own_container.state()
    assert new_pid != pid and new_started != started, "the container was not restarted"
    assert own_container.box.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
    assert metric(own_container) == "42", "the restarted server does not serve the fix's code"
    run_id = project.newest_run()
    assert events_of(project, "restart", run_id)[0]["pids"] == {"server": {"old": pid, "new": new_pid}}
    commands = {e.get("action"): e["command"] for e in events_of(project, "command", run_id)}
    box = own_container.box.name
    assert commands["server.stop"] == f"podman stop -t 5 {box}"
    assert commands["server.start"] == f"podman start {box}"
    # The agent the stop ended, and the one started in the restarted container for the health wait and the drain.
    agents = events_of(project, "agent", run_id)
    assert len(agents) == 2 and agents[0]["pid"] != agents[1]["pid"], agents
    assert [e["what"] for e in events_of(project, "local", run_id) if e.get("action") == "server.reopen"]
    drained = next(e for e in project.events(run_id) if e["type"] == "step_end" and e["step"] == "drain")
    assert drained["status"] == "ok", drained
    assert project.deployer("lock", "status", "--host", "box").returncode == 0, "the lock is still held"

    rolled = project.deployer("rollback", run_id)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert own_container.state()[1] != new_started, "the rollback did not restart the container"
    assert own_container.box.read(f"{CONTAINER_REPO}/pkg/a.py") == ORIGINAL_A
    assert metric(own_container) == "41", "the restarted server does not serve the old code"


def test_plan_says_the_layer_dest_survives_a_restart_not_a_recreate_and_the_restart_runs_on_the_host(
        target: Project, own_container: Served) -> None:
    project = own_service(target, own_container)
    planned = project.deployer("plan", "fix.yaml", "--host", "box", "--verbose")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    text = " ".join(planned.stdout.split())
    assert "in the container's writable layer: kept across restart, lost when the container is recreated" in text
    box = own_container.box.name
    assert f"podman stop -t 5 {box}" in text and f"podman start {box}" in text, planned.stdout
    assert f"start a new agent in container {box}" in text, planned.stdout
    # check reads the container's main pid through the engine on the host, its health from inside.
    checked = project.deployer("check", "--host", "box")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    row = next(line for line in checked.stdout.splitlines() if "service server" in line)
    assert row.split()[3:6] == ["ok", "pid", str(own_container.state()[0])], row


@pytest.mark.parametrize("service, where, said", [
    ({"container": {"engine": "podman", "name": "another"}}, "services.server.container",
     "container another is not the host's container"),
    ({"container": "BOX"}, "services.server.container", "write `container: {engine: podman, name: BOX}`"),
    ({"gpus": [0]}, "services.server.gpus", "drop `gpus:` here"),
])
def test_a_container_service_that_cannot_work_inside_the_hosts_container_is_refused_at_load(
        target: Project, own_container: Served, service: dict[str, Any], where: str, said: str) -> None:
    project = own_service(target, own_container)
    box = own_container.box.name
    spec = {k: (v.replace("BOX", box) if isinstance(v, str) else v) for k, v in service.items()}
    project.write_inventory(services={"server": {**project.host["services"]["server"], **spec}})
    planned = project.deployer("plan", "fix.yaml", "--host", "box")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    mark = value_mark(project.inventory, ("hosts", "box", *where.split(".")))
    assert planned.stderr.startswith(f"error: {project.inventory}:{mark}: hosts.box.{where}: "), planned.stderr
    assert f"hosts.box.{where}:" in planned.stderr and said.replace("BOX", box) in planned.stderr, planned.stderr


def test_the_hosts_own_container_must_come_first_among_its_services(
        target: Project, own_container: Served) -> None:
    project = own_service(target, own_container)
    project.write_inventory(services={"router": {"start": "sleep 1000"}, **project.host["services"]})
    planned = project.deployer("plan", "fix.yaml", "--host", "box")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert "the host's own container must be its first service" in planned.stderr, planned.stderr


def test_a_run_cut_after_the_containers_restart_is_recovered_through_a_new_agent_in_it(
        target: Project, own_container: Served) -> None:
    project = own_service(target, own_container)
    project.playbook(steps=[*RESTART[:-1], {**RESTART[-1], "drain": {**RESTART[-1]["drain"], "stable_polls": 5}}])
    git_dir = f"{CONTAINER_REPO}/.git"
    proc = project.popen("apply", "fix.yaml", "--host", "box")
    try:
        def reopened() -> bool:  # the agent in the restarted container said hello: the run is past the restart
            logs = list(project.runs.glob("*/events.jsonl"))
            return (bool(logs) and logs[0].read_text().count('"type": "agent"') >= 2) or proc.poll() is not None
        wait_for(reopened, "the agent in the restarted container")
        assert proc.poll() is None, proc.communicate()
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = next(project.runs.glob("*/events.jsonl")).parent
    # The agent the stop ended is said to be gone: recover does not look for its pid in the restarted container.
    assert [e["type"] for e in project.events(run.name) if e["type"] in ("agent", "agent_ended")] == \
        ["agent", "agent_ended", "agent"]
    # recover takes over only a stale lock: the killed run's heartbeat (beaten by its second agent), backdated.
    own_container.box.sh(f"touch -d '2 days ago' {git_dir}/deployer.run.lock/heartbeat")
    recovered = project.deployer("recover", run.name)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert own_container.box.read(f"{CONTAINER_REPO}/pkg/a.py") == FIXED_A
    assert metric(own_container) == "42"
    assert own_container.box.read(f"{git_dir}/deployer/inflight.json") is None, "the intent record is still there"
    assert own_container.box.sh(f"test -e {git_dir}/deployer.run.lock && echo held || true") == "", "lock held"


def test_restart_alone_restarts_the_container_under_the_lock_its_intent_record_gated(
        target: Project, own_container: Served) -> None:
    project = own_service(target, own_container)
    pid, started = own_container.state()
    restarted = project.deployer("restart", "--host", "box")
    # The intent record went out on the agent the stop ended: the new agent's requests (the heartbeat) are not
    # gated behind a request it never saw.
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    new_pid, new_started = own_container.state()
    assert new_pid != pid and new_started != started
    assert events_of(project, "restart")[0]["pids"] == {"server": {"old": pid, "new": new_pid}}
    assert project.deployer("lock", "status", "--host", "box").returncode == 0, "the lock is still held"


def test_a_host_without_python_for_the_agent_beside_its_own_container_is_told_to_install_it() -> None:
    from deployer.errors import PythonMissing
    from deployer.transport.container import HostSide
    from deployer.transport.local import LocalTransport

    side = HostSide(LocalTransport("box"), python="/nonexistent/python3")
    try:
        with pytest.raises(PythonMissing, match=r"^box: the host has no /nonexistent/python3 to run the agent beside "
                                                r"the container that is its own service .*; install "):
            side.run(["true"])
    finally:
        side.close()


def test_a_restarted_container_that_never_gets_healthy_fails_with_its_engines_log_read_on_the_host(
        target: Project, own_container: Served) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the health wait never gets an answer
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    project = own_service(target, own_container, health=f"http://127.0.0.1:{closed}/health", health_timeout_s=2)
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 5, applied.stdout + applied.stderr
    assert "service server: http://127.0.0.1:" in applied.stderr and "did not answer 200 within 2s" in applied.stderr
    # The tail is `podman logs` run on the host: no engine inside the container to run it, no lost agent.
    tail = next(e for e in events_of(project, "command") if e.get("action") == "server.log")
    assert tail["exit_code"] == 0 and tail["command"].endswith(f"podman {own_container.box.name}"), tail
    assert "agent lost" not in applied.stderr
    assert own_container.state()[0] > 0, "the container runs"
    assert project.deployer("lock", "status", "--host", "box").returncode == 0, "the lock is still held"


def test_a_service_answering_while_it_does_not_run_is_told_to_adopt_its_port_only_when_it_is_a_command() -> None:
    from deployer.config.models import Service
    from deployer.steps.services.manager import not_ours

    url = "http://127.0.0.1:30000/health"
    said = {kind: not_ours("box", "server", Service.model_validate({kind: value, "health": url}))
            for kind, value in {"container": "sglang", "systemd": "sglang.service", "start": "serve"}.items()}
    assert said["container"] == (f"{url} answers 200, but container sglang does not run: another process serves "
                                 "that URL; stop it, or correct the service's health URL")
    assert said["systemd"].startswith(f"{url} answers 200, but unit sglang.service runs no process")
    assert 'add "adopt: port" to hosts.box.services.server' in said["start"]
    assert not any("adopt" in said[kind] for kind in ("container", "systemd"))


def test_a_container_left_stopped_by_a_failed_start_is_recovered_once_started_by_hand(
        target: Project, own_container: Served) -> None:
    box = own_container.box.name
    refuse = target.root / "refuse-start"
    engine = target.write("engine.sh", f'#!/bin/sh\n[ "$1" = start ] && [ -e {refuse} ] && '
                                       '{ echo "Error: start refused" >&2; exit 125; }\nexec podman "$@"\n')
    engine.chmod(0o755)
    project = own_service(target, own_container,
                          container={"engine": "podman", "name": box, "engine_path": str(engine)})
    project.write_inventory(container={"engine": "podman", "name": box, "engine_path": str(engine)})
    refuse.touch()
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode != 0, applied.stdout + applied.stderr
    assert (f"{engine} start {box} failed (the container stays stopped, and the run's agent in it with it: start it "
            f"with `{engine} start {box}`, then `deployer recover` the run)") in applied.stderr, applied.stderr
    run_id = project.newest_run()
    refuse.unlink()
    refused = project.deployer("recover", run_id)
    assert refused.returncode == 4 and f"the podman container {box!r} is not running" in refused.stderr, refused.stderr
    own_container.box.podman("start", box)
    own_container.box.sh(f"touch -d '2 days ago' {CONTAINER_REPO}/.git/deployer.run.lock/heartbeat")
    recovered = project.deployer("recover", run_id)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert metric(own_container) == "42", "the started container does not serve the fix"
    assert project.deployer("lock", "status", "--host", "box").returncode == 0, "the lock is still held"
