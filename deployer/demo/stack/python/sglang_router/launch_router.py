"""``python -m sglang_router.launch_router --pd-disaggregation ...``: the demo PD router.

For each ``/generate`` it picks a prefill and a decode worker, adds ``bootstrap_host``,
``bootstrap_port`` and a random ``bootstrap_room`` (and a ``rid`` if missing, so that
``/abort_request {"rid"}`` reaches both sides), sends the request to both, and streams the
decode response back. When the client goes away it closes both upstream connections, which is
how the servers learn of the abort, as with the real router.

Endpoints: ``GET /health`` (503 until every worker answers its own /health), ``/metrics``
(router metrics only), ``/engine_metrics`` (the workers' metrics merged, with a ``worker_addr``
label), ``POST /generate``, ``POST /abort_request`` (fanned out to every worker).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

from sglang.srt.demo_http import (
    PROMETHEUS_CONTENT_TYPE,
    DemoHTTPServer,
    DisconnectWatch,
    JSONHandler,
    StopFlag,
    format_labels,
    install_stop_signals,
    render_family,
    require_loopback,
    serve_in_background,
    shutdown_servers,
    shutdown_socket,
)

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Worker:
    url: str
    host: str
    port: int
    bootstrap_port: int | None = None

    @classmethod
    def parse(cls, url: str, bootstrap_port: int | None = None) -> Worker:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise SystemExit(f"worker URL {url!r}: expected http://HOST:PORT")
        require_loopback(parts.hostname, f"worker {url}")
        return cls(url.rstrip("/"), parts.hostname, parts.port, bootstrap_port)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


class RouterStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.active = 0
        self.client_disconnects = 0
        self.upstream_errors = 0

    def count(self, route: str) -> None:
        with self._lock:
            self.requests[route] = self.requests.get(route, 0) + 1

    def add(self, field: str, delta: int) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + delta)


class Router:
    def __init__(self, prefills: list[Worker], decodes: list[Worker], startup_timeout_s: float) -> None:
        self.prefills = prefills
        self.decodes = decodes
        self.stats = RouterStats()
        self.workers_ready = False
        self.startup_timeout_s = startup_timeout_s

    @property
    def workers(self) -> list[Worker]:
        return self.prefills + self.decodes

    def wait_for_workers(self, stop: StopFlag) -> None:
        """Like the real router: not ready until every worker is healthy."""
        deadline = time.monotonic() + self.startup_timeout_s
        while not stop.requested and time.monotonic() < deadline:
            if all(self._worker_healthy(w) for w in self.workers):
                self.workers_ready = True
                print("[router] all workers healthy; router ready", flush=True)
                return
            time.sleep(0.1)
        if not stop.requested:
            print("[router] workers did not become healthy in time", file=sys.stderr, flush=True)

    @staticmethod
    def _worker_healthy(worker: Worker) -> bool:
        try:
            status, _ = _get(worker, "/health", timeout=2.0)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    def render_metrics(self) -> str:
        s = self.stats
        with s._lock:
            requests = dict(s.requests)
            active, disconnects, errors = s.active, s.client_disconnects, s.upstream_errors
        return "".join(
            [
                render_family(
                    "sgl_router_requests_total",
                    "counter",
                    "Requests received by the router, by route.",
                    [("sgl_router_requests_total", {"route": r}, float(n)) for r, n in sorted(requests.items())],
                ),
                render_family(
                    "sgl_router_active_requests",
                    "gauge",
                    "Generate requests currently being proxied.",
                    [("sgl_router_active_requests", {}, float(active))],
                ),
                render_family(
                    "sgl_router_client_disconnects_total",
                    "counter",
                    "Generate requests whose client went away before the end of the stream.",
                    [("sgl_router_client_disconnects_total", {}, float(disconnects))],
                ),
                render_family(
                    "sgl_router_upstream_errors_total",
                    "counter",
                    "Generate requests that failed on a worker connection.",
                    [("sgl_router_upstream_errors_total", {}, float(errors))],
                ),
                render_family(
                    "sgl_router_active_workers",
                    "gauge",
                    "Workers known to the router, by role.",
                    [
                        ("sgl_router_active_workers", {"role": "prefill"}, float(len(self.prefills))),
                        ("sgl_router_active_workers", {"role": "decode"}, float(len(self.decodes))),
                    ],
                ),
            ]
        )

    def engine_metrics(self) -> str:
        """Every worker's /metrics, merged by family, each sample labelled with its worker."""
        helps: dict[str, str] = {}
        types: dict[str, str] = {}
        samples: dict[str, list[str]] = {}
        order: list[str] = []
        for worker in self.workers:
            try:
                status, body = _get(worker, "/metrics", timeout=2.0)
            except (OSError, http.client.HTTPException):
                continue
            if status != 200:
                continue
            family = ""
            for line in body.decode("utf-8", "replace").splitlines():
                if line.startswith("# HELP ") or line.startswith("# TYPE "):
                    _, kind, name, rest = ([*line.split(" ", 3), ""])[:4]
                    family = name
                    if family not in samples:
                        samples[family] = []
                        order.append(family)
                    (helps if kind == "HELP" else types).setdefault(family, rest)
                    continue
                match = _SAMPLE_RE.match(line.strip())
                if not match:
                    continue
                name, _, label_text, value = match.group(1), match.group(2), match.group(3), match.group(4)
                labels = {k: _unescape(v) for k, v in _LABEL_RE.findall(label_text or "")}
                labels["worker_addr"] = worker.addr
                key = family if family and name.startswith(family) else name
                if key not in samples:
                    samples[key] = []
                    order.append(key)
                samples[key].append(f"{name}{format_labels(labels)} {value}")
        out: list[str] = []
        for family in order:
            if family in helps:
                out.append(f"# HELP {family} {helps[family]}")
            if family in types:
                out.append(f"# TYPE {family} {types[family]}")
            out.extend(samples[family])
        return "\n".join(out) + "\n" if out else ""


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def _get(worker: Worker, path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(worker.host, worker.port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _post(worker: Worker, path: str, payload: bytes, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(worker.host, worker.port, timeout=timeout)
    try:
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class RouterHandler(JSONHandler):
    server_version = "sglang-router-demo"

    @property
    def router(self) -> Router:
        router: Router = self.server.app  # type: ignore[attr-defined]
        return router

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.router.stats.count(path if path in ("/health", "/metrics", "/engine_metrics") else "other")
        if path in ("/health", "/readiness", "/liveness"):
            if self.router.workers_ready or path == "/liveness":
                self.send_text(200, "OK")
            else:
                self.send_text(503, "waiting for workers")
        elif path == "/metrics":
            self.send_text(200, self.router.render_metrics(), PROMETHEUS_CONTENT_TYPE)
        elif path == "/engine_metrics":
            self.send_text(200, self.router.engine_metrics(), PROMETHEUS_CONTENT_TYPE)
        elif path == "/workers":
            self.send_json(
                200,
                {
                    "prefill": [{"url": w.url, "bootstrap_port": w.bootstrap_port} for w in self.router.prefills],
                    "decode": [{"url": w.url} for w in self.router.decodes],
                },
            )
        else:
            self.send_json(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        self.router.stats.count(path if path in ("/generate", "/abort_request") else "other")
        try:
            body = self.read_json()
        except ValueError as exc:
            self.send_json(400, {"error": f"bad JSON: {exc}"})
            return
        if path == "/generate":
            self._generate(body)
        elif path == "/abort_request":
            payload = json.dumps(body).encode()
            results = {}
            for worker in self.router.workers:
                try:
                    status, _ = _post(worker, "/abort_request", payload, timeout=5.0)
                except (OSError, http.client.HTTPException) as exc:
                    results[worker.addr] = f"error: {exc}"
                else:
                    results[worker.addr] = str(status)
            self.send_json(200, {"success": True, "workers": results})
        else:
            self.send_json(404, {"error": f"no route {path}"})

    def _generate(self, body: dict[str, Any]) -> None:
        router = self.router
        prefill = random.choice(router.prefills)
        decode = random.choice(router.decodes)
        body.setdefault("rid", uuid.uuid4().hex)
        body["bootstrap_host"] = prefill.host
        body["bootstrap_port"] = prefill.bootstrap_port
        body["bootstrap_room"] = random.getrandbits(63)
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}

        pconn = http.client.HTTPConnection(prefill.host, prefill.port, timeout=600)
        dconn = http.client.HTTPConnection(decode.host, decode.port, timeout=600)
        finished = threading.Event()

        def close_upstreams() -> None:
            shutdown_socket(pconn.sock)
            shutdown_socket(dconn.sock)

        def prefill_call() -> None:
            try:
                pconn.request("POST", "/generate", body=payload, headers=headers)
                pconn.getresponse().read()
            except (OSError, http.client.HTTPException, ValueError):
                pass

        prefill_thread = threading.Thread(target=prefill_call, name="router-prefill", daemon=True)
        router.stats.add("active", 1)
        streamed = False
        try:
            # Connect both before anything else, so that a disconnect seen by the watch always
            # has sockets to shut down.
            pconn.connect()
            dconn.connect()
            with DisconnectWatch(self.connection, close_upstreams) as watch:
                prefill_thread.start()
                try:
                    dconn.request("POST", "/generate", body=payload, headers=headers)
                    resp = dconn.getresponse()
                    if resp.status != 200:
                        self.send_bytes(resp.status, resp.read(), resp.getheader("Content-Type") or "application/json")
                        return
                    self.start_stream(200, resp.getheader("Content-Type") or "text/event-stream")
                    streamed = True
                    while True:
                        data = resp.read1(65536)
                        if not data:
                            break
                        self.write_chunk(data)
                    self.end_stream()
                    finished.set()
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    if watch.gone.is_set() or (isinstance(exc, (BrokenPipeError, ConnectionResetError)) and streamed):
                        router.stats.add("client_disconnects", 1)
                    else:
                        router.stats.add("upstream_errors", 1)
                        if not streamed:
                            self.send_json(502, {"error": f"decode worker failed: {exc}"})
                            return
                    self.abandon()
                if finished.is_set():
                    # The prefill answer follows the KV transfer it already finished; give it a
                    # moment so that a completed request is not reported to prefill as an abort.
                    prefill_thread.join(timeout=2.0)
        except OSError as exc:
            router.stats.add("upstream_errors", 1)
            self.send_json(502, {"error": f"worker connection failed: {exc}"})
        finally:
            router.stats.add("active", -1)
            # Anything but a fully streamed answer must look like a disconnect to both servers,
            # so that they abort instead of waiting for a client that will never read.
            if not finished.is_set() or prefill_thread.is_alive():
                close_upstreams()
            pconn.close()
            dconn.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sglang_router.launch_router")
    parser.add_argument("--pd-disaggregation", action="store_true")
    parser.add_argument(
        "--prefill", nargs="+", action="append", default=[], metavar=("URL", "BOOTSTRAP_PORT"),
        help="prefill worker URL and its bootstrap port (repeatable)",
    )
    parser.add_argument("--decode", nargs=1, action="append", default=[], metavar="URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--worker-startup-timeout-secs", type=float, default=600.0)
    args, ignored = parser.parse_known_args(argv)
    if not args.pd_disaggregation:
        parser.error("the demo router only supports --pd-disaggregation")
    if not args.prefill or not args.decode:
        parser.error("need at least one --prefill and one --decode")
    args.ignored_args = ignored
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_loopback(args.host, "--host")
    prefills = []
    for spec in args.prefill:
        if len(spec) > 2:
            raise SystemExit(f"--prefill {' '.join(spec)}: expected URL [BOOTSTRAP_PORT]")
        bport = 8998 if len(spec) == 1 or spec[1].lower() == "none" else int(spec[1])
        prefills.append(Worker.parse(spec[0], bport))
    decodes = [Worker.parse(spec[0]) for spec in args.decode]
    router = Router(prefills, decodes, args.worker_startup_timeout_secs)
    stop = install_stop_signals()
    try:
        server = DemoHTTPServer(args.host, args.port, RouterHandler, router)
    except OSError as exc:
        print(f"[router] cannot bind: {exc}", file=sys.stderr, flush=True)
        return 1
    serve_in_background(server)
    print(
        f"[router] demo PD router listening on http://{args.host}:{args.port} "
        f"prefill={[w.url for w in prefills]} decode={[w.url for w in decodes]}",
        flush=True,
    )
    threading.Thread(target=router.wait_for_workers, args=(stop,), name="worker-wait", daemon=True).start()
    stop.wait()
    print("[router] stopping", flush=True)
    shutdown_servers([server])
    return 0


if __name__ == "__main__":
    sys.exit(main())
