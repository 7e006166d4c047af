"""The older sglang-router: GET /list_workers lists the worker URLs ({"urls": [...]}), POST
/remove_worker?url= takes one out and POST /add_worker?url=&worker_type= (and a prefill's bootstrap_port) puts it
back."""

from __future__ import annotations

import json
from typing import ClassVar
from urllib.parse import quote

from deployer.config.routers import Router, RouterWorker
from deployer.fleet.routers.base import Call, Listed, Request, of_urls, urls_at


class SglangRouter:
    name: ClassVar[str] = "sglang-router"

    def listing(self, spec: Router) -> Call:
        return Request("GET", "/list_workers")

    def workers(self, spec: Router, answer: str) -> list[Listed]:
        return of_urls(urls_at(json.loads(answer), "$.urls"))

    def remove(self, spec: Router, url: str, worker: RouterWorker, listed: Listed) -> Call:
        return Request("POST", f"/remove_worker?url={quote(url, safe='')}")

    def add(self, spec: Router, url: str, worker: RouterWorker) -> Call:
        query = f"url={quote(url, safe='')}&worker_type={worker.worker_type}"
        if worker.bootstrap_port is not None:
            query += f"&bootstrap_port={worker.bootstrap_port}"
        return Request("POST", f"/add_worker?{query}")
