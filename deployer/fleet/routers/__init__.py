"""The router APIs, one adapter module each behind one interface (base.RouterApi), as Argo Rollouts keeps one
package per traffic provider: a new router is a new module here and a line in APIS, and nothing outside this
package branches on a router's `api:`."""

from __future__ import annotations

from deployer.config.routers import Router
from deployer.fleet.routers.base import RouterApi
from deployer.fleet.routers.command import CommandApi
from deployer.fleet.routers.http import HttpApi
from deployer.fleet.routers.sglang_gateway import SglangGateway
from deployer.fleet.routers.sglang_router import SglangRouter

APIS: dict[str, RouterApi] = {api.name: api for api in (SglangGateway(), SglangRouter(), HttpApi(), CommandApi())}


def api_of(spec: Router) -> RouterApi:
    """The adapter of the API a router's config names (config.routers.Router's `api:` allows these only)."""
    return APIS[spec.api]
