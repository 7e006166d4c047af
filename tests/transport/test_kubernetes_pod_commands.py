"""Commands that name one pod of a selector host (`box.decode-1`), against the stand-in cluster: `logs` reads its
server's output and `canary --record` asks its server, through the agent in the pod; a `storm` sends its load from
this machine through `kubectl port-forward` to the pod's port."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fixtures_kube import Container, Kube
from fixtures_repo import ORIGINAL_A, Project, init_repo
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
