"""Routers whose calls are spelled out in the inventory: `api: http` (requests templated on the worker's URL; here
the demo router's older /remove_worker, /add_worker, /list_workers) and `api: command` (argv run on the router's
host; here a stand-in keeping its worker list in a file, which the demo router does not read: the calls and the
listing are tested, not traffic)."""

from __future__ import annotations

import http.client
import json
import re
import shlex
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from fixtures_repo import deployer
from test_rolling_router import (
    PdFleet,
    drained_around_restart,
    every_worker,
    make_fleet,
    pd_fleet,
    router_steps,
    transport,
)

__all__ = ["pd_fleet", "transport"]  # fixtures, used by name

OLDER_CALLS = {
    "api": "http",
    "remove": {"method": "POST", "path": "/remove_worker?url={worker}"},
    "add": {"path": "/add_worker?url={worker}&worker_type={worker_type}&bootstrap_port={bootstrap_port}"},
    "list": {"path": "/list_workers", "urls": "$.urls"},
}

# An nginx/HAProxy-style router's control as a command: its worker list is a file, one URL a line; every call is
# logged so the test sees what ran, in order.
STAND_IN = '''
import sys
from pathlib import Path
workers, log = Path(sys.argv[1]), Path(sys.argv[2])
verb, *args = sys.argv[3:]
with log.open("a") as out:
    out.write(" ".join([verb, *args]) + "\\n")
listed = [line for line in workers.read_text().splitlines() if line]
if verb == "list":
    print("\\n".join(listed))
elif verb == "remove":
    workers.write_text("".join(f"{u}\\n" for u in listed if u != args[0]))
elif verb == "add":
    workers.write_text("".join(f"{u}\\n" for u in [*listed, args[0]]))
else:
    sys.exit(f"no such verb: {verb}")
'''


def restart_pd1(fleet: PdFleet) -> list[str]:
    """`deployer restart --host pd-1`: the router steps of its run log (unit pd-2 serves meanwhile)."""
    before = fleet.pids()
    result = deployer("restart", "--host", "pd-1", "--json", cwd=fleet.root)
    assert result.returncode == 0, result.stdout + result.stderr
    after = fleet.pids()
    assert after["gpu-a"]["prefill"] != before["gpu-a"]["prefill"] and after["gpu-b"] != before["gpu-b"]
    assert after["gpu-c"] == before["gpu-c"] and after["gpu-d"] == before["gpu-d"]
    return router_steps(fleet, json.loads(result.stdout)["hosts"]["gpu-a"]["run_id"])


def get(fleet: PdFleet, path: str) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", fleet.router_port, timeout=10)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def test_a_router_spelled_out_as_http_requests_takes_a_unit_out_and_puts_it_back(pd_fleet: PdFleet) -> None:
    pd_fleet.inventory["routers"]["pd-router"].update(OLDER_CALLS)
    pd_fleet.write()
    assert drained_around_restart(restart_pd1(pd_fleet))
    assert set(get(pd_fleet, "/list_workers")["urls"]) == every_worker(pd_fleet)
    workers = get(pd_fleet, "/workers")["workers"]
    prefill = next(w for w in workers if w["url"] == pd_fleet.worker_url("gpu-a", "prefill"))
    # {worker_type} and {bootstrap_port} filled in from the unit's `workers:`
    assert prefill["worker_type"] == "prefill" and prefill["bootstrap_port"] == pd_fleet.stacks["gpu-a"].ports[
        "bootstrap"]


def command_router(fleet: PdFleet, remove_verb: str = "remove") -> tuple[Path, Path]:
    """api command over the stand-in, its list holding every worker: (its worker list, its log of calls)."""
    root = fleet.root
    (root / "stand_in.py").write_text(STAND_IN)
    workers, log = root / "workers.txt", root / "calls.log"
    workers.write_text("".join(f"{url}\n" for url in sorted(every_worker(fleet))))
    log.write_text("")
    base = [sys.executable, str(root / "stand_in.py"), str(workers), str(log)]
    fleet.inventory["routers"]["pd-router"].update(
        api="command", remove=[*base, remove_verb, "{worker}"], add=[*base, "add", "{worker}"], list=[*base, "list"])
    fleet.write()
    return workers, log


