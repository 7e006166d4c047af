"""A bounded abort storm against the target's serving endpoint, to provoke the bug class."""

from __future__ import annotations

import posixpath
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field

from deployer.config import Host, LoopbackUrl, Strict
from deployer.context import Context
from deployer.errors import StepFailed
from deployer.steps.base import Action, Effect, Step
from deployer.storm import MAX_CONCURRENCY, MAX_REQUESTS, run_storm


class StormParams(Strict):
    url: LoopbackUrl | None = None  # default: the host's `endpoint` + /generate
    requests: int = Field(default=200, ge=1, le=MAX_REQUESTS)
    concurrency: int = Field(default=32, ge=1, le=MAX_CONCURRENCY)
    client_timeout_s: float = Field(default=0.2, gt=0, le=60)
    abort_all_every: int | None = Field(default=None, ge=1)
    abort_url: LoopbackUrl | None = None  # default: the storm URL's /abort_request
    max_duration_s: float = Field(default=60.0, gt=0, le=600)


def _sibling(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, posixpath.join(posixpath.dirname(parts.path), path), "", ""))


def storm_urls(ctx: Context, params: StormParams) -> tuple[str, str]:
    url = params.url or (ctx.host.endpoint.rstrip("/") + "/generate" if ctx.host.endpoint else None)
    if url is None:
        raise StepFailed(ctx.bus.step or "storm", f"no storm URL: set `endpoint` on host {ctx.host_name} "
                         "or `url` on the step")
    return url, params.abort_url or _sibling(url, "abort_request")


def storm(ctx: Context, params: StormParams) -> str:
    url, abort_url = storm_urls(ctx, params)
    result = run_storm(ctx.transport.reach(url), requests=params.requests, concurrency=params.concurrency,
                       client_timeout_s=params.client_timeout_s, abort_all_every=params.abort_all_every,
                       abort_url=ctx.transport.reach(abort_url), max_duration_s=params.max_duration_s)
    counts = {"sent": result.sent, "completed": result.completed, "aborted": result.aborted,
              "errors": result.errors, "abort_all_sent": result.abort_all_sent}
    ctx.emit("storm", url=url, duration_s=round(result.duration_s, 3), **counts)
    ctx.facts.storms = [*ctx.facts.storms, counts]
    return (f"sent {result.sent}: {result.completed} completed, {result.aborted} aborted, "
            f"{result.errors} errors in {result.duration_s:.1f}s")


class Storm(Step):
    kind = "storm"
    effect = Effect.loads
    Params = StormParams
    params: StormParams

    def check_host(self, host_name: str, host: Host) -> str | None:
        if self.params.url is None and host.endpoint is None:
            return f"no storm URL: set `endpoint` on host {host_name} or `url` on the step"
        return None

    def plan(self, ctx: Context) -> list[Action]:
        url, abort_url = storm_urls(ctx, self.params)
        p = self.params
        extra = f", abort_all to {abort_url} every {p.abort_all_every}" if p.abort_all_every else ""
        return [Action(f"storm {url}: {p.requests} streaming requests, {p.concurrency} at a time, clients give "
                       f"up after {p.client_timeout_s:g}s{extra}; stops sending after {p.max_duration_s:g}s")]

    def run(self, ctx: Context) -> str:
        return storm(ctx, self.params)
