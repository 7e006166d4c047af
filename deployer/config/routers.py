"""The inventory's `routers:` (what sends a unit its traffic, and how a worker is taken out and put back), and the
entries of a unit's `workers:` (which of its services the router knows, as what)."""

from __future__ import annotations

import re
from collections.abc import Callable
from string import Formatter
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

LOOPBACK = ("127.0.0.1", "localhost", "::1")

# A worker's in-flight requests: SGLang's running and waiting requests and its PD queues, each summed over every
# series (one per rank or scheduler). The router's `inflight:` replaces the list for other servers.
SGLANG_INFLIGHT = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs",
                   "sglang:num_prefill_inflight_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
                   "sglang:num_decode_transfer_queue_reqs")


def http_origin(url: str) -> str:
    """http://HOST:PORT of an http URL (no path): what a router names a worker by."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ValueError(f"{url!r}: expected http://HOST:PORT")
    return f"http://{parts.netloc}"


def _loopback_origin(url: str) -> str:
    origin = http_origin(url)
    if urlsplit(origin).hostname not in LOOPBACK:
        raise ValueError(f"{url!r}: the router is called on its own host's loopback (127.0.0.1, localhost, ::1)")
    return origin


# What a worker call's template may name: the worker's URL as the router knows it, its type, and a prefill's
# bootstrap port (empty for a worker without one). A list call names nothing: it lists every worker.
WORKER_FIELDS = ("worker", "worker_type", "bootstrap_port")
# `urls:` of an http list call: keys from the JSON answer's root, `[*]` once for a list of objects
# (`$.urls`, `$.workers[*].url`).
URLS_PATH = re.compile(r"\$((?:\.\w+)*)(?:\[\*\]((?:\.\w+)+))?")


def placeholders(template: str) -> list[str]:
    """The {names} a template uses ({{ and }} stand for braces); a malformed one is refused."""
    try:
        return [name for _, name, _, _ in Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{template!r}: {exc} (write {{{{ and }}}} for a literal brace)") from None


def _check_template(template: str, allowed: tuple[str, ...]) -> str:
    unknown = [name or "{}" for name in placeholders(template) if name not in allowed]
    if unknown:
        known = f"known: {', '.join('{' + a + '}' for a in allowed)}" if allowed else \
            "a list call takes none: it lists every worker"
        raise ValueError(f"{template!r}: unknown placeholder {{{unknown[0]}}} ({known})")
    return template


def _template(allowed: tuple[str, ...]) -> AfterValidator:
    return AfterValidator(lambda template: _check_template(template, allowed))


WorkerTemplate = Annotated[str, _template(WORKER_FIELDS)]
ListTemplate = Annotated[str, _template(())]


def _json_body(body: dict[str, Any]) -> dict[str, Any]:
    """A body of any JSON values (YAML's dates and the like are refused), placeholders checked in its strings."""
    def walk(value: Any, at: str) -> None:
        if isinstance(value, str):
            try:
                _check_template(value, WORKER_FIELDS)
            except ValueError as exc:
                raise ValueError(f"{at}: {exc}") from None
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{at}[{index}]")
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"{at}: key {key!r} is not a string (JSON keys are)")
                walk(item, f"{at}.{key}")
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise ValueError(f"{at}: {value!r} is not a JSON value (a string, number, boolean, null, list or object)")
    walk(body, "body")
    return body


# A JSON object sent as the request's body: its values any JSON, placeholders templated inside its strings only.
JsonBody = Annotated[dict[str, Any], AfterValidator(_json_body)]


def template_strings(value: Any, fill: Callable[[str], str]) -> Any:
    """A body with fill(string) applied to every string value in it, however deep; the rest as is."""
    if isinstance(value, str):
        return fill(value)
    if isinstance(value, list):
        return [template_strings(item, fill) for item in value]
    if isinstance(value, dict):
        return {key: template_strings(item, fill) for key, item in value.items()}
    return value


def _urls_path(path: str) -> str:
    if not URLS_PATH.fullmatch(path):
        raise ValueError(f"{path!r}: expected $.KEY... or $.KEY...[*].KEY... (e.g. $.urls, $.workers[*].url)")
    return path


class HttpChange(BaseModel):
    """`api: http`: a removal or an addition as one request to the router (path and body templated)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first use, not at import

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = Field(default="POST", description="The HTTP method.")
    path: WorkerTemplate = Field(description=(
        "The request's path; {worker}, {worker_type} and {bootstrap_port} are filled in URL-quoted "
        "(e.g. /remove_worker?url={worker})."))
    body: JsonBody | None = Field(default=None, description=(
        "A JSON object sent as the body; the placeholders in its strings are filled in raw (JSON quotes them)."))


class HttpList(BaseModel):
    """`api: http`: the router's worker list, and where its answer holds the worker URLs."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first use, not at import

    path: ListTemplate = Field(description="The path whose answer lists the router's workers.")
    urls: Annotated[str, AfterValidator(_urls_path)] = Field(default="$.urls", description=(
        "Where the JSON answer holds the worker URLs: $.KEY... or $.KEY...[*].KEY... (e.g. $.workers[*].url)."))


# argv run on the router's host (no shell); the list command prints one worker URL a line
CommandCall = Annotated[list[WorkerTemplate], Field(min_length=1)]
ListCommand = Annotated[list[ListTemplate], Field(min_length=1)]


