"""A bounded abort storm against the target's serving endpoint, to provoke the bug class."""

from __future__ import annotations

import http.client
import json
import posixpath
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field

from deployer.command import shell_line
from deployer.config.api import API_HELP, Api, RequestTemplate, cancels_by_request, request
from deployer.config.models import Host, KubernetesHost, LoopbackUrl, Strict
from deployer.errors import StepFailed
from deployer.steps.base import Action, Effect, Scope, Step, no_url
from deployer.steps.context import NOTHING, Context
from deployer.steps.loadgen import DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROMPT, MAX_CONCURRENCY, MAX_REQUESTS, run_storm
from deployer.steps.optional import ChecksHost

PROBE_S = 10.0  # for the first answer through a port-forward


class StormParams(Strict):
    url: LoopbackUrl | None = Field(default=None, description=(
        "Where the requests go, on the target's loopback (default: the host's endpoint + the API's path)."))
    api: Api | None = Field(default=None, description=(
        f"The API the requests speak (default: the host's api): {API_HELP}."))
    requests: int = Field(default=200, ge=1, le=MAX_REQUESTS, description="How many requests are sent.")
    concurrency: int = Field(default=32, ge=1, le=MAX_CONCURRENCY, description="How many are in flight at a time.")
    client_timeout_s: float = Field(default=0.2, gt=0, le=60, description=(
        "Seconds after which a client gives up on its request, which aborts it on the server."))
    abort_all_every: int | None = Field(default=None, ge=1, description=(
        "After every Nth request, also POST {abort_all: true} to abort_url."))
    abort_url: LoopbackUrl | None = Field(default=None, description=(
        "Where abort_all is sent (default: the storm URL's /abort_request); SGLang's API only."))
    max_duration_s: float = Field(default=60.0, gt=0, le=600, description="No request is sent after this many seconds.")


def _sibling(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, posixpath.join(posixpath.dirname(parts.path), path), "", ""))


def storm_api(params: StormParams, host: Host) -> str | RequestTemplate:
    return params.api or host.api


def no_abort_all(params: StormParams, host: Host) -> str | None:
    """Why the storm cannot send abort_all (None: it can, or it was not asked to)."""
    if params.abort_all_every is None or cancels_by_request(storm_api(params, host)):
        return None
    return ("abort_all_every needs the sglang API (/abort_request): an OpenAI-compatible server cancels a request "
            "only when its client goes away, which the storm's client_timeout_s does")


def reached(ctx: Context, url: str) -> str:
    """url as this machine reaches it (a tunnel when remote). Through a port-forward (a pod's), one GET first: kubectl
    accepts a connection before it reaches the pod's port, so a port nothing listens on shows only as connections
    dropped; any HTTP answer will do, none is a failed step that names the pod's port and says what kubectl said."""
    local = ctx.transport.reach(url)
    ports = ctx.transport.ports
    if ports is None:
        return local
    try:
        urllib.request.urlopen(local, timeout=PROBE_S).close()
    except urllib.error.HTTPError:
        pass  # an answer: something listens there
    except (OSError, http.client.HTTPException) as exc:
        said = ports.said(urlsplit(local).port or 0)
        raise StepFailed(ctx.bus.step or "storm", f"nothing answers {url} in the target ({local} from here: "
                         f"{exc}){': ' + said if said else ''}") from None
    return local


def storm_request(ctx: Context, params: StormParams) -> tuple[str, str, str]:
    """The storm's URL, its JSON body (streaming), and where abort_all goes."""
    path, body = request(storm_api(params, ctx.host), DEFAULT_PROMPT, DEFAULT_MAX_NEW_TOKENS)
    url = params.url or (ctx.host.endpoint.rstrip("/") + path if ctx.host.endpoint else None)
    if url is None:
        raise StepFailed(ctx.bus.step or "storm", f"no storm URL: set `endpoint` on host {ctx.host_name} "
                         "or `url` on the step")
    if problem := no_abort_all(params, ctx.host):
        raise StepFailed(ctx.bus.step or "storm", problem)
    return url, json.dumps({**body, "stream": True}, sort_keys=True), params.abort_url or _sibling(url, "abort_request")


def storm_actions(ctx: Context, params: StormParams) -> list[Action]:
    """What a storm does, as the target sees it: POSTs to its URL from here (through a tunnel when remote)."""
    url, body, abort_url = storm_request(ctx, params)
    p = params
    actions = [Action.http("storm", f"{p.requests} streaming requests, {p.concurrency} at a time, clients give up "
                           f"after {p.client_timeout_s:g}s; none sent after {p.max_duration_s:g}s{through(ctx, url)}",
                           url,
                           method="POST", body=body, repeats=True)]
    if p.abort_all_every:
        actions.append(Action.http("abort_all", f"abort_all after every {p.abort_all_every}th request", abort_url,
                                   method="POST", repeats=True))
    return actions


def through(ctx: Context, url: str) -> str:
    """How the load reaches a pod's port from here, for plan (other hosts: the link's own tunnel, said nowhere)."""
    if not isinstance(ctx.host, KubernetesHost):
        return ""
    from deployer.transport.kubernetes import port_forward_argv

    parts = urlsplit(url)
    argv = port_forward_argv(ctx.host.pod, parts.port or (443 if parts.scheme == "https" else 80))
    return f"; from here through `{shell_line(argv)}` (where kubectl runs; ended with the connection)"


def storm(ctx: Context, params: StormParams) -> str:
    flood, *abort_all = storm_actions(ctx, params)
    assert flood.body is not None
    result = run_storm(reached(ctx, flood.target), requests=params.requests, concurrency=params.concurrency,
                       client_timeout_s=params.client_timeout_s, abort_all_every=params.abort_all_every,
                       abort_url=ctx.transport.reach(storm_request(ctx, params)[2]),
                       max_duration_s=params.max_duration_s, body=json.loads(flood.body))
    counts = {"sent": result.sent, "completed": result.completed, "aborted": result.aborted,
              "errors": result.errors, "abort_all_sent": result.abort_all_sent}
    # Thousands of requests at once: their totals, in a `storm` event.
    ctx.log_action(flood, NOTHING, None, event="storm", count=result.sent,
                   extra={**counts, "duration_s": round(result.duration_s, 3)})
    for action in abort_all:
        ctx.log_action(action, NOTHING, None, count=result.abort_all_tried,
                       outcomes=[[k, n] for k, n in (("2xx", result.abort_all_sent),
                                                     ("failed", result.abort_all_tried - result.abort_all_sent)) if n])
    ctx.facts.storms = [*ctx.facts.storms, counts]
    return (f"sent {result.sent}: {result.completed} completed, {result.aborted} aborted, "
            f"{result.errors} errors in {result.duration_s:.1f}s")


class Storm(Step, ChecksHost):
    """Fire a bounded burst of concurrent requests with short client timeouts, to provoke the bug's aborts."""

    kind = "storm"
    scope = Scope.metrics_host
    effect = Effect.loads
    Params = StormParams
    params: StormParams

    def check_host(self, host_name: str, host: Host) -> str | None:
        return no_url(self.params.url, host.endpoint, host_name, "storm", "endpoint") or \
            no_abort_all(self.params, host)

    def plan(self, ctx: Context) -> list[Action]:
        return storm_actions(ctx, self.params)

    def run(self, ctx: Context) -> str:
        return storm(ctx, self.params)