@pytest.mark.parametrize("transport", ["local", "ssh"], indirect=True)
def test_a_router_spelled_out_as_commands_runs_them_on_its_host_around_the_restart(pd_fleet: PdFleet) -> None:
    workers, log = command_router(pd_fleet)
    assert drained_around_restart(restart_pd1(pd_fleet))
    assert set(workers.read_text().split()) == every_worker(pd_fleet)
    prefill, decode = pd_fleet.worker_url("gpu-a", "prefill"), pd_fleet.worker_url("gpu-b", "decode")
    calls = [line for line in log.read_text().splitlines() if line != "list"]
    assert calls == [f"remove {prefill}", f"remove {decode}", f"add {prefill}", f"add {decode}"], calls


def test_a_command_router_refusing_the_removal_fails_the_restart_naming_the_command_and_what_it_said(
        pd_fleet: PdFleet) -> None:
    workers, log = command_router(pd_fleet, remove_verb="drop")  # the stand-in knows no `drop`: exit 1
    listed, before = workers.read_text(), pd_fleet.pids()
    result = deployer("restart", "--host", "pd-1", cwd=pd_fleet.root)
    assert result.returncode == 5, result.stdout + result.stderr
    prefill = pd_fleet.worker_url("gpu-a", "prefill")
    argv = shlex.join([sys.executable, str(pd_fleet.root / "stand_in.py"), str(workers), str(log), "drop", prefill])
    output = " ".join((result.stdout + result.stderr).split())  # the message may be wrapped on screen
    assert f"refused the removal of worker {prefill} (gpu-a:prefill): `{argv}` exit 1: 'no such verb: drop'" \
        in output, output
    assert pd_fleet.pids() == before  # nothing restarted
    assert workers.read_text() == listed


def test_a_router_call_naming_an_unknown_placeholder_is_refused_at_load_with_file_line_and_field(
        tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)  # nothing started: the inventory is refused before any host connects
    fleet.inventory["routers"]["pd-router"].update(
        api="http", remove={"path": "/remove_worker?url={url}"},
        add={"path": "/add_worker", "body": {"url": "{worker}", "labels": [1, {"role": "{role}"}]}},
        list={"path": "/list_workers?for={worker}"})
    fleet.write()
    result = deployer("plan", "note.yaml", "--host", "pd-1", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.search(r"hosts\.yaml:\d+:\d+: routers\.pd-router\.remove\.path: '/remove_worker\?url=\{url\}': "
                     r"unknown placeholder \{url\} \(known: \{worker\}, \{worker_type\}, \{bootstrap_port\}\)",
                     result.stderr), result.stderr
    # in a body, only its strings are templates: the one at fault is named by its place in the body
    assert re.search(r"hosts\.yaml:\d+:\d+: routers\.pd-router\.add\.body: body\.labels\[1\]\.role: '\{role\}': "
                     r"unknown placeholder \{role\}", result.stderr), result.stderr
    assert re.search(r"hosts\.yaml:\d+:\d+: routers\.pd-router\.list\.path: .*unknown placeholder \{worker\} "
                     r"\(a list call takes none", result.stderr), result.stderr


class Pool(BaseHTTPRequestHandler):
    """A router whose worker API is neither SGLang's: `GET /pool` lists `{"pool": [{"url"}]}`, `DELETE
    /pool/URL` (the URL one percent-encoded path segment) takes a worker out, `PUT /pool` (the URL in its JSON
    body) puts it back. Every request line and body is recorded as it came off the wire."""

    server: PoolServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.requestline, raw.decode()))
        return json.loads(raw) if raw else None

    def do_GET(self) -> None:
        self._body()
        self._answer(200, {"pool": [{"url": url} for url in sorted(self.server.workers)]})

    def do_DELETE(self) -> None:
        self._body()
        segment = urlsplit(self.path).path.removeprefix("/pool/")
        if "/" in segment:  # an unquoted URL would be several segments: no such route
            return self._answer(404, {"error": f"no route {self.path}"})
        self.server.workers.discard(unquote(segment))
        self._answer(200, {})

    def do_PUT(self) -> None:
        body = self._body()
        self.server.workers.add(body["url"])
        self._answer(200, {})


