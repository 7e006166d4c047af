"""A canary proves the new server with a real generation: straight to it, judged (200, output, finish_reason,
latency), optionally compared with a golden answer `deployer canary --record` wrote, and recorded in the run log.

The server is the demo stack's SGLang stand-in, whose direct /generate is deterministic and which fails it as
broken PD serving does (HTTP 200 with finish_reason "error") when started with SGLANG_DEMO_GENERATE_FAIL. `via:`
a router of the inventory goes through the demo PD router, on a host of its own."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

import yaml
from fixtures_repo import git
from fixtures_services import Stack, free_port
from polling import wait_for

from deployer.demo.run import STACK

# The shipped fix makes pkg/a.py return 42: a server started on that build fails its generations.
FAILS_ON_THE_FIX = 'grep -q "return 42" pkg/a.py && export SGLANG_DEMO_GENERATE_FAIL=error; exec "$@"'
PIPELINE = ["local_compile", "upload", "remote_compile", {"commit": {"message": "fix"}}, "co_restart"]


def demo_copy(stack: Stack) -> Path:
    """The demo stack copied outside the source tree: its python/ is every demo process's PYTHONPATH."""
    copy = stack.project.root / "stack"
    if not copy.exists():
        shutil.copytree(STACK, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy / "python"


def demo_server(stack: Stack, mode: str, *, fails_on_the_fix: bool = False) -> dict[str, Any]:
    """A demo SGLang server (mode prefill or decode) as a service of the host, on stack.ports[mode]."""
    stack.ports.setdefault("bootstrap", free_port())
    port = stack.ports[mode]
    server = [sys.executable, "-m", "sglang.launch_server", "--disaggregation-mode", mode, "--port", str(port),
              "--disaggregation-bootstrap-port", str(stack.ports["bootstrap"] if mode == "prefill" else free_port())]
    wrapped = ["sh", "-c", FAILS_ON_THE_FIX, "canary-knob", *server] if fails_on_the_fix else server
    return {"start": wrapped, "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20,
            "stop_grace_s": 2, "env": {"PYTHONPATH": str(demo_copy(stack)), "SGLANG_DEMO_STARTUP_S": "0.05",
                                       "PYTHONDONTWRITEBYTECODE": "1"}}


def demo_decode(stack: Stack, *, fails_on_the_fix: bool = False) -> dict[str, Any]:
    """The demo decode server as the host's one service."""
    return demo_server(stack, "decode", fails_on_the_fix=fails_on_the_fix)


def canaries(stack: Stack, run_id: str | None = None) -> list[dict[str, Any]]:
    return [e for e in stack.project.events(run_id) if e["type"] == "canary"]


def test_a_good_canary_passes_its_request_is_planned_and_its_answer_is_in_the_run_log(stack: Stack) -> None:
    project = stack.project
    stack.configure(decode=demo_decode(stack))
    project.playbook(steps=[*PIPELINE, {"canary": {"text": "hello world", "max_new_tokens": 4}}])
    url = f"http://127.0.0.1:{stack.ports['decode']}/generate"
    plan = project.deployer("plan", "fix.yaml", "--host", "box")
    body = '{"sampling_params": {"max_new_tokens": 4}, "text": "hello world"}'
    assert f"POST {url} {body}" in plan.stdout, plan.stdout + plan.stderr

    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    [seen] = canaries(stack)
    assert seen["url"] == url and seen["status"] == 200 and seen["ok"] is True
    assert seen["finish_reason"] == "length" and len(seen["text"].split()) == 4
    assert seen["latency_s"] < 30
    request = next(e for e in project.events() if e.get("action") == "canary.to the new server")
    assert request["method"] == "POST" and request["status"] == 200


def test_a_canary_answering_finish_reason_error_fails_after_the_commit_and_the_rollback_restores(
        stack: Stack) -> None:
    project = stack.project
    stack.configure(decode=demo_decode(stack, fails_on_the_fix=True))
    pre_tree = git(project.repo, "rev-parse", "HEAD^{tree}").strip()
    project.playbook(steps=[*PIPELINE, "canary"], on_failure="rollback")
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stdout + result.stderr
    assert "step 'canary' failed: canary POST" in result.stderr and "finish_reason error" in result.stderr
    assert "Rolled back" in result.stderr
    assert git(project.repo, "rev-parse", "HEAD^{tree}").strip() == pre_tree
    # The rolled-back build restarted and answered the canary again, this time well.
    forward, back = canaries(stack)
    assert forward["ok"] is False and forward["status"] == 200 and forward["finish_reason"] == "error"
    assert back["ok"] is True and back["text"].strip()
    ended = [(e["step"], e["status"]) for e in project.events() if e["type"] == "step_end"]
    assert ("canary", "failed") in ended and ended[-2:] == [("rollback:co_restart", "ok"), ("rollback:canary", "ok")]


def test_canary_record_writes_a_golden_answer_that_a_later_run_matches(stack: Stack) -> None:
    project = stack.project
    stack.configure(decode=demo_decode(stack))
    stack.start_services()
    project.playbook(steps=[*PIPELINE, {"canary": {"golden": "golden.json", "max_new_tokens": 6}}])
    recorded = project.deployer("canary", "fix.yaml", "--host", "box", "--record", "golden.json")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    golden = json.loads((project.root / "golden.json").read_text())
    assert golden["request"]["sampling_params"] == {"max_new_tokens": 6} and len(golden["text"].split()) == 6

    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [e["text"] for e in canaries(stack)] == [golden["text"]]  # a new server, the same answer


def test_a_canary_whose_output_differs_from_its_golden_fails_naming_the_first_difference(stack: Stack) -> None:
    project = stack.project
    stack.configure(decode=demo_decode(stack))
    project.playbook(steps=[*PIPELINE, {"canary": {"golden": "golden.json", "max_new_tokens": 3}}])
    (project.root / "golden.json").write_text(json.dumps({"format": 1, "request": {}, "url": "", "text": " zz"}))
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode != 0, result.stdout + result.stderr
    assert "the output is not the golden one" in result.stderr
    assert "first difference at character 1: expected 'zz'" in result.stderr
    [seen] = canaries(stack)
    assert seen["ok"] is True and seen["text"] != " zz"  # the answer itself passed; the comparison failed it


@contextmanager
def demo_router(stack: Stack, decode: str) -> Iterator[int]:
    """The demo PD router over the host's prefill and `decode` (a URL), started here (not a service of the host:
    only the canary goes through it); its port. Stopped by its pid at the end."""
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--port", str(port),
            "--prefill", f"http://127.0.0.1:{stack.ports['prefill']}", str(stack.ports["bootstrap"]),
            "--decode", decode]
    router = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(demo_copy(stack))},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def live() -> bool:
        with suppress(URLError, OSError), urlopen(f"http://127.0.0.1:{port}/liveness", timeout=2) as answer:
            return bool(answer.status == 200)
        return False
    try:
        wait_for(live, "the demo router answers /liveness", 20)
        yield port
    finally:
        with suppress(ProcessLookupError):
            os.killpg(router.pid, signal.SIGKILL)
        router.wait(timeout=10)


