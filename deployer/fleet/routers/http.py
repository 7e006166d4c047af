"""`api: http`: a router whose calls the inventory spells out as requests (`remove:`, `add:` {method, path, body},
`list:` {path, urls}). The worker's values are filled into the path URL-quoted, and into the body's strings raw
(JSON quotes them); the list's answer is JSON holding the worker URLs where `urls:` points."""

from __future__ import annotations

import json
from typing import ClassVar
from urllib.parse import quote

from deployer.config.routers import HttpChange, HttpList, Router, RouterWorker, template_strings
from deployer.fleet.routers.base import Call, Listed, Request, fill, of_urls, urls_at


def _list(spec: Router) -> HttpList:
    assert isinstance(spec.listing, HttpList)  # config: an api named as a call form takes its calls in it
    return spec.listing


def _change(call: HttpChange | list[str] | None, url: str, worker: RouterWorker) -> Request:
    assert isinstance(call, HttpChange)  # config: an api named as a call form takes its calls in it
    body = None if call.body is None else template_strings(call.body, lambda value: fill(value, url, worker))
    return Request(call.method, fill(call.path, url, worker, lambda value: quote(value, safe="")), body)


class HttpApi:
    name: ClassVar[str] = "http"

    def listing(self, spec: Router) -> Call:
        return Request("GET", _list(spec).path)

    def workers(self, spec: Router, answer: str) -> list[Listed]:
        return of_urls(urls_at(json.loads(answer), _list(spec).urls))

    def remove(self, spec: Router, url: str, worker: RouterWorker, listed: Listed) -> Call:
        return _change(spec.remove, url, worker)

    def add(self, spec: Router, url: str, worker: RouterWorker) -> Call:
        return _change(spec.add, url, worker)
