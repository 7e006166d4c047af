"""``python -m sglang_router.launch_router --pd-disaggregation ...``: the demo PD router.

For each ``/generate`` it picks a prefill and a decode worker, adds ``bootstrap_host``,
``bootstrap_port`` and a random ``bootstrap_room`` (and a ``rid`` if missing, so that
``/abort_request {"rid"}`` reaches both sides), sends the request to both, and streams the
decode response back (asked with ``"stream": true``; otherwise it answers one JSON object, the stream's
last chunk, as SGLang does). When the client goes away it closes both upstream connections, which is
how the servers learn of the abort, as with the real router.

Endpoints: ``GET /health`` (503 until every worker answers its own /health), ``/metrics``
(router metrics only), ``/engine_metrics`` (the workers' metrics merged, with a ``worker_addr``
label), ``POST /generate``, ``POST /abort_request`` (fanned out to every worker).

The worker API is the SGLang Model Gateway's: ``GET /workers`` lists ``id``, ``url``,
``worker_type``, ``is_healthy``, ``load``; ``POST /workers`` (``{"url", "worker_type",
"bootstrap_port"}``) and ``DELETE /workers/{id}`` *queue* the change and answer 202, and it shows
in ``GET /workers`` only ``--worker-queue-delay-secs`` later, as the real gateway's job queue
does. The older ``sglang_router`` calls stay as aliases: ``POST /add_worker?url=...``,
``POST /remove_worker?url=...``, ``GET /list_workers``. A removed worker gets no new requests
(the ones it already has finish). With ``--api-key``, changing the workers needs
``Authorization: Bearer KEY`` (401 otherwise), as with the real router.
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
    LOOPBACK_HOSTS,
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


WORKER_TYPES = ("prefill", "decode")


@dataclass(frozen=True)
class Worker:
    url: str
    host: str
    port: int
    bootstrap_port: int | None = None
    worker_type: str = "decode"
    id: str = ""

    @classmethod
    def parse(cls, url: str, bootstrap_port: int | None = None, worker_type: str = "decode") -> Worker:
        """A worker from an API call: a bad one is a ValueError (400), never a router exit."""
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or parts.hostname is None or port is None:
            raise ValueError(f"worker URL {url!r}: expected http://HOST:PORT")
        if parts.hostname not in LOOPBACK_HOSTS:
            raise ValueError(f"worker {url!r}: not a loopback address; the demo stack is local-only")
        if worker_type not in WORKER_TYPES:
            raise ValueError(f"worker_type {worker_type!r}: the demo PD router takes prefill or decode")
        if bootstrap_port is not None and (isinstance(bootstrap_port, bool) or not isinstance(bootstrap_port, int)):
            raise ValueError(f"bootstrap_port {bootstrap_port!r}: expected an int")
        url = url.rstrip("/")
        # The id is stable for a URL (as the gateway's is), so a re-added worker has the same one.
        return cls(url, parts.hostname, port, bootstrap_port, worker_type, uuid.uuid5(uuid.NAMESPACE_URL, url).hex[:16])

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
    def __init__(self, workers: list[Worker], startup_timeout_s: float, queue_delay_s: float = 0.2,
                 api_key: str | None = None) -> None:
        self._lock = threading.Lock()
        self._workers = {w.id: w for w in workers}
        self._load: dict[str, int] = {}
        self.stats = RouterStats()
        self.workers_ready = False
        self.startup_timeout_s = startup_timeout_s
        self.queue_delay_s = queue_delay_s
        self.api_key = api_key

    @property
    def workers(self) -> list[Worker]:
        with self._lock:
            return list(self._workers.values())

    @property
    def prefills(self) -> list[Worker]:
        return [w for w in self.workers if w.worker_type == "prefill"]

    @property
    def decodes(self) -> list[Worker]:
        return [w for w in self.workers if w.worker_type == "decode"]

    def find(self, worker_id: str | None = None, url: str | None = None) -> Worker | None:
        found = [w for w in self.workers if w.id == worker_id or (url is not None and w.url == url.rstrip("/"))]
        return found[0] if found else None

    def queue(self, change: str, worker: Worker) -> None:
        """Apply an addition or removal later, on a timer, as the gateway's job queue does."""
        def apply() -> None:
            with self._lock:
                if change == "add":
                    self._workers[worker.id] = worker
                else:
                    self._workers.pop(worker.id, None)
            print(f"[router] worker {change}: {worker.worker_type} {worker.url}", flush=True)

        timer = threading.Timer(self.queue_delay_s, apply)
        timer.daemon = True
        timer.start()

    def listed(self) -> list[dict[str, Any]]:
        with self._lock:
            loads = dict(self._load)
        return [{"id": w.id, "url": w.url, "worker_type": w.worker_type, "is_healthy": self._worker_healthy(w),
                 "load": loads.get(w.id, 0), "bootstrap_port": w.bootstrap_port} for w in self.workers]

    def pick(self) -> tuple[Worker, Worker] | None:
        prefills, decodes = self.prefills, self.decodes
        if not prefills or not decodes:
            return None
        return random.choice(prefills), random.choice(decodes)

    def load(self, workers: tuple[Worker, ...], delta: int) -> None:
        with self._lock:
            for w in workers:
                self._load[w.id] = self._load.get(w.id, 0) + delta

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
            status, _ = _get(worker, "/health", timeout=1.0)
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
            listed = self.router.listed()
            self.send_json(200, {"workers": listed, "total": len(listed)})
        elif path.startswith("/workers/"):
            worker = self.router.find(worker_id=path[len("/workers/"):])
            if worker is None:
                self.send_json(404, {"error": f"no worker {path[len('/workers/'):]}"})
            else:
                self.send_json(200, next(w for w in self.router.listed() if w["id"] == worker.id))
        elif path == "/list_workers":
            self.send_json(200, {"urls": [w.url for w in self.router.workers]})
        else:
            self.send_json(404, {"error": f"no route {path}"})

    def _authorized(self) -> bool:
        key = self.router.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self.send_json(401, {"error": "worker management needs Authorization: Bearer <api key>"})
        return False

    def do_DELETE(self) -> None:
        path = self.path.split("?", 1)[0]
        self.router.stats.count("other")
        if not path.startswith("/workers/"):
            self.send_json(404, {"error": f"no route {path}"})
            return
        if not self._authorized():
            return
        worker = self.router.find(worker_id=path[len("/workers/"):])
        if worker is None:
            self.send_json(404, {"error": f"no worker {path[len('/workers/'):]}"})
            return
        self.router.queue("remove", worker)
        self.send_json(202, {"status": "accepted", "worker_id": worker.id, "message": "removal queued"})

    def _change_workers(self, path: str, body: dict[str, Any]) -> None:
        """POST /workers and the older /add_worker and /remove_worker: queued, 202."""
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        if not self._authorized():
            return
        if path == "/remove_worker":
            worker = self.router.find(url=query.get("url", ""))
            if worker is None:
                self.send_json(404, {"error": f"no worker {query.get('url', '')!r}"})
                return
            self.router.queue("remove", worker)
            self.send_json(202, {"status": "accepted", "worker_id": worker.id, "message": "removal queued"})
            return
        spec = body if path == "/workers" else query
        try:
            port = spec.get("bootstrap_port")
            worker = Worker.parse(str(spec.get("url", "")), int(port) if path != "/workers" and port else port,
                                  str(spec.get("worker_type", "decode")))
        except ValueError as exc:
            self.send_json(400, {"error": str(exc)})
            return
        self.router.queue("add", worker)
        self.send_json(202, {"status": "accepted", "worker_id": worker.id, "message": "registration queued"})

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
        elif path in ("/workers", "/add_worker", "/remove_worker"):
            self._change_workers(path, body)
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
        picked = router.pick()
        if picked is None:
            self.send_json(503, {"error": "no prefill or no decode worker in the router"})
            return
        prefill, decode = picked
        body.setdefault("rid", uuid.uuid4().hex)
        body["bootstrap_host"] = prefill.host
        body["bootstrap_port"] = prefill.bootstrap_port
        body["bootstrap_room"] = random.getrandbits(63)
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}

        pconn = http.client.HTTPConnection(prefill.host, prefill.port, timeout=600)
        dconn = http.client.HTTPConnection(decode.host, decode.port, timeout=600)
        finished = threading.Event()
        decoded = threading.Event()  # the decode worker's whole answer is read: its prefill is long done

        def close_upstreams() -> None:
            # A client that leaves once its answer is whole (its last chunk read) aborts nothing: the prefill's own
            # answer, which follows its KV transfer by up to a scheduler poll, is still waited for below.
            if not decoded.is_set():
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
        router.load(picked, 1)
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
                    if body.get("stream"):
                        self.start_stream(200, resp.getheader("Content-Type") or "text/event-stream")
                        streamed = True
                        while True:
                            data = resp.read1(65536)
                            if not data:
                                break
                            self.write_chunk(data)
                        decoded.set()
                        self.end_stream()
                    else:  # not asked to stream: one JSON answer, the generation's last chunk, as SGLang gives
                        answer = resp.read()
                        decoded.set()
                        self.send_json(200, _last_chunk(answer))
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
            router.load(picked, -1)
            # Anything but a fully streamed answer must look like a disconnect to both servers,
            # so that they abort instead of waiting for a client that will never read.
            if not finished.is_set() or prefill_thread.is_alive():
                close_upstreams()
            pconn.close()
            dconn.close()


