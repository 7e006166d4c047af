"""A canary proves the new server with a real generation: straight to it, judged (200, output, finish_reason,
latency), optionally compared with a golden answer `deployer canary --record` wrote, and recorded in the run log.

The server is the demo stack's SGLang stand-in, whose direct /generate is deterministic and which fails it as
broken PD serving does (HTTP 200 with finish_reason "error") when started with SGLANG_DEMO_GENERATE_FAIL."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

from fixtures_repo import git
from fixtures_services import Stack, free_port

from deployer.demo.run import STACK

# The shipped fix makes pkg/a.py return 42: a server started on that build fails its generations.
FAILS_ON_THE_FIX = 'grep -q "return 42" pkg/a.py && export SGLANG_DEMO_GENERATE_FAIL=error; exec "$@"'
PIPELINE = ["local_compile", "upload", "remote_compile", {"commit": {"message": "fix"}}, "co_restart"]


def demo_decode(stack: Stack, *, fails_on_the_fix: bool = False) -> dict[str, Any]:
    """The demo decode server as the host's one service, its copy of the stack outside the source tree."""
    copy = stack.project.root / "stack"
    if not copy.exists():
        shutil.copytree(STACK, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    port = stack.ports["decode"]
    server = [sys.executable, "-m", "sglang.launch_server", "--disaggregation-mode", "decode", "--port", str(port),
              "--disaggregation-bootstrap-port", str(free_port())]
    wrapped = ["sh", "-c", FAILS_ON_THE_FIX, "canary-knob", *server] if fails_on_the_fix else server
    return {"start": wrapped, "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20,
            "stop_grace_s": 2, "env": {"PYTHONPATH": str(copy / "python"), "SGLANG_DEMO_STARTUP_S": "0.05",
                                       "PYTHONDONTWRITEBYTECODE": "1"}}


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
