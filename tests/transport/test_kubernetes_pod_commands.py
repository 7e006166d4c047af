"""Commands that name one pod of a selector host (`box.decode-1`), against the stand-in cluster: `logs` reads its
server's output and `canary --record` asks its server, through the agent in the pod; a `storm` sends its load from
this machine through `kubectl port-forward` to the pod's port."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures_kube import Container, Kube
from fixtures_repo import ORIGINAL_A, Project, init_repo
from fixtures_ssh import SSHD
from polling import wait_for
from ports import free_port
from test_kubernetes_target import POD_REPO, pod_project

from deployer.demo.run import http_status

# A generation server of SGLang's API in the pod: /health, /generate (streamed or not), one line per request served.
SERVER = """\
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.answer(b"ok", "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        reply = {"text": " Paris.", "meta_info": {"finish_reason": {"type": "length"}}}
        if body.get("stream"):
            self.answer(b"data: " + json.dumps(reply).encode() + b"\\n\\ndata: [DONE]\\n\\n", "text/event-stream")
        else:
            self.answer(json.dumps(reply).encode(), "application/json")
        print(f"served {self.path}", flush=True)

    def answer(self, data, kind):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.fixture
def decode(kube: Kube, tmp_path: Path) -> tuple[Project, int]:
    """Pods decode-0 and decode-1 selected by role=decode as host `box`; its service `server` (the generation server
    above, a `start:` process in the container) on a port of the host network, started in decode-1 alone."""
    image = tmp_path / "image-checkout"
    init_repo(image, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "serve.py": SERVER})
    for name in ("decode-0", "decode-1"):
        kube.pod(name, Container("server", image_files={POD_REPO: image}), labels={"role": "decode"})
    port = free_port()
    service = {"start": [sys.executable, f"{POD_REPO}/serve.py", str(port)],
               "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20, "stop_grace_s": 2}
    project = pod_project(kube, tmp_path, pod={"selector": "role=decode"}, services={"server": service},
                          endpoint=f"http://127.0.0.1:{port}")
    del project.host["pod"]["name"]
    project.write_inventory()
    started = project.deployer("restart", "--host", "box.decode-1")
    assert started.returncode == 0, started.stdout + started.stderr
    assert http_status(f"http://127.0.0.1:{port}/health") == 200
    return project, port


def test_logs_and_canary_record_name_a_selectors_pod_as_a_host(decode: tuple[Project, int], tmp_path: Path) -> None:
    project, _ = decode
    asked = project.deployer("canary", "--host", "box.decode-1", "--record", str(tmp_path / "golden.json"))
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert json.loads((tmp_path / "golden.json").read_text())["text"] == " Paris."

    read = project.deployer("logs", "server", "--host", "box.decode-1", "--json")
    assert read.returncode == 0, read.stdout + read.stderr
    assert "served /generate" in read.stdout


@pytest.mark.parametrize("websockets", ["true", "false"])
def test_kubectl_port_forward_reaches_the_pods_server_through_the_stand_in(decode: tuple[Project, int],
                                                                           kube: Kube, websockets: str) -> None:
    """kubectl 1.37 asks for SPDY in WebSocket messages first; with KUBECTL_PORT_FORWARD_WEBSOCKETS=false it upgrades
    the connection to SPDY/3.1 itself (its fallback, and older kubectls' only way): the stand-in serves both."""
    _, port = decode
    env = {**kube.env, "KUBECTL_PORT_FORWARD_WEBSOCKETS": websockets}
    forward = subprocess.Popen([str(kube.kubectl_path), "port-forward", "pod/decode-1", f":{port}"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = forward.stdout.readline().decode() if forward.stdout else ""
        local = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)", line)
        assert local is not None and local[2] == str(port), line
        assert http_status(f"http://127.0.0.1:{local[1]}/health") == 200
    finally:
        os.killpg(forward.pid, signal.SIGKILL)
        forward.wait()
    with kube.cluster.lock:  # a WebSocket upgrade is a GET, SPDY's a POST: the one asked for, and no fallback
        asked = [each.split()[0] for each in kube.cluster.requests if each.endswith("/pods/decode-1/portforward")]
    assert asked == ["GET" if websockets == "true" else "POST"], asked


def port_forwards(pod: str) -> list[int]:
    """The pids of the kubectl port-forward processes to pod (and the shells tied to them) running here now."""
    return [pid for pid in map(int, filter(str.isdecimal, os.listdir("/proc"))) if forwarding(pid, pod)]


def forwarding(pid: int, pod: str) -> bool:
    """pid runs (not a zombie: killed, not yet reaped) a port-forward to pod."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and b"port-forward" in argv and f"pod/{pod}".encode() in argv


def served(kube: Kube, pod: str) -> int:
    """How many generations the server in pod answered (its log, where deployer keeps a `start:` service's)."""
    done = kube.kubectl("exec", pod, "-c", "server", "--", "sh", "-c", f"cat {POD_REPO}/.git/deployer/server.log")
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().count("served /generate")


@pytest.mark.parametrize("where", ["local", "bastion"])
def test_a_storm_on_a_pod_goes_through_kubectl_port_forward_which_ends_with_the_run(
        decode: tuple[Project, int], kube: Kube, where: str, request: pytest.FixtureRequest) -> None:
    """kubectl port-forward where kubectl runs: on this machine, or on the bastion (this machine over the real
    sshd), its local port reached there through the SSH connection; either way gone once the run ends. plan says
    the kubectl command."""
    project, port = decode
    if where == "bastion":
        sshd: SSHD = request.getfixturevalue("sshd")
        project.host.update(via="bastion", pod={**project.host["pod"], "kubectl": str(kube.kubectl_path)})
        bastion = {"transport": "ssh", "address": sshd.host, "port": sshd.port, "user": sshd.user,
                   "identity_file": str(sshd.client_key), "known_hosts": str(sshd.known_hosts), "repo": "/unused",
                   "python": sys.executable}
        project.inventory.write_text(yaml.safe_dump({"hosts": {"box": project.host, "bastion": bastion}},
                                                    sort_keys=False))
    project.playbook(files=[], steps=[{"storm": {"requests": 40, "concurrency": 4, "client_timeout_s": 10}}])
    planned = project.deployer("plan", "fix.yaml", "--host", "box.decode-1")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert f"port-forward pod/decode-1 :{port}" in planned.stdout.replace("\n", " "), planned.stdout
    before = served(kube, "decode-1")
    seen: list[int] = []
    run = project.popen("apply", "fix.yaml", "--host", "box.decode-1", "--allow-dirty")
    wait_for(lambda: bool(seen.extend(port_forwards("decode-1")) or seen) or run.poll() is not None,
             "kubectl port-forward running", 60)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, out + err
    assert "sent 40: 40 completed" in out + err
    assert served(kube, "decode-1") - before == 40  # each request reached the pod's server
    assert seen, "no kubectl port-forward was seen while the run ran"
    wait_for(lambda: not any(forwarding(pid, "decode-1") for pid in seen), "the port-forward gone with the run", 10)


def test_a_storm_at_a_pod_port_nothing_listens_on_fails_naming_the_pod_and_the_port(
        decode: tuple[Project, int], kube: Kube) -> None:
    project, _ = decode
    closed = free_port()
    project.playbook(files=[], steps=[{"storm": {"url": f"http://127.0.0.1:{closed}/generate", "requests": 5}}])
    run = project.deployer("apply", "fix.yaml", "--host", "box.decode-1", "--allow-dirty")
    assert run.returncode != 0, run.stdout + run.stderr
    said = run.stdout + run.stderr
    assert f"nothing answers http://127.0.0.1:{closed}/generate" in said, said
    assert "decode-1" in said and f"{closed}" in said and "connection refused" in said, said
    assert port_forwards("decode-1") == []


def test_a_port_forward_ends_when_deployer_is_killed(decode: tuple[Project, int], kube: Kube) -> None:
    """SIGKILL leaves deployer no close to run: the idle port-forward (the storm done, a drain polling the pod's
    metrics through the agent) ends as its pipe from deployer does."""
    project, port = decode
    project.playbook(files=[], steps=[{"storm": {"requests": 5, "concurrency": 1, "client_timeout_s": 10}},
                                      {"drain": {"metric": "never_reported", "to": 0, "within_s": 120}}])
    project.write_inventory(metrics=f"http://127.0.0.1:{port}/metrics")
    before = served(kube, "decode-1")
    run = project.popen("apply", "fix.yaml", "--host", "box.decode-1", "--allow-dirty")
    seen: list[int] = []
    try:
        wait_for(lambda: served(kube, "decode-1") - before == 5 or run.poll() is not None, "the storm served", 60)
        seen = port_forwards("decode-1")
        assert seen and run.poll() is None, run.communicate()
    finally:
        run.kill()
        run.communicate()
    wait_for(lambda: not any(forwarding(pid, "decode-1") for pid in seen), "the port-forward gone with deployer", 15)


def test_a_storm_where_rbac_forbids_port_forward_fails_saying_so(decode: tuple[Project, int], kube: Kube) -> None:
    project, port = decode
    kube.forbid("create", "pods/portforward")
    project.playbook(files=[], steps=[{"storm": {"requests": 5}}])
    run = project.deployer("apply", "fix.yaml", "--host", "box.decode-1", "--allow-dirty")
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert f"kubectl port-forward of port {port} of pod 'decode-1'" in said, said
    assert 'cannot create resource "pods/portforward"' in said, said
    assert port_forwards("decode-1") == []