def behind_router(stack: Stack, router_port: int, via: str = "pd-router") -> None:
    """Host box serves prefill and decode; the inventory's router pd-router runs on host edge (box's repo and
    transport, another connection); the playbook's canary goes `via:` the router named."""
    project = stack.project
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["hosts"]["box"]["services"] = {"prefill": demo_server(stack, "prefill"),
                                             "decode": demo_server(stack, "decode")}
    inventory["hosts"]["edge"] = dict(project.host)
    inventory["routers"] = {"pd-router": {"host": "edge", "url": f"http://127.0.0.1:{router_port}"}}
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    project.playbook(steps=[*PIPELINE, {"canary": {"service": "decode", "via": via, "max_new_tokens": 4}}])


def test_a_canary_via_a_router_of_the_inventory_asks_it_on_the_routers_host_and_logs_its_answer(
        stack: Stack) -> None:
    project = stack.project
    stack.configure(decode=demo_decode(stack))  # the ports; behind_router writes the services
    with demo_router(stack, f"http://127.0.0.1:{stack.ports['decode']}") as port:
        behind_router(stack, port)
        plan = project.deployer("plan", "fix.yaml", "--host", "box")
        assert f"POST http://127.0.0.1:{port}/generate" in plan.stdout, plan.stdout + plan.stderr
        result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    direct, through = canaries(stack)
    assert direct["url"] == f"http://127.0.0.1:{stack.ports['decode']}/generate" and "router" not in direct
    assert through["url"] == f"http://127.0.0.1:{port}/generate" and through["router"] == "pd-router"
    assert through["ok"] is True and through["status"] == 200 and len(through["text"].split()) == 4
    request = next(e for e in project.events() if e.get("action") == "canary.through router pd-router (on edge)")
    assert request["status"] == 200


def test_a_canary_via_a_router_that_answers_badly_fails_the_step_naming_the_router(stack: Stack) -> None:
    project = stack.project
    stack.configure(decode=demo_decode(stack))
    with demo_router(stack, f"http://127.0.0.1:{free_port()}") as port:  # its decode worker is not there
        behind_router(stack, port)
        result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 5, result.stdout + result.stderr
    output = " ".join(result.stderr.split())
    assert f"step 'canary' failed: canary POST http://127.0.0.1:{port}/generate through router pd-router " \
           "(on edge): HTTP 5" in output, output
    direct, through = canaries(stack)
    assert direct["ok"] is True and through["ok"] is False and through["router"] == "pd-router"


def test_a_canary_via_a_router_the_inventory_lacks_is_refused_before_connecting(stack: Stack) -> None:
    project = stack.project
    behind_router(stack, free_port(), via="edge-router")
    for command in ("plan", "check"):
        result = project.deployer(command, "fix.yaml", "--host", "box")
        assert result.returncode == 2, result.stdout + result.stderr
        assert re.search(r"fix\.yaml:\d+:\d+: canary: via: 'edge-router' is not a router of the inventory "
                         r"\(routers: pd-router\)", result.stdout + result.stderr), result.stdout + result.stderr
