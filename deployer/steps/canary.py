"""canary: prove the new servers with a real generation, not only their /health.

In PD serving both roles can answer /health 200 while the pair is broken (sglang#33789: persistent 500s after a
prefill restart), and a failed request can come back as HTTP 200 with `finish_reason: {"type": "error"}`
(smg#2382). So after the restart the step sends one generation straight to the new server (and, with `via`,
one more through the router) from the target's own loopback, and requires: HTTP 200, a JSON answer with
non-empty text, a finish_reason that is not an error, an answer within the latency bound, and with `golden:` the
exact text of a recorded answer (deterministic inference: SGLang `--enable-deterministic-inference`, vLLM
`VLLM_BATCH_INVARIANT=1`). The request speaks the host's API (or the step's): SGLang's /generate, an
OpenAI-compatible /v1/completions or /v1/chat/completions, or a template; either answer's shape is read. What came
back is input: validated before it counts, shown escaped, and recorded in
the run log (masked as every event is).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AfterValidator, Field

from deployer.agent.protocol import HttpResult
from deployer.command import Masker
from deployer.config.api import API_HELP, Api, request
from deployer.config.models import Host, LoopbackUrl, Playbook, Strict, check_loopback_url
from deployer.errors import ConfigError, StepFailed
from deployer.steps.action import Action
from deployer.steps.base import Effect, Scope, Step
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Context, EventBus, LoadedPlaybook
from deployer.steps.optional import ChecksHost, ReachesRouters, under_traffic
from deployer.text import shown, visible
from deployer.transport.base import Transport

if TYPE_CHECKING:
    from deployer.config.routers import Router
    from deployer.steps.optional import RouterReach

GOLDEN_FORMAT = 1


def _via(value: str) -> str:
    """A URL (checked as one), or else the name of a router of the inventory (checked against it by check_host)."""
    return check_loopback_url(value) if "://" in value else value


class CanaryParams(Strict):
    url: LoopbackUrl | None = Field(default=None, description=(
        "The URL asked, on the target's loopback (default: the service's health URL, with the API's path)."))
    service: str | None = Field(default=None, description=(
        "The service whose health URL gives the default url (default: the host's first with one)."))
    # a router by name is asked on that router's host, at its url + the API's path
    via: Annotated[str, AfterValidator(_via)] | None = Field(default=None, description=(
        "Also ask through the router: its URL, or a router of the inventory's routers: by name."))
    api: Api | None = Field(default=None, description=(
        f"The API the request speaks (default: the host's api): {API_HELP}."))
    text: str = Field(default="The capital of France is", min_length=1, description="The prompt sent.")
    max_new_tokens: int = Field(default=8, ge=1, le=4096, description="The tokens each answer may have.")
    latency_s: float = Field(default=30.0, gt=0, description="Seconds each answer must come within.")
    golden: str | None = Field(default=None, description=(
        "A file `deployer canary --record` wrote (relative to the playbook) that each answer must match."))
    timeout_s: float = Field(default=60.0, gt=0, description="Seconds each request may take.")

    def request(self, host: Host) -> tuple[str, str]:
        """The path and JSON body of the canary's generation, in the step's API or else the host's."""
        path, body = request(self.api or host.api, self.text, self.max_new_tokens)
        return path, json.dumps(body, sort_keys=True)


@dataclass(frozen=True)
class Answer:
    """One canary answer, judged: `problem` None when it passed every check (the golden compared apart)."""

    url: str
    status: int | None
    seconds: float
    text: str | None
    finish: str | None  # finish_reason.type
    problem: str | None

    def event(self) -> dict[str, Any]:
        return {"url": self.url, "status": self.status, "latency_s": round(self.seconds, 3), "text": self.text,
                "finish_reason": self.finish, "ok": self.problem is None, "problem": self.problem}


def judge(result: HttpResult, seconds: float, params: CanaryParams) -> Answer:
    """What one answer came to: the checks in the order a person would look."""
    def answer(problem: str | None, text: str | None = None, finish: str | None = None) -> Answer:
        return Answer(result.url, result.status, seconds, text, finish, problem)

    if result.status is None:
        return answer(f"no answer ({visible(result.error or '?', multiline=False)})")
    if result.status != 200:
        return answer(f"HTTP {result.status}: {shown(result.text)}")
    try:
        reply = json.loads(result.body)
    except ValueError:
        return answer(f"not JSON: {shown(result.text)}")
    text, reason = generation(reply)
    finish = reason.get("type") if isinstance(reason, dict) else reason
    if not isinstance(text, str) or not isinstance(finish, (str, type(None))):
        return answer("not a generation (SGLang's text and meta_info.finish_reason, or OpenAI's choices[0] text "
                      f"or message.content and finish_reason): {shown(result.text)}")
    if finish in ("error", "abort"):
        said = reason.get("message", "") if isinstance(reason, dict) else ""
        return answer(f"finish_reason {finish}: {shown(str(said))}", text, finish)
    if not text.strip():
        return answer("empty output", text, finish)
    if seconds > params.latency_s:
        return answer(f"answered in {seconds:.2f}s, over the {params.latency_s:g}s bound", text, finish)
    return answer(None, text, finish)