class PoolServer(ThreadingHTTPServer):
    def __init__(self, workers: set[str]) -> None:
        super().__init__(("127.0.0.1", 0), Pool)
        self.workers, self.seen = workers, list[tuple[str, str]]()


@contextmanager
def pool_router(fleet: PdFleet) -> Iterator[PoolServer]:
    """The Pool router on gpu-a's loopback listing every worker, as the fleet's router (its traffic still goes
    through the demo router: only the calls are tested)."""
    server = PoolServer(every_worker(fleet))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


TYPED_BODY = {"url": "{worker}", "labels": {"role": "{worker_type}", "zone": "a"}, "weight": 2, "enabled": True,
              "drain": None, "also": ["{worker}", 1.5, False]}


def test_an_http_router_gets_the_worker_url_quoted_in_its_path_and_query_and_raw_in_a_typed_json_body(
        pd_fleet: PdFleet) -> None:
    with pool_router(pd_fleet) as pool:
        pd_fleet.inventory["routers"]["pd-router"].update(
            url=f"http://127.0.0.1:{pool.server_address[1]}", api="http",
            remove={"method": "DELETE", "path": "/pool/{worker}?type={worker_type}"},
            add={"method": "PUT", "path": "/pool?for={worker}", "body": TYPED_BODY},
            list={"path": "/pool", "urls": "$.pool[*].url"})
        pd_fleet.write()
        assert drained_around_restart(restart_pd1(pd_fleet))
        assert pool.workers == every_worker(pd_fleet)
    prefill = pd_fleet.worker_url("gpu-a", "prefill")
    quoted = prefill.replace(":", "%3A").replace("/", "%2F")  # http%3A%2F%2F127.0.0.1%3APORT
    changes = [seen for seen in pool.seen if not seen[0].startswith("GET ")]
    assert changes[0] == (f"DELETE /pool/{quoted}?type=prefill HTTP/1.1", ""), changes
    line, body = changes[2]
    assert line == f"PUT /pool?for={quoted} HTTP/1.1", changes
    assert json.loads(body) == {"url": prefill, "labels": {"role": "prefill", "zone": "a"}, "weight": 2,
                                "enabled": True, "drain": None, "also": [prefill, 1.5, False]}, body


def test_the_registry_holds_exactly_the_four_apis_the_inventory_may_name() -> None:
    from typing import get_args

    from deployer.config.routers import Router
    from deployer.fleet.routers import APIS

    assert list(APIS) == ["sglang-gateway", "sglang-router", "http", "command"]
    assert set(get_args(Router.model_fields["api"].annotation)) == set(APIS)


