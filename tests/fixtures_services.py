"""Real services for the tests: `python -m http.server` processes serving a directory the test controls.

`/health` is a file, and `/metrics` is a Prometheus text file the test rewrites to make a gauge
drain (or not). The scrape, the parse and the restarts are all real.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import Project
from polling import within
from ports import free_port

from deployer.demo.run import process_alive as alive

GAUGE = "sglang:num_prefill_inflight_queue_reqs"


class Served:
    """A real HTTP server on 127.0.0.1 (a thread of this test process), answering every GET and POST (its body
    read and dropped) with `status` and `answer(path)`, and counting the requests it answered."""

    def __init__(self, answer: Callable[[str], bytes], status: int = 200) -> None:
        self.hits = 0
        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.hits += 1
                body = answer(self.path)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def served(answer: Callable[[str], bytes], status: int = 200) -> Iterator[Served]:
    server = Served(answer, status)
    try:
        yield server
    finally:
        server.close()


def metrics_text(value: float, name: str = GAUGE) -> str:
    return (f"# HELP {name} inflight\n# TYPE {name} gauge\n"
            f'{name}{{engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} {value}\n'
            f'{name}{{engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="1"}} 0.0\n')


class Stack:
    """Two http.server services (prefill, decode) described in the project's inventory."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.www = project.root / "www"
        self.www.mkdir()
        (self.www / "health").write_text("ok\n")
        self.set_gauge(3.0)
        self.ports = {"prefill": free_port(), "decode": free_port()}

    def set_gauge(self, value: float) -> None:
        tmp = self.www / "metrics.tmp"
        tmp.write_text(metrics_text(value))
        os.replace(tmp, self.www / "metrics")

    def service(self, name: str, **extra: Any) -> dict[str, Any]:
        port = self.ports[name]
        return {"start": [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                          "--directory", str(self.www)],
                "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20, "stop_grace_s": 5, **extra}

    def fetch(self, url: str) -> str:
        """GET a URL on the target's loopback, from where the target sees it."""
        if self.project.netns is not None:
            return self.project.netns.fetch(url)
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    def configure(self, **services: dict[str, Any]) -> None:
        chosen = services or {"prefill": self.service("prefill"), "decode": self.service("decode")}
        self.project.write_inventory(services=chosen,
                                     metrics=f"http://127.0.0.1:{self.ports['prefill']}/metrics")

    def start_services(self) -> None:
        """Every service started by deployer (its pid files are deployer's): fix.yaml is co_restart alone,
        applied once."""
        self.project.playbook(steps=[{"co_restart": {}}])
        started = self.project.deployer("apply", "fix.yaml", "--host", "box")
        assert started.returncode == 0, started.stdout + started.stderr

    def pids(self) -> dict[str, int]:
        state = self.project.repo / ".git" / "deployer"
        return {p.stem: int(p.read_text()) for p in state.glob("*.pid")}

    def kill_all(self) -> None:
        """Each recorded service's process group, whatever leads it: a server a launcher left behind (`server &`)
        is in its launcher's group, not one of its own pid."""
        for pid in self.pids().values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != os.getpgrp():
                    os.killpg(group, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def stack(target: Project) -> Iterator[Stack]:
    stack = Stack(target)
    stack.configure()
    yield stack
    stack.kill_all()


def processes_naming(*words: str) -> set[int]:
    """The live processes whose command line holds every one of `words` (the target is this machine)."""
    found = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and all(w.encode() in (entry / "cmdline").read_bytes() for w in words):
                found.add(int(entry.name))
    return found


def kill_naming(*words: str) -> None:
    """SIGKILL every process whose command line holds every one of `words`."""
    for pid in processes_naming(*words):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_dead(pid: int, seconds: float = 10) -> bool:
    return within(lambda: not alive(pid), seconds, interval_s=0.05)


# A server that answers /health with what the code it loaded at start computes (pkg.a.answer()), and whose
# gauge follows that code: the shipped fix (answer 42) leaves the queue at 3, the original build (41) drains
# it. So a drain after the fix fails, and only a rollback that restarts and drains again sees the old build drain.
GAUGE_SERVER = """
import http.server, sys
sys.path.insert(0, sys.argv[2])
from pkg.a import answer
posts, metrics = sys.argv[3], sys.argv[4 if answer() == 42 else 5]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = str(answer()).encode() if self.path == "/health" else open(metrics, "rb").read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # a storm request: counted, answered with one finished stream event
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(posts, "a") as seen:
            seen.write(self.path + "\\n")
        body = b'data: {"meta_info": {"finish_reason": {"type": "stop"}}}\\n\\ndata: [DONE]\\n\\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def gauge_server(root: Path, port: int, repo: Path, www: Path, *, follows_code: bool = True) -> list[str]:
    """The argv of a GAUGE_SERVER on port, loading repo's code; stuck.prom and drained.prom in www (or, not
    following the code, www/metrics whatever it loaded: the gauge the test sets with Stack.set_gauge)."""
    server = root / "gauge_server.py"
    server.write_text(GAUGE_SERVER)
    (www / "stuck.prom").write_text(metrics_text(3.0))
    (www / "drained.prom").write_text(metrics_text(0.0))
    gauges = ("stuck.prom", "drained.prom") if follows_code else ("metrics", "metrics")
    return [sys.executable, str(server), str(port), str(repo), str(www / "posts"), *(str(www / g) for g in gauges)]


def code_following(stack: Stack) -> Project:
    """Services whose gauge follows the code they loaded (3 on the fix, 0 before it), started by deployer, with
    the storm's endpoint on prefill."""
    project = stack.project
    stack.configure(**{name: {**stack.service(name), "env": {"PYTHONDONTWRITEBYTECODE": "1"},
                              "start": gauge_server(project.root, port, project.repo, stack.www)}
                       for name, port in stack.ports.items()})
    host = yaml.safe_load(project.inventory.read_text())["hosts"]["box"]
    project.write_inventory(**{**host, "endpoint": f"http://127.0.0.1:{stack.ports['prefill']}"})
    stack.start_services()
    return project