def generation(reply: Any) -> tuple[Any, Any]:
    """The text and finish_reason of an answer, SGLang's (text, meta_info) or OpenAI's (choices[0]: a completion's
    text, a chat completion's message.content)."""
    if not isinstance(reply, dict):
        return None, None
    choices = reply.get("choices")
    if "meta_info" not in reply and isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        return text, choice.get("finish_reason")
    meta = reply.get("meta_info")
    return reply.get("text"), meta.get("finish_reason") if isinstance(meta, dict) else None


def first_difference(expected: str, got: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), min(len(expected), len(got)))
    return (f"first difference at character {at}: expected {shown(expected[at:])}, got {shown(got[at:])} "
            f"(after {shown(expected[max(0, at - 20):at])})")


def default_url(host_name: str, host: Host, service: str | None, path: str) -> str | None:
    """The service's health URL with the API's path: where the new server answers a generation."""
    names = [service] if service is not None else list(host.services)
    health = next((h for n in names if n in host.services and (h := host.services[n].health)), None)
    if health is None:
        return None
    parts = urlsplit(health)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def request_action(url: str, params: CanaryParams, body: str, through: str) -> Action:
    return Action.http(f"canary.{through}", f"a {params.max_new_tokens}-token generation {through}, judged "
                       f"(200, output, finish_reason, within {params.latency_s:g}s)", url, method="POST",
                       body=body)


def ask(ctx: Context, action: Action, params: CanaryParams, **tags: str) -> Answer:
    began = time.monotonic()
    result = ctx.act(action, timeout=params.timeout_s)
    answer = judge(result, time.monotonic() - began, params)
    ctx.emit("canary", **answer.event(), **tags)
    return answer


def golden_file(path: Path) -> dict[str, Any]:
    """A recorded answer: {format, request, url, text}; refused (naming the file) when it is not one."""
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a golden answer `deployer canary --record` wrote: {exc}") from None
    if not isinstance(recorded, dict) or recorded.get("format") != GOLDEN_FORMAT or \
            not isinstance(recorded.get("text"), str):
        raise ConfigError(f"{path}: not a golden answer `deployer canary --record` wrote (format {GOLDEN_FORMAT})")
    return recorded


def golden_of(answer: Answer, action: Action) -> dict[str, Any]:
    assert action.body is not None
    return {"format": GOLDEN_FORMAT, "request": json.loads(action.body), "url": answer.url, "text": answer.text}


