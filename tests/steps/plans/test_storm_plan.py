"""The storm's plan: its streaming POSTs (URL and body in the API the host or the step speaks, and its sizes and
time caps), and abort_all where the API has one."""

from __future__ import annotations

import pytest
from planning import context, does, host, step

from deployer.errors import StepFailed
from deployer.steps.action import Action

PROMPT = "Explain prefill/decode disaggregation in one sentence."
DEFAULTS = "200 streaming requests, 32 at a time, clients give up after 0.2s; none sent after 60s"


def flood(url: str, body: str, what: str = DEFAULTS) -> Action:
    return Action.http("storm", what, url, method="POST", body=body, repeats=True)


def test_storm_speaks_sglangs_generate_at_the_hosts_endpoint_by_default() -> None:
    plan = step("storm").plan(context(host(endpoint="http://127.0.0.1:8000/")))
    assert does(plan) == does([flood("http://127.0.0.1:8000/generate",
                                     f'{{"sampling_params": {{"max_new_tokens": 8}}, "stream": true, '
                                     f'"text": "{PROMPT}"}}')])


def test_storm_speaks_openai_completions_when_the_host_says_openai() -> None:
    plan = step("storm").plan(context(host(endpoint="http://127.0.0.1:8000", api="openai")))
    assert does(plan) == does([flood("http://127.0.0.1:8000/v1/completions",
                                     f'{{"max_tokens": 8, "prompt": "{PROMPT}", "stream": true}}')])


def test_storm_api_on_the_step_wins_over_the_hosts_and_its_url_over_the_endpoint() -> None:
    plan = step("storm", {"api": "openai-chat", "url": "http://localhost:9999/x/chat", "requests": 1000,
                          "concurrency": 64, "client_timeout_s": 0.5, "max_duration_s": 30}).plan(
        context(host(endpoint="http://127.0.0.1:8000", api="sglang")))
    assert does(plan) == does([flood(
        "http://localhost:9999/x/chat",
        f'{{"max_tokens": 8, "messages": [{{"content": "{PROMPT}", "role": "user"}}], "stream": true}}',
        "1000 streaming requests, 64 at a time, clients give up after 0.5s; none sent after 30s")])


def test_storm_of_a_template_api_posts_its_path_and_body_filled_and_streaming() -> None:
    template = {"path": "/infer", "body": {"input": "Q: {prompt}", "limit": "{max_tokens}", "model": "m1"}}
    [storm] = step("storm", {"api": template}).plan(context(host(endpoint="http://127.0.0.1:8000")))
    assert (storm.target, storm.body) == (
        "http://127.0.0.1:8000/infer", f'{{"input": "Q: {PROMPT}", "limit": 8, "model": "m1", "stream": true}}')


def test_storm_with_abort_all_posts_it_beside_the_generate_unless_told_where() -> None:
    ctx = context(host(endpoint="http://127.0.0.1:8000"))
    _, beside = step("storm", {"abort_all_every": 25}).plan(ctx)
    _, told = step("storm", {"abort_all_every": 5, "abort_url": "http://127.0.0.1:8001/abort"}).plan(ctx)
    assert does([beside, told]) == does([
        Action.http("abort_all", "abort_all after every 25th request", "http://127.0.0.1:8000/abort_request",
                    method="POST", repeats=True),
        Action.http("abort_all", "abort_all after every 5th request", "http://127.0.0.1:8001/abort", method="POST",
                    repeats=True)])


@pytest.mark.parametrize("api", ["openai", "openai-chat"])
def test_storm_refuses_abort_all_where_the_api_has_no_abort_request(api: str) -> None:
    with pytest.raises(StepFailed, match="abort_all_every needs the sglang API"):
        step("storm", {"abort_all_every": 10, "api": api}).plan(context(host(endpoint="http://127.0.0.1:8000")))


def test_storm_cannot_plan_without_an_endpoint_or_url() -> None:
    with pytest.raises(StepFailed, match="no storm URL: set `endpoint` on host gpu-1 or `url` on the step"):
        step("storm").plan(context(host()))
