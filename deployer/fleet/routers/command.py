"""`api: command`: a router whose calls the inventory spells out as argv run on its host (no shell): `remove:` and
`add:` with the worker's values filled in, and `list:`, which prints one worker URL a line (an nginx or HAProxy
control script, say)."""

from __future__ import annotations

from typing import ClassVar

from deployer.config.routers import HttpChange, HttpList, Router, RouterWorker
from deployer.fleet.routers.base import Call, Listed, fill, of_urls


def _argv(call: HttpChange | HttpList | list[str] | None) -> list[str]:
    assert isinstance(call, list)  # config: an api named as a call form takes its calls in it
    return call


class CommandApi:
    name: ClassVar[str] = "command"

    def listing(self, spec: Router) -> Call:
        return _argv(spec.listing)

    def workers(self, spec: Router, answer: str) -> list[Listed]:
        return of_urls([line.strip() for line in answer.splitlines() if line.strip()])

    def remove(self, spec: Router, url: str, worker: RouterWorker, listed: Listed) -> Call:
        return [fill(arg, url, worker) for arg in _argv(spec.remove)]

    def add(self, spec: Router, url: str, worker: RouterWorker) -> Call:
        return [fill(arg, url, worker) for arg in _argv(spec.add)]