def _last_chunk(stream: bytes) -> Any:
    """The last JSON chunk of a decode worker's event stream (each one holds the whole text so far)."""
    chunks = [line[len("data: "):] for line in stream.decode("utf-8", "replace").splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    if not chunks:
        raise ValueError("the decode worker streamed no chunk")
    return json.loads(chunks[-1])


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
    parser.add_argument("--worker-queue-delay-secs", type=float, default=0.2,
                        help="how long a queued worker addition or removal takes to show")
    parser.add_argument("--api-key", default=None, help="worker management needs Authorization: Bearer KEY")
    args, ignored = parser.parse_known_args(argv)
    if not args.pd_disaggregation:
        parser.error("the demo router only supports --pd-disaggregation")
    if not args.prefill or not args.decode:
        parser.error("need at least one --prefill and one --decode")
    args.ignored_args = ignored
    return args


def _worker(url: str, bootstrap_port: int | None, worker_type: str) -> Worker:
    try:
        return Worker.parse(url, bootstrap_port, worker_type)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_loopback(args.host, "--host")
    prefills = []
    for spec in args.prefill:
        if len(spec) > 2:
            raise SystemExit(f"--prefill {' '.join(spec)}: expected URL [BOOTSTRAP_PORT]")
        bport = 8998 if len(spec) == 1 or spec[1].lower() == "none" else int(spec[1])
        prefills.append(_worker(spec[0], bport, "prefill"))
    decodes = [_worker(spec[0], None, "decode") for spec in args.decode]
    router = Router(prefills + decodes, args.worker_startup_timeout_secs, args.worker_queue_delay_secs,
                    args.api_key)
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
