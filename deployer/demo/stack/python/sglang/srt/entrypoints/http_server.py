"""HTTP endpoints of the demo prefill and decode servers, and their lifecycle.

Endpoints (both modes): ``GET /health`` ``/health_generate`` ``/ready`` (503 while warming up),
``/model_info`` ``/server_info`` (and the older ``/get_model_info`` ``/get_server_info``),
``/metrics`` (with ``--enable-metrics``), ``POST /generate``, ``POST /abort_request``, and the OpenAI-compatible
``POST /v1/completions`` ``/v1/chat/completions`` (demo_openai).
The prefill server also listens on its bootstrap port for the decode side:
``POST /kv/register`` ``/kv/poll`` ``/kv/abort``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import uuid
from dataclasses import asdict
from typing import Any

from sglang.srt import demo_generate, demo_openai, demo_ranks
from sglang.srt.demo_http import (
    PROMETHEUS_CONTENT_TYPE,
    DemoHTTPServer,
    JSONHandler,
    client_gone,
    install_stop_signals,
    render_family,
    require_loopback,
    serve_in_background,
    shutdown_servers,
    stream_tokens,
)
from sglang.srt.demo_knobs import Knobs
from sglang.srt.demo_latency import TTFT_BUCKETS, Latencies
from sglang.srt.disaggregation.base.conn import KVPoll, poll_name
from sglang.srt.disaggregation.common.conn import TransferInfo
from sglang.srt.disaggregation.decode import BootstrapClient, DecodeReq, DecodeRequests
from sglang.srt.disaggregation.nixl.conn import NixlKVManager
from sglang.srt.disaggregation.prefill import PrefillScheduler
from sglang.srt.managers.scheduler import fork_scheduler

GAUGE_HELP = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
    "sglang:num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "sglang:num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "sglang:num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
}
MAX_NEW_TOKENS_CAP = 4096


class BadRequest(Exception):
    pass


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class BaseApp:
    engine_type = "unified"

    def __init__(self, args: argparse.Namespace, knobs: Knobs) -> None:
        self.args = args
        self.knobs = knobs
        self.model_name = str(args.served_model_name or args.model_path)
        self.ready = False
        self.started_at = time.time()
        self.streams = demo_openai.StreamStats()
        self.latencies = Latencies(knobs, tuple(sorted(args.bucket_time_to_first_token or ())) or TTFT_BUCKETS)

    # --- lifecycle ----------------------------------------------------------------------
    def start_engine(self) -> None:
        pass

    def stop_engine(self) -> None:
        pass

    def healthy(self) -> bool:
        return self.ready

    # --- metrics ------------------------------------------------------------------------
    def gauges(self) -> dict[str, float]:
        raise NotImplementedError

    def render_metrics(self) -> str:
        labels = {
            "engine_type": self.engine_type,
            "model_name": self.model_name,
            "moe_ep_rank": "0",
            "pp_rank": "0",
            "tp_rank": "0",
        }
        parts = [
            render_family(name, "gauge", GAUGE_HELP[name], [(name, labels, value)])
            for name, value in self.gauges().items()
        ]
        return "".join(parts) + self.latencies.render(labels)

    def server_info(self) -> dict[str, Any]:
        return {
            "version": "0.0.0+demo",
            "disaggregation_mode": self.args.disaggregation_mode,
            "model_path": self.args.model_path,
            "host": self.args.host,
            "port": self.args.port,
            "enable_metrics": self.args.enable_metrics,
            "demo_knobs": asdict(self.knobs),
            "streams": dict(self.streams.counts),
        }

    # --- requests -----------------------------------------------------------------------
    def generate(self, handler: JSONHandler, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def abort_rid(self, rid: str) -> int:
        raise NotImplementedError

    def abort_all(self) -> int:
        raise NotImplementedError


def _room_of(body: dict[str, Any]) -> int:
    room = body.get("bootstrap_room")
    if isinstance(room, bool) or not isinstance(room, int):
        raise BadRequest("bootstrap_room (int) is required in disaggregation mode")
    return room


def _input_len(body: dict[str, Any]) -> int:
    ids = body.get("input_ids")
    if isinstance(ids, list):
        return len(ids)
    return max(1, len(str(body.get("text") or "").split()))


class PrefillApp(BaseApp):
    engine_type = "prefill"

    def __init__(self, args: argparse.Namespace, knobs: Knobs) -> None:
        super().__init__(args, knobs)
        self.manager = NixlKVManager(
            num_workers=knobs.kv_workers,
            num_chunks=knobs.kv_chunks,
            chunk_s=knobs.kv_chunk_s,
            race_delay_s=knobs.race_delay_s,
        )
        self.scheduler = PrefillScheduler(self.manager, knobs)

    def start_engine(self) -> None:
        self.manager.start()
        self.scheduler.start()

    def stop_engine(self) -> None:
        self.scheduler.stop()
        self.manager.stop()

    def healthy(self) -> bool:
        return self.ready and self.scheduler.alive() and self.manager.workers_alive()

    def gauges(self) -> dict[str, float]:
        sizes = self.scheduler.queue_sizes()
        return {
            "sglang:num_running_reqs": float(sizes["running"]),
            "sglang:num_queue_reqs": float(sizes["waiting"]),
            "sglang:num_prefill_bootstrap_queue_reqs": float(sizes["bootstrap"]),
            "sglang:num_prefill_inflight_queue_reqs": float(sizes["inflight"]),
        }

    def server_info(self) -> dict[str, Any]:
        info = super().server_info()
        info["disaggregation_bootstrap_port"] = self.args.disaggregation_bootstrap_port
        info["room_status_counts"] = {
            poll_name(k): v for k, v in sorted(self.manager.status_counts().items())
        }
        info["kv_chunks_sent"] = self.manager.chunks_sent
        info["kv_chunks_skipped"] = self.manager.chunks_skipped
        info["finished"] = {poll_name(k): v for k, v in self.scheduler.finished.items()}
        info["queues"] = self.scheduler.queue_sizes()
        return info

    def generate(self, handler: JSONHandler, body: dict[str, Any]) -> None:
        room = _room_of(body)
        rid = str(body.get("rid") or uuid.uuid4().hex)
        input_len = _input_len(body)
        timing = self.latencies.request()
        time.sleep(timing.first_wait_s)  # the time to first token stands in for the forward pass under load
        req = self.scheduler.submit(rid, room, input_len)
        sock = handler.connection
        while not req.done.wait(0.02):
            if client_gone(sock):
                self.scheduler.abort(req, "client disconnected")
                timing.finish(completed=False)
                handler.abandon()
                return
        if req.final_status == KVPoll.Success:
            timing.token()  # its one token: the KV is on its way to the decode server
            finish: dict[str, Any] = {"type": "length", "length": 1}
        else:
            finish = {"type": "abort", "message": req.abort_reason or "KV transfer failed"}
        timing.finish(completed=req.final_status == KVPoll.Success)
        handler.send_json(
            200,
            {
                "text": "",
                "meta_info": {
                    "id": rid,
                    "bootstrap_room": room,
                    "prompt_tokens": input_len,
                    "completion_tokens": 1 if req.final_status == KVPoll.Success else 0,
                    "finish_reason": finish,
                },
            },
        )

    def abort_rid(self, rid: str) -> int:
        return self.scheduler.abort_rid(rid, "aborted by /abort_request")

    def abort_all(self) -> int:
        return self.scheduler.abort_all("aborted by /abort_request abort_all")

    # --- bootstrap server (decode side talks to this) ------------------------------------
    def bootstrap_post(self, handler: JSONHandler, path: str, body: dict[str, Any]) -> None:
        room = body.get("room")
        if isinstance(room, bool) or not isinstance(room, int):
            handler.send_json(400, {"error": "room (int) is required"})
            return
        if path == "/kv/register":
            decode_id = str(body.get("decode_id") or "decode")
            self.manager.add_transfer_info(TransferInfo(room, decode_id, time.time()))
            handler.send_json(200, {"ok": True})
        elif path == "/kv/poll":
            try:
                timeout = min(max(float(body.get("timeout") or 0.5), 0.0), 5.0)
            except (TypeError, ValueError):
                handler.send_json(400, {"error": "timeout must be a number"})
                return
            status = self.manager.wait_status(room, timeout)
            handler.send_json(200, {"status": status, "name": poll_name(status)})
        elif path == "/kv/abort":
            self.manager.abort(room)
            handler.send_json(200, {"ok": True})
        else:
            handler.send_json(404, {"error": f"no route {path}"})


class DecodeApp(BaseApp):
    engine_type = "decode"

    def __init__(self, args: argparse.Namespace, knobs: Knobs) -> None:
        super().__init__(args, knobs)
        self.requests = DecodeRequests()
        self.decode_id = f"{args.host}:{args.port}"

    def gauges(self) -> dict[str, float]:
        counts = self.requests.stage_counts()
        return {
            "sglang:num_running_reqs": float(counts["running"]),
            "sglang:num_queue_reqs": float(counts["queue"]),
            "sglang:num_decode_prealloc_queue_reqs": float(counts["prealloc"]),
            "sglang:num_decode_transfer_queue_reqs": float(counts["transfer"]),
        }

    def abort_rid(self, rid: str) -> int:
        return self.requests.abort_rid(rid, "aborted by /abort_request")

    def abort_all(self) -> int:
        return self.requests.abort_all("aborted by /abort_request abort_all")

    def generate(self, handler: JSONHandler, body: dict[str, Any]) -> None:
        room = _room_of(body)
        host = str(body.get("bootstrap_host") or "127.0.0.1")
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise BadRequest(f"bootstrap_host {host!r} is not loopback; the demo is local-only")
        port = body.get("bootstrap_port")
        if isinstance(port, bool) or not isinstance(port, int):
            raise BadRequest("bootstrap_port (int) is required in disaggregation mode")
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens") if isinstance(params, dict) else None
        if max_new is None:
            max_new = 16
        if isinstance(max_new, bool) or not isinstance(max_new, int):
            raise BadRequest("sampling_params.max_new_tokens must be an int")
        max_new = min(max(max_new, 1), MAX_NEW_TOKENS_CAP)
        rid = str(body.get("rid") or uuid.uuid4().hex)

        req = DecodeReq(rid=rid, room=room, max_new_tokens=max_new)
        timing = self.latencies.request(prefilled=True)
        self.requests.add(req)
        client = BootstrapClient(host, port)
        sock = handler.connection
        transfer_concluded = False

        def should_stop() -> bool:
            if req.aborted.is_set():
                return True
            if client_gone(sock):
                self.requests.abort(req, "client disconnected")
                return True
            return False

        try:
            handler.start_stream()
            self.requests.set_stage(req, "prealloc")
            try:
                client.register(room, rid, self.decode_id)
            except (OSError, ValueError) as exc:
                self._end_with_abort(handler, req, f"bootstrap failed: {exc}")
                return
            self.requests.set_stage(req, "transfer")
            status = client.wait_transfer(room, should_stop)
            if status is None:
                self._end_with_abort(handler, req, req.abort_reason or "aborted")
                return
            transfer_concluded = True
            if status == KVPoll.Failed:
                self._end_with_abort(handler, req, "KV transfer failed on the prefill side")
                return
            self.requests.set_stage(req, "running")
            text = ""
            for i in range(max_new):
                if req.aborted.wait(timing.wait_s()) or should_stop():
                    self._end_with_abort(handler, req, req.abort_reason or "aborted")
                    return
                text += f" tok{i}"
                handler.write_chunk(
                    _sse({"text": text, "meta_info": {"id": rid, "completion_tokens": i + 1, "finish_reason": None}})
                )
                timing.token()
            handler.write_chunk(
                _sse(
                    {
                        "text": text,
                        "meta_info": {
                            "id": rid,
                            "completion_tokens": max_new,
                            "finish_reason": {"type": "length", "length": max_new},
                        },
                    }
                )
            )
            handler.write_chunk(b"data: [DONE]\n\n")
            handler.end_stream()
            timing.finish(completed=True)
        except OSError:
            # Writing to the client failed: it went away mid-stream.
            self.requests.abort(req, "client disconnected")
            handler.abandon()
        finally:
            timing.finish(completed=False)  # every way out before the end is an abort (no-op after the end)
            self.requests.remove(req)
            client.close()
            if req.aborted.is_set() and not transfer_concluded:
                # If the prefill server is unreachable, its own disconnect handling covers the room.
                with contextlib.suppress(OSError, ValueError):
                    client.fail(room, req.abort_reason or "aborted")

    def _end_with_abort(self, handler: JSONHandler, req: DecodeReq, message: str) -> None:
        if req.abort_reason is None:
            req.abort_reason = message
        req.aborted.set()
        try:
            handler.write_chunk(
                _sse({"text": "", "meta_info": {"id": req.rid, "finish_reason": {"type": "abort", "message": message}}})
            )
            handler.write_chunk(b"data: [DONE]\n\n")
            handler.end_stream()
        except OSError:
            handler.abandon()


class ServerHandler(JSONHandler):
    @property
    def app(self) -> BaseApp:
        app: BaseApp = self.server.app  # type: ignore[attr-defined]
        return app

    def _health(self) -> None:
        if self.app.healthy():
            self.send_text(200, "")
        else:
            self.send_text(503, "starting" if not self.app.ready else "unhealthy")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate", "/ready"):
            self._health()
        elif path in ("/model_info", "/get_model_info"):
            self.send_json(
                200,
                {"model_path": self.app.args.model_path, "is_generation": True, "model_type": "demo"},
            )
        elif path in ("/server_info", "/get_server_info"):
            self.send_json(200, self.app.server_info())
        elif path == "/metrics" and self.app.args.enable_metrics:
            self.send_text(200, self.app.render_metrics(), PROMETHEUS_CONTENT_TYPE)
        else:
            self.send_json(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            body = self.read_json()
        except ValueError as exc:
            self.send_json(400, {"error": f"bad JSON: {exc}"})
            return
        if path == "/generate":
            if not self.app.ready:
                self.send_json(503, {"error": "server is starting"})
                return
            if "bootstrap_room" not in body:  # straight to this server (a canary), not the router's fan-out
                self._direct_generate(body)
                return
            try:
                self.app.generate(self, body)
            except BadRequest as exc:
                if self._streaming:
                    self.abandon()
                else:
                    self.send_json(400, {"error": str(exc)})
        elif path in demo_openai.ROUTES:
            if not self.app.ready:
                self.send_json(503, {"error": {"message": "server is starting"}})
                return
            app = self.app
            demo_openai.serve(self, path, body, app.model_name, app.latencies.request(), app.knobs.generate_fail,
                              app.streams)
        elif path == "/abort_request":
            if body.get("abort_all"):
                n = self.app.abort_all()
            elif body.get("rid") is not None:
                n = self.app.abort_rid(str(body["rid"]))
            else:
                self.send_json(400, {"error": "give rid or abort_all"})
                return
            self.send_json(200, {"success": True, "aborted": n})
        else:
            self.send_json(404, {"error": f"no route {path}"})


    def _direct_generate(self, body: dict[str, Any]) -> None:
        """A generation answered by this server alone; streamed token by token when asked, as SGLang does."""
        try:
            code, reply = demo_generate.answer(self.app.model_name, body, self.app.knobs.generate_fail)
        except demo_generate.BadGenerate as exc:
            self.send_json(400, {"error": str(exc)})
            return
        request = self.app.latencies.request()
        if code != 200 or not body.get("stream"):
            request.answer_at_once(completed=not self.app.knobs.generate_fail)
            self.send_json(code, reply)
            return
        meta = reply["meta_info"]
        words = reply["text"].split(" ")[1:]
        events = [_sse({"text": "".join(" " + w for w in words[:i + 1]),
                        "meta_info": {"id": meta["id"], "completion_tokens": i + 1, "finish_reason": None}})
                  for i in range(len(words))]
        ended = stream_tokens(self, events, _sse(reply), request)
        self.app.streams.add("completed" if ended else "aborted")


class BootstrapHandler(JSONHandler):
    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/health":
            self.send_text(200, "")
        else:
            self.send_json(404, {"error": "no route"})

    def do_POST(self) -> None:
        app: PrefillApp = self.server.app  # type: ignore[attr-defined]
        try:
            body = self.read_json()
        except ValueError as exc:
            self.send_json(400, {"error": f"bad JSON: {exc}"})
            return
        app.bootstrap_post(self, self.path.split("?", 1)[0], body)


def launch_server(args: argparse.Namespace) -> int:
    require_loopback(args.host, "--host")
    knobs = Knobs.from_env()
    mode = args.disaggregation_mode
    stop = install_stop_signals()
    if args.nnodes > 1 and args.node_rank > 0:
        return demo_ranks.follow(args.dist_init_addr, args.node_rank, knobs.rank_crash_s, stop)
    # Rank 0 of a multi-node server binds its ports only once every rank joined; the sockets stay open.
    ranks = demo_ranks.gather(args.dist_init_addr, args.nnodes, stop) if args.nnodes > 1 else []
    if ranks is None:
        return 0
    app: BaseApp = PrefillApp(args, knobs) if mode == "prefill" else DecodeApp(args, knobs)
    servers: list[DemoHTTPServer] = []
    try:
        servers.append(DemoHTTPServer(args.host, args.port, ServerHandler, app))
        if isinstance(app, PrefillApp):
            servers.append(
                DemoHTTPServer(args.host, args.disaggregation_bootstrap_port, BootstrapHandler, app)
            )
    except OSError as exc:
        print(f"[{mode}] cannot bind: {exc}", file=sys.stderr, flush=True)
        for server in servers:
            server.server_close()
        return 1
    # Forked before any thread starts; it holds the bound sockets, as upstream's children may.
    scheduler = fork_scheduler(mode, knobs.scheduler_own_group)
    for server in servers:
        serve_in_background(server)
    extra = f", bootstrap 127.0.0.1:{args.disaggregation_bootstrap_port}" if mode == "prefill" else ""
    print(
        f"[{mode}] demo sglang server listening on http://{args.host}:{args.port}{extra} "
        f"model={app.model_name} knobs={asdict(knobs)}",
        flush=True,
    )
    app.start_engine()
    # Warm-up stands in for model loading and the 1-token health generation: /health is 503
    # until it is over, which is what restart logic has to wait out on a real server.
    if not stop.sleep(knobs.startup_s):
        app.ready = True
        print(f"[{mode}] The server is fired up and ready to roll!", flush=True)
    stop.wait()
    print(f"[{mode}] stopping", flush=True)
    app.ready = False
    if knobs.stop_hang_s:
        time.sleep(knobs.stop_hang_s)  # a drain with no deadline: the stop's grace runs out first
    shutdown_servers(servers)
    app.stop_engine()
    scheduler.stop()
    return 0
