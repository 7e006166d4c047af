"""The canary's plan: one judged generation POSTed to the new server (its service's health origin + the API's
path), one more through the router with `via:` (a URL, or a router of the inventory by name), and the golden
comparison when one is given."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from planning import context, does, host, step

from deployer.config.routers import Router
from deployer.errors import ConfigError, StepFailed
from deployer.steps.action import Action
from deployer.steps.canary import Canary
from deployer.transport.base import Transport

SERVICES = {"prefill": {"start": "python -m server --port 30000", "health": "http://127.0.0.1:30000/health"},
            "decode": {"systemd": "decode.service", "health": "http://127.0.0.1:30001/health"}}
SGLANG = '{"sampling_params": {"max_new_tokens": 8}, "text": "The capital of France is"}'
JUDGED = "judged (200, output, finish_reason, within 30s)"


@dataclass
class Routers:
    """The inventory's routers as a step is given them (config.routers.RouterReach), built in memory."""

    specs: dict[str, Router] = field(default_factory=dict)
    connect: Callable[[str], Transport] | None = None


def canary(params: dict[str, object], routers: Routers | None = None) -> Canary:
    made = step("canary", params)
    assert isinstance(made, Canary)
    if routers is not None:
        made.reach_routers(lambda: routers)
    return made


def ask(key: str, what: str, url: str, body: str = SGLANG) -> Action:
    return Action.http(key, what, url, method="POST", body=body)


def test_canary_asks_the_first_service_with_a_health_url_in_the_hosts_api() -> None:
    plan = canary({}).plan(context(host(services=SERVICES)))
    assert does(plan) == does([ask("canary.to the new server", f"a 8-token generation to the new server, {JUDGED}",
                                   "http://127.0.0.1:30000/generate")])


def test_canary_speaks_openai_chat_to_the_named_service_when_the_host_says_so() -> None:
    plan = canary({"service": "decode"}).plan(context(host(services=SERVICES, api="openai-chat")))
    assert does(plan) == does([ask(
        "canary.to the new server", f"a 8-token generation to the new server, {JUDGED}",
        "http://127.0.0.1:30001/v1/chat/completions",
        '{"max_tokens": 8, "messages": [{"content": "The capital of France is", "role": "user"}]}')])


def test_canary_through_a_router_url_asks_it_too_then_compares_with_the_golden_answer() -> None:
    params = {"url": "http://127.0.0.1:30001/generate", "via": "http://127.0.0.1:8000/generate", "text": "Hi",
              "max_new_tokens": 4, "latency_s": 2.5, "golden": "golden/hi.json", "api": "sglang"}
    body = '{"sampling_params": {"max_new_tokens": 4}, "text": "Hi"}'
    judged = "judged (200, output, finish_reason, within 2.5s)"
    assert does(canary(params).plan(context(host(services=SERVICES, api="openai")))) == does([
        ask("canary.to the new server", f"a 4-token generation to the new server, {judged}",
            "http://127.0.0.1:30001/generate", body),
        ask("canary.through the router", f"a 4-token generation through the router, {judged}",
            "http://127.0.0.1:8000/generate", body),
        Action("each output must be exactly the text recorded in /work/fix/golden/hi.json")])


def test_canary_via_a_router_by_name_asks_it_at_its_url_with_the_apis_path() -> None:
    routers = Routers({"lb": Router(host="router-1", url="http://127.0.0.1:8080")})
    plan = canary({"via": "lb"}, routers).plan(context(host(services=SERVICES)))
    assert does(plan) == does([
        ask("canary.to the new server", f"a 8-token generation to the new server, {JUDGED}",
            "http://127.0.0.1:30000/generate"),
        ask("canary.through router lb (on router-1)", f"a 8-token generation through router lb (on router-1), "
            f"{JUDGED}", "http://127.0.0.1:8080/generate")])


def test_canary_via_a_router_the_inventory_lacks_is_refused_naming_those_it_has() -> None:
    routers = Routers({"lb": Router(host="router-1", url="http://127.0.0.1:8080")})
    with pytest.raises(ConfigError, match=r"via: 'edge' is not a router of the inventory \(routers: lb\)"):
        canary({"via": "edge"}, routers).plan(context(host(services=SERVICES)))


def test_canary_cannot_plan_without_a_url_or_a_service_health() -> None:
    with pytest.raises(StepFailed, match="no canary URL: give a service a `health` URL on host gpu-1"):
        canary({}).plan(context(host()))