class Canary(Step, ChecksHost, ReachesRouters):
    """Prove the new build with a real generation, optionally compared with a recorded golden answer."""

    kind = "canary"
    scope = Scope.metrics_host
    effect = Effect.verifies
    Params = CanaryParams
    params: CanaryParams

    routers: Callable[[], RouterReach] | None = None  # the inventory's, when the command has one (reach_routers)
    # Which of its requests this step sends: both, or one half of a canary split around a router (halves()).
    asks: Literal["both", "direct", "router"] = "both"

    def halves(self) -> tuple[Canary, Canary | None]:
        """The canary straight to the new server, and its request through the router as a step of its own (None
        without `via`): a unit behind its router asks that one only once its workers are back in the router, where
        the request can reach them (fleet/unit.py)."""
        if self.params.via is None:
            return self, None
        direct, through = copy.copy(self), copy.copy(self)
        direct.asks, through.asks = "direct", "router"
        through.name = f"{self.name} (through the router)"
        return direct, through

    def reach_routers(self, routers: Callable[[], RouterReach]) -> None:
        self.routers = cache(routers)  # read once, and only when `via:` names a router

    def unknown_router(self) -> str | None:
        """What is wrong with the router `via:` names (None: none named, a URL, or one of the inventory's)."""
        name = self.params.via
        if name is None or "://" in name or self.routers is None:  # no inventory (canary --record): never asked
            return None
        specs = self.routers().specs
        return None if name in specs else \
            f"via: {name!r} is not a router of the inventory (routers: {', '.join(specs) or 'none'})"

    def router(self) -> tuple[str, Router] | None:
        """The router `via:` names (None: no via, or a URL)."""
        name = self.params.via
        if name is None or "://" in name:
            return None
        if self.routers is None:
            raise ConfigError(f"{self.where}: {self.name}: via: {name!r} names a router: no inventory read here")
        if problem := self.unknown_router():
            raise ConfigError(f"{self.where}: {self.name}: {problem}")
        return name, self.routers().specs[name]

    def check_host(self, host_name: str, host: Host) -> str | None:
        if self.params.service is not None and self.params.service not in host.services:
            return f"host {host_name} has no service {self.params.service}"
        if self.params.url is None and default_url(host_name, host, self.params.service, "/") is None:
            return f"no canary URL: give a service a `health` URL on host {host_name}, or `url` on the step"
        return self.unknown_router()

    def requests(self, ctx: Context) -> list[Action]:
        path, body = self.params.request(ctx.host)
        url = self.params.url or default_url(ctx.host_name, ctx.host, self.params.service, path)
        if url is None:
            raise StepFailed(self.name, self.check_host(ctx.host_name, ctx.host) or "no canary URL")
        direct = [request_action(url, self.params, body, "to the new server")]
        if self.params.via is None:
            return direct
        router = self.router()
        through = self.params.via if router is None else router[1].url + path
        return [*direct, request_action(through, self.params, body, "through the router" if router is None else
                                        f"through router {router[0]} (on {router[1].host})")]

    def golden(self, ctx: Context) -> Path | None:
        return None if self.params.golden is None else ctx.playbook.path.parent / self.params.golden

    def plan(self, ctx: Context) -> list[Action]:
        path = self.golden(ctx)
        compare = [] if path is None else [Action(f"each output must be exactly the text recorded in {path}")]
        return [*self.requests(ctx), *compare]

    def run(self, ctx: Context) -> str:
        path = self.golden(ctx)
        expected = None if path is None else golden_file(path)["text"]
        said = []
        asked = list(zip(self.requests(ctx), [None, self.router()], strict=False))
        for action, router in {"both": asked, "direct": asked[:1], "router": asked[1:]}[self.asks]:
            answer = self.ask_router(ctx, action, router) if router is not None else ask(ctx, action, self.params)
            where = f"{action.method} {answer.url}" + ("" if router is None else
                                                       f" through router {router[0]} (on {router[1].host})")
            if answer.problem is not None:
                raise StepFailed(self.name, f"canary {where}: {answer.problem}")
            assert answer.text is not None
            if expected is not None and answer.text != expected:
                raise StepFailed(self.name, f"canary {where}: the output is not the golden one in {path}: "
                                 f"{first_difference(expected, answer.text)}")
            said.append(f"{answer.url}: {answer.status} in {answer.seconds:.2f}s, {shown(answer.text)}"
                        + (" = golden" if expected is not None else ""))
        return "; ".join(said)

    def ask_router(self, ctx: Context, action: Action, router: tuple[str, Router]) -> Answer:
        """The request sent by the agent on the router's host (the step's own connection when it is this host),
        recorded in this run's log."""
        name, spec = router
        if spec.host == ctx.host_name:
            return ask(ctx, action, self.params, router=name)
        assert self.routers is not None  # router() found it there
        connect = self.routers().connect
        if connect is None:
            raise StepFailed(self.name, f"canary: no connection to router {name}'s host {spec.host}")
        with connect(spec.host) as transport:
            return ask(replace(ctx, transport=transport), action, self.params, router=name)


def around_router(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """A routed unit's steps after its restart (fleet/unit.py): those run while it is out of its router, and those
    run once it is back and listed: each canary's request through a router (while out, the router could send it only
    to the other units, and it would prove nothing of these workers), and each check of the new build under the
    traffic the router sends it (an analysis: while out, it would read windows without a request)."""
    out: list[Step] = []
    back: list[Step] = []
    for step in steps:
        if under_traffic(step):
            back.append(step)
            continue
        direct, through = step.halves() if isinstance(step, Canary) else (step, None)
        out.append(direct)
        if through is not None:
            back.append(through)
    return out, back


def record(host_name: str, host: Host, connect: Callable[[EventBus], Transport],
           playbook: tuple[LoadedPlaybook, Sequence[Step]] | None, out: Path) -> Answer:
    """`deployer canary --record`: the canary's request (the playbook's first canary step, else the defaults)
    sent straight to the host's server once; a passing answer is written to `out` as the golden one."""
    loaded, steps = playbook or (None, [])
    step = next((s for s in steps if isinstance(s, Canary)), None) or Canary(CanaryParams(), "canary")
    bus = EventBus(Masker(host.secrets()), host_name)
    shipped = loaded or LoadedPlaybook(path=out, raw=b"", model=Playbook.model_construct(name="canary", steps=[]),
                                        sources={}, patch=None)
    if problem := step.check_host(host_name, host):
        raise ConfigError(f"{step.where or 'canary'}: {problem}")
    with connect(bus) as transport:
        ctx = Context(run_id="<canary>", host_name=host_name, host=host, transport=transport, playbook=shipped,
                      bus=bus, cancel=CancelToken())
        action = step.requests(ctx)[0]
        answer = ask(ctx, action, step.params)
    if answer.problem is not None:
        raise StepFailed(step.name, f"canary {answer.url}: {answer.problem}; no golden answer written")
    out.write_text(json.dumps(golden_of(answer, action), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return answer
