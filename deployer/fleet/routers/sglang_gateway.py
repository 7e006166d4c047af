"""SGLang's model gateway: GET /workers lists {id, url, worker_type, is_healthy} entries, DELETE /workers/{id}
takes a worker out and POST /workers puts it back (both queued: the router answers 202 and shows the change in
its list later)."""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import quote

from deployer.config.routers import Router, RouterWorker
from deployer.fleet.routers.base import Call, Listed, Request, listed


class SglangGateway:
    name: ClassVar[str] = "sglang-gateway"

    def listing(self, spec: Router) -> Call:
        return Request("GET", "/workers")

    def workers(self, spec: Router, answer: str) -> list[Listed]:
        return listed(json.loads(answer)["workers"])

    def remove(self, spec: Router, url: str, worker: RouterWorker, listed: Listed) -> Call:
        return Request("DELETE", f"/workers/{quote(listed.id, safe='')}")  # the id the gateway gave it

    def add(self, spec: Router, url: str, worker: RouterWorker) -> Call:
        body: dict[str, Any] = {"url": url, "worker_type": worker.worker_type}
        if worker.bootstrap_port is not None:
            body["bootstrap_port"] = worker.bootstrap_port
        return Request("POST", "/workers", body)