def test_only_its_adapter_names_an_sglang_api_and_nothing_outside_the_adapters_branches_on_a_router_api() -> None:
    """An API's calls live in its module of fleet/routers/: its name is written there (and in the schema's list,
    config/routers.py, held to the registry above), and no code elsewhere compares an `api` with one."""
    import ast

    from deployer.fleet.routers import APIS

    package = Path(__file__).resolve().parents[2] / "deployer"
    schema, adapters = package / "config" / "routers.py", package / "fleet" / "routers"
    named, branches = [], []
    for path in package.rglob("*.py"):
        if "demo/stack" in path.as_posix():
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in ("sglang-gateway", "sglang-router") and \
                    path not in (schema, adapters / (node.value.replace("-", "_") + ".py")):
                named.append(f"{path}:{node.lineno}: {node.value}")
            if isinstance(node, ast.Compare) and path.parent != adapters:
                operands = [node.left, *node.comparators]
                by_api = any((isinstance(o, ast.Name) and o.id == "api")
                             or (isinstance(o, ast.Attribute) and o.attr == "api") for o in operands)
                constants = {c.value for o in operands for c in ast.walk(o) if isinstance(c, ast.Constant)}
                if by_api and constants & set(APIS):
                    branches.append(f"{path}:{node.lineno}")
    assert named == [] and branches == [], (named, branches)


def adapter_calls(api: str, **calls: Any) -> tuple[Any, Any, Any, Any]:
    """What the adapter of api sends to list, take out (the router listing the worker as id w-7) and put back a
    prefill worker at http://127.0.0.1:30001 with bootstrap port 8998."""
    from deployer.config.routers import Router, RouterWorker
    from deployer.fleet.routers import api_of
    from deployer.fleet.routers.base import Listed

    spec = Router.model_validate({"host": "gpu-a", "url": "http://127.0.0.1:30000", "api": api, **calls})
    worker = RouterWorker(service="gpu-a:prefill", worker_type="prefill", bootstrap_port=8998)
    url, adapter = "http://127.0.0.1:30001", api_of(spec)
    return (adapter.listing(spec), adapter.remove(spec, url, worker, Listed("w-7", url, "prefill", True)),
            adapter.add(spec, url, worker), adapter)


def test_each_adapter_says_what_it_sends_to_list_take_out_and_put_back_a_worker() -> None:
    from deployer.config.routers import Router
    from deployer.fleet.routers.base import Listed, Request

    url, quoted = "http://127.0.0.1:30001", "http%3A%2F%2F127.0.0.1%3A30001"
    listing, remove, add, gateway = adapter_calls("sglang-gateway")
    assert (listing, remove) == (Request("GET", "/workers"), Request("DELETE", "/workers/w-7"))
    assert add == Request("POST", "/workers", {"url": url, "worker_type": "prefill", "bootstrap_port": 8998})
    spec = Router(host="gpu-a", url="http://127.0.0.1:30000")
    assert gateway.workers(spec, json.dumps({"workers": [
        {"id": "w-7", "url": url + "/", "worker_type": "prefill", "is_healthy": False}]})) == [
        Listed("w-7", url, "prefill", False)]

    listing, remove, add, older = adapter_calls("sglang-router")
    assert (listing, remove) == (Request("GET", "/list_workers"), Request("POST", f"/remove_worker?url={quoted}"))
    assert add == Request("POST", f"/add_worker?url={quoted}&worker_type=prefill&bootstrap_port=8998")
    assert older.workers(spec, json.dumps({"urls": [url]})) == [Listed(url, url, "", True)]

    put = {"method": "PUT", "path": "/in/{worker}", "body": {"to": ["{worker}", 1]}}
    listing, remove, add, _ = adapter_calls("http", remove=OLDER_CALLS["remove"], list=OLDER_CALLS["list"], add=put)
    assert (listing, remove) == (Request("GET", "/list_workers"), Request("POST", f"/remove_worker?url={quoted}"))
    assert add == Request("PUT", f"/in/{quoted}", {"to": [url, 1]})

    listing, remove, add, command = adapter_calls(
        "command", remove=["ctl", "out", "{worker}"], add=["ctl", "in", "{worker}", "{worker_type}:{bootstrap_port}"],
        list=["ctl", "ls"])
    assert (listing, remove, add) == (["ctl", "ls"], ["ctl", "out", url], ["ctl", "in", url, "prefill:8998"])
    assert command.workers(spec, f" {url}\n\n") == [Listed(url, url, "", True)]