def _form(value: object) -> str:
    """Which form a call is written in, so a wrong call is reported in that form only (not once per union member)."""
    return "command" if isinstance(value, list) else "http"


# The forms a call is spelled out in, and how a change and a list call are written in each: an api of that name
# takes its calls in it (fleet.routers' http and command adapters send them).
CALL_FORMS = {"http": ("{method, path, body}", "{path, urls}"), "command": ("an argv list", "an argv list")}


Change = Annotated[Annotated[HttpChange, Tag("http")] | Annotated[CommandCall, Tag("command")], Discriminator(_form)]
Listing = Annotated[Annotated[HttpList, Tag("http")] | Annotated[ListCommand, Tag("command")], Discriminator(_form)]


class Router(BaseModel):
    """A router on an inventory host, called there through the agent (loopback only)."""

    model_config = ConfigDict(extra="forbid", frozen=True,  # config.models.Strict's (that module imports this one)
                              populate_by_name=True, defer_build=True)

    host: str = Field(description="The inventory host whose loopback serves the router.")
    url: Annotated[str, AfterValidator(_loopback_origin)] = Field(description=(
        "The router's http://HOST:PORT on its host's loopback."))
    # One adapter module each in fleet.routers (a test keeps this list and its APIS the same).
    api: Literal["sglang-gateway", "sglang-router", "http", "command"] = Field(default="sglang-gateway", description=(
        "How the router is called: sglang-gateway, sglang-router, or http or command with remove, add and list "
        "spelled out."))
    remove: Change | None = Field(default=None, description=(
        "api http or command: the call that takes a worker out, {method, path, body} or an argv run on its host."))
    add: Change | None = Field(default=None, description=(
        "api http or command: the call that puts a worker back, {method, path, body} or an argv run on its host."))
    # `list` in the file (the name would shadow the builtin in this class's annotations)
    listing: Listing | None = Field(default=None, alias="list", description=(
        "api http or command: the call that lists the workers, {path, urls} or an argv that prints one URL a line."))
    inflight: list[str] = Field(default_factory=lambda: list(SGLANG_INFLIGHT), min_length=1, description=(
        "The gauges whose sum is a worker's in-flight requests (default: SGLang's running, waiting and PD queues)."))
    change_timeout_s: float = Field(default=10.0, gt=0, description=(
        "Seconds a queued removal or addition has to show in the router's list."))
    drain_timeout_s: float = Field(default=120.0, gt=0, description=(
        "Seconds a removed worker's in-flight requests have to reach 0."))
    # A request the router sent a worker's way just before the removal can still be on its way to it, counted by no
    # gauge (a loaded router thread took over 0.4 s: the demo lost a request).
    settle_s: float = Field(default=1.0, ge=0, description=(
        "Seconds a removed worker's in-flight requests must stay 0 before it is restarted."))
    interval_s: float = Field(default=0.2, gt=0, description="Seconds between reads of the router and the gauges.")

    @model_validator(mode="after")
    def _calls_fit_api(self) -> Router:
        """An api named as a call form (http, command) takes its three calls spelled out in that form; any other
        knows its own calls (its adapter in fleet.routers) and takes none."""
        calls = {"remove": self.remove, "add": self.add, "list": self.listing}
        if self.api not in CALL_FORMS:
            given = [name for name, call in calls.items() if call is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only for api {' or '.join(CALL_FORMS)} "
                                 f"(api {self.api} knows its calls)")
            return self
        for name, call in calls.items():
            if call is None or _form(call) != self.api:
                raise ValueError(f"api {self.api} needs `{name}:` as {CALL_FORMS[self.api][name == 'list']}")
        return self


class RouterWorker(BaseModel):
    """One of a unit's services as its router knows it."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first use, not at import

    service: str = Field(description=(
        "The HOST:SERVICE of the unit (of the host itself, for a plain host behind a router) this worker is."))
    worker_type: Literal["prefill", "decode", "regular"] = Field(description="What the router knows it as.")
    url: Annotated[str, AfterValidator(http_origin)] | None = Field(default=None, description=(
        "The worker's http://HOST:PORT as the router reaches it (default: the origin of the service's health URL); "
        "for a worker of a selector host, {pod} is its pod's name (http://{pod}.sglang.serving.svc:30000)."))
    bootstrap_port: int | None = Field(default=None, ge=1, le=65535, description=(
        "A prefill's bootstrap port, sent to the router when the worker is added back."))


class BehindRouter(BaseModel):
    """`router:` and `workers:` of a unit or of a plain inventory host (config.units.Unit and config.models.Host take
    these): the inventory's router that sends it traffic, and its services as that router knows them."""

    model_config = ConfigDict(defer_build=True)  # a mixin: only its subclasses' validators are built and used

    router: str | None = Field(default=None, description=(
        "The router (a name in the inventory's routers:) that sends it traffic."))
    workers: list[RouterWorker] = Field(default_factory=list, description=(
        "Its services as that router knows them: each one's HOST:SERVICE, worker_type, url and bootstrap_port."))


def metrics_origin(health: str | None) -> str:
    """http://HOST:PORT of a worker service's health URL (checked when the inventory loaded): where its own
    gauges are read, on its host's loopback, and by default the URL the router names it by."""
    assert health is not None
    return http_origin(health)
