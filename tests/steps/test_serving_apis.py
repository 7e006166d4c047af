"""A storm and a canary speak the serving API the host (or the step) names: SGLang's /generate, an OpenAI-compatible
/v1/completions or /v1/chat/completions (vLLM's), or a request template; against the demo stack's server, which
answers all of them, through the CLI, on a local target and over the real sshd."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fixtures_repo import Project
from fixtures_services import Stack
from polling import wait_for
from test_canary import canaries, demo_decode

CHAT_TEMPLATE = {"path": "/v1/chat/completions",
                 "body": {"model": "demo-model", "max_tokens": "{max_tokens}",
                          "messages": [{"role": "user", "content": "Say: {prompt}"}]}}


def serving(stack: Stack, api: Any, **env: str) -> int:
    """The demo decode server as the host's one service and its endpoint, the host speaking `api`; its port."""
    service = demo_decode(stack)
    service["env"].update(env)
    port = stack.ports["decode"]
    stack.project.write_inventory(services={"decode": service}, api=api, endpoint=f"http://127.0.0.1:{port}")
    return port


def streams(stack: Stack, port: int) -> dict[str, int]:
    """How the server's own streams ended: {completed, aborted}."""
    counts: dict[str, int] = json.loads(stack.fetch(f"http://127.0.0.1:{port}/server_info"))["streams"]
    return counts


def storms(project: Project) -> list[tuple[int, int, int, int]]:
    return [(e["sent"], e["completed"], e["aborted"], e["errors"]) for e in project.events() if e["type"] == "storm"]


def test_a_storm_and_canaries_speak_openai_to_the_demo_server_and_plan_shows_what_they_send(stack: Stack) -> None:
    project = stack.project
    port = serving(stack, "openai")
    project.playbook(steps=["co_restart", {"storm": {"requests": 6, "concurrency": 3, "client_timeout_s": 10}},
                            {"canary": {"text": "hello world", "max_new_tokens": 4}},
                            {"canary": {"text": "hello world", "max_new_tokens": 3, "api": "openai-chat"}},
                            {"canary": {"text": "hi", "max_new_tokens": 2, "api": CHAT_TEMPLATE}}])
    base = f"http://127.0.0.1:{port}"
    plan = project.deployer("plan", "fix.yaml", "--host", "box")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    said = plan.stdout
    assert f'POST {base}/v1/completions {{"max_tokens": 8, "prompt": "Explain prefill/decode disaggregation in one ' \
           'sentence.", "stream": true}' in said, said
    assert f'POST {base}/v1/completions {{"max_tokens": 4, "prompt": "hello world"}}' in said, said
    assert f'POST {base}/v1/chat/completions {{"max_tokens": 3, "messages": [{{"content": "hello world", ' \
           '"role": "user"}]}' in said, said
    assert f'POST {base}/v1/chat/completions {{"max_tokens": 2, "messages": [{{"content": "Say: hi", ' \
           '"role": "user"}], "model": "demo-model"}' in said, said

    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    assert storms(project) == [(6, 6, 0, 0)]
    assert streams(stack, port) == {"completed": 6, "aborted": 0}  # the server streamed each one to its end
    completion, chat, templated = canaries(stack)
    assert [c["url"] for c in (completion, chat, templated)] == [f"{base}/v1/completions",
                                                                f"{base}/v1/chat/completions",
                                                                f"{base}/v1/chat/completions"]
    assert [len(c["text"].split()) for c in (completion, chat, templated)] == [4, 3, 2]
    assert all(c["ok"] and c["status"] == 200 and c["finish_reason"] == "length"
               for c in (completion, chat, templated))


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_a_storms_sent_completed_and_aborted_counts_are_right_in_either_api(stack: Stack, api: str) -> None:
    project = stack.project
    # 8 tokens 0.1 s apart: a client that waits 10 s sees the stream end, one that gives up after 0.3 s cancels it.
    port = serving(stack, api, SGLANG_DEMO_TOKEN_S="0.1")
    project.playbook(steps=["co_restart", {"storm": {"requests": 6, "concurrency": 3, "client_timeout_s": 10}},
                            {"storm": {"requests": 4, "concurrency": 4, "client_timeout_s": 0.3}}])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    assert storms(project) == [(6, 6, 0, 0), (4, 0, 4, 0)]
    # The clients that went away cancelled their requests on the server, which had no other way to hear of it.
    wait_for(lambda: streams(stack, port) == {"completed": 6, "aborted": 4}, "the server counted 4 cancelled streams",
             seconds=20)


def test_abort_all_with_an_openai_host_is_refused_before_anything_runs(stack: Stack) -> None:
    project = stack.project
    serving(stack, "openai")
    project.playbook(steps=[{"storm": {"requests": 4, "abort_all_every": 2}}])
    result = project.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "abort_all_every needs the sglang API (/abort_request)" in result.stderr


def at(path: Path, said: str, where: str) -> str:
    """The text from the file:line:col `said` gives for `where` (a file name) on."""
    found = re.search(re.escape(where) + r":(\d+):(\d+): ", said)
    assert found is not None, said
    line, column = int(found.group(1)), int(found.group(2))
    return path.read_text().splitlines()[line - 1][column - 1:]


def test_a_request_template_naming_an_unknown_placeholder_is_refused_at_load_with_file_line_and_column(
        target: Project) -> None:
    project = target
    bad = {"path": "/v1/completions", "body": {"prompt": "{prompt}", "max_tokens": "{max_token}"}}
    project.write_inventory(api=bad, endpoint="http://127.0.0.1:1")
    project.playbook(steps=[{"storm": {"requests": 1}}])
    result = project.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "hosts.box.api.body.max_tokens: unknown placeholder {max_token} (known: {prompt}, {max_tokens})" in \
        result.stderr
    assert at(project.inventory, result.stderr, project.inventory.name).startswith("'{max_token}'")

    project.write_inventory(endpoint="http://127.0.0.1:1")
    project.playbook(steps=[{"storm": {"api": {"path": "/v1/completions", "body": {"prompt": "{text}"}}}}])
    result = project.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "steps.0.storm.api.body.prompt: unknown placeholder {text}" in result.stderr
    assert at(project.root / "fix.yaml", result.stderr, "fix.yaml").startswith("'{text}'")
