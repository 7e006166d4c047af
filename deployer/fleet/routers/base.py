"""What every router API adapter answers (RouterApi), and the data its calls are: a request to the router on its
host's loopback, or an argv run on that host. An adapter only says what to send and how to read the answer; the
unit's routing (fleet.router) sends it through the agent, so an adapter is plain data in, plain data out.

What the router answers is input: an adapter's reading of it raises ValueError, TypeError or KeyError on anything
not of the shape its API promises, and the caller says so with the answer shown escaped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from deployer.config.routers import URLS_PATH, Router, RouterWorker, http_origin


@dataclass(frozen=True)
class Listed:
    """One worker as the router lists it."""

    id: str
    url: str
    worker_type: str
    is_healthy: bool


@dataclass(frozen=True)
class Request:
    """One HTTP request to the router: its url + path."""

    method: str
    path: str
    body: dict[str, Any] | None = None


# A call to the router: a request, or an argv run on the router's host (no shell).
Call = Request | list[str]


class RouterApi(Protocol):
    """One router API: the calls that list, take out and put back a worker, and how its list reads."""

    name: ClassVar[str]  # what `api:` names it by in the inventory

    def listing(self, spec: Router) -> Call:
        """The call whose answer lists the router's workers."""
        ...

    def workers(self, spec: Router, answer: str) -> list[Listed]:
        """The workers in that call's answer (ValueError, TypeError, KeyError: not what the API answers)."""
        ...

    def remove(self, spec: Router, url: str, worker: RouterWorker, listed: Listed) -> Call:
        """The call that takes a worker (at url, as the router knows it) out; listed: the router's entry of it."""
        ...

    def add(self, spec: Router, url: str, worker: RouterWorker) -> Call:
        """The call that puts a worker (at url) back."""
        ...


def listed(rows: list[Any]) -> list[Listed]:
    """The router's worker entries ({id, url, worker_type?, is_healthy?}), each checked and named by its URL's
    origin. An API that lists URLs only gives {id: url, url: url}: a listed worker counts as healthy (its proofs
    checked it)."""
    found = []
    for row in rows:
        if not (isinstance(row["id"], str) and isinstance(row["url"], str)
                and isinstance(row.get("is_healthy", True), bool)):
            raise TypeError(f"a worker entry of the wrong types: {row}")
        found.append(Listed(row["id"], http_origin(row["url"]), str(row.get("worker_type", "")),
                            row.get("is_healthy", True)))
    return found


def of_urls(urls: list[str]) -> list[Listed]:
    return listed([{"id": url, "url": url} for url in urls])


def urls_at(data: Any, path: str) -> list[str]:
    """The worker URLs where `urls:` ($.KEY..., or $.KEY...[*].KEY...) points in a router's JSON answer."""
    match = URLS_PATH.fullmatch(path)
    assert match is not None  # checked when the inventory loaded
    head, each = match.groups()

    def walk(value: Any, keys: str) -> Any:
        for key in filter(None, keys.split(".")):
            if not isinstance(value, dict) or key not in value:
                raise KeyError(f"no key {key!r} on the way to {path}")
            value = value[key]
        return value

    found = walk(data, head)
    if not isinstance(found, list):
        raise TypeError(f"{path}: not a list")
    urls = [walk(item, each) for item in found] if each else found
    if not all(isinstance(url, str) for url in urls):
        raise TypeError(f"{path}: not a list of URL strings")
    return urls


def fill(template: str, url: str, worker: RouterWorker, escape: Callable[[str], str] = str) -> str:
    """A spelled-out call's template with the worker's values (escaped for where they stand: a URL's path and
    query)."""
    port = worker.bootstrap_port
    values = {"worker": url, "worker_type": worker.worker_type, "bootstrap_port": "" if port is None else str(port)}
    return template.format(**{name: escape(value) for name, value in values.items()})

