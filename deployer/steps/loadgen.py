"""A bounded abort storm: many short-lived streaming requests that give up on purpose.

The bug class deployer guards against (an abort racing a KV transfer) is only provoked by
clients that go away mid-request, in numbers. This client does exactly that, and nothing more:
every limit is enforced here rather than trusted to the caller, because a storm pointed at the
wrong place or sized wrong is a denial-of-service tool.

- Only loopback URLs are accepted (127.0.0.1, localhost, ::1); a remote target is stormed
  through an SSH tunnel to a local port. That is a workplace rule, not a technical limit.
- ``requests`` <= 10000, ``concurrency`` <= 256, and no new request is sent once
  ``max_duration_s`` has passed; a request in flight then ends within ``client_timeout_s``.

Outcome of each request (``sent == completed + aborted + errors`` always holds):

- *completed*: a 2xx response whose stream ended normally;
- *aborted*: the client gave up after ``client_timeout_s`` and closed the socket (what the storm
  is for; an OpenAI-compatible server has no other way to cancel), or the stream ended with SGLang's
  ``meta_info.finish_reason.type == "abort"`` or an OpenAI chunk's ``choices[].finish_reason == "abort"``
  (vLLM's word) (the server aborted it, e.g. after an ``abort_all``);
- *errors*: connection failures, protocol errors and non-2xx answers.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any

from deployer.config.models import LOOPBACK_HOSTS

MAX_REQUESTS = 10_000
MAX_CONCURRENCY = 256
DEFAULT_MAX_NEW_TOKENS = 8
DEFAULT_PROMPT = "Explain prefill/decode disaggregation in one sentence."
_ABORT_ALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class StormResult:
    """What a storm sent and how each request ended."""
    sent: int
    completed: int
    aborted: int
    errors: int
    abort_all_sent: int  # answered 2xx
    duration_s: float
    abort_all_tried: int = 0


class _Outcome(Enum):
    COMPLETED = "completed"
    ABORTED = "aborted"
    ERROR = "error"


@dataclass(frozen=True)
class _Target:
    """Where a storm's requests go: host, port and path."""
    host: str
    port: int
    path: str


def _parse_loopback_url(url: str, what: str) -> _Target:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"{what} {url!r}: only http:// URLs are supported")
    host = parts.hostname
    if host is None or host not in LOOPBACK_HOSTS:
        raise ValueError(
            f"{what} {url!r}: host {host!r} is not loopback (127.0.0.1, localhost, ::1); "
            "storm a remote target through an SSH tunnel to a local port"
        )
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ValueError(f"{what} {url!r}: bad port") from exc
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(host, port, path)


def _check_positive_finite(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}={value} is outside the allowed range [{low}, {high}]")


def _final_event_is_abort(line: bytes) -> bool | None:
    """Whether an SSE ``data:`` line says the server aborted the request (None: not an event)."""
    text = line.strip()
    if not text.startswith(b"data:"):
        return None
    data = text[5:].strip()
    if data == b"[DONE]":
        return None
    try:
        event = json.loads(data)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    meta = event.get("meta_info")
    finish = meta.get("finish_reason") if isinstance(meta, dict) else None
    if isinstance(finish, dict):
        return finish.get("type") == "abort"
    choices = event.get("choices")
    if isinstance(choices, list):
        return any(isinstance(c, dict) and c.get("finish_reason") == "abort" for c in choices)
    return False


def _one_request(target: _Target, body: bytes, client_timeout_s: float) -> _Outcome:
    """One streaming request with a hard deadline; closing the socket is the abort."""
    deadline = time.monotonic() + client_timeout_s
    conn = http.client.HTTPConnection(target.host, target.port, timeout=client_timeout_s)
    aborted_by_server = False
    try:
        conn.connect()
        sock = conn.sock
        if sock is None:
            return _Outcome.ERROR
        conn.request(
            "POST",
            target.path,
            body=body,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        resp = conn.getresponse()
        if not 200 <= resp.status < 300:
            return _Outcome.ERROR
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _Outcome.ABORTED
            # The socket keeps its own reference after the response takes it over, so the
            # per-read deadline still applies when the server answers with Connection: close.
            sock.settimeout(remaining)
            line = resp.readline()
            if not line:
                break
            verdict = _final_event_is_abort(line)
            if verdict is not None:
                aborted_by_server = verdict
        return _Outcome.ABORTED if aborted_by_server else _Outcome.COMPLETED
    except TimeoutError:
        return _Outcome.ABORTED
    except (OSError, http.client.HTTPException, ValueError):
        return _Outcome.ERROR
    finally:
        conn.close()


def _post_abort_all(target: _Target) -> bool:
    conn = http.client.HTTPConnection(target.host, target.port, timeout=_ABORT_ALL_TIMEOUT_S)
    try:
        conn.request(
            "POST",
            target.path,
            body=json.dumps({"abort_all": True}),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        resp.read()
        return 200 <= resp.status < 300
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def run_storm(
    url: str,
    *,
    requests: int,
    concurrency: int,
    client_timeout_s: float,
    abort_all_every: int | None = None,
    abort_url: str | None = None,
    max_duration_s: float = 60.0,
    payload: dict[str, Any] | None = None,
    body: dict[str, Any] | None = None,
) -> StormResult:
    """Fire up to ``requests`` streaming POSTs at ``url``, at most ``concurrency`` in flight.

    With ``abort_all_every=K``, ``{"abort_all": true}`` is POSTed to ``abort_url`` (default: the
    same server's ``/abort_request``) after every K-th request sent, except after the last one;
    ``abort_all_tried`` counts the ones sent, ``abort_all_sent`` those answered 2xx. ``body`` is
    the whole JSON body (default: SGLang's streaming /generate); ``payload`` entries override its top-level keys.
    Raises ValueError for a non-loopback URL or a value outside the caps; never raises for what
    happens to individual requests (they are counted instead).
    """
    target = _parse_loopback_url(url, "url")
    if abort_url is None:
        abort_target = _Target(target.host, target.port, "/abort_request")
    else:
        abort_target = _parse_loopback_url(abort_url, "abort_url")
    _check_int("requests", requests, 0, MAX_REQUESTS)
    _check_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
    _check_positive_finite("client_timeout_s", client_timeout_s)
    _check_positive_finite("max_duration_s", max_duration_s)
    if abort_all_every is not None:
        _check_int("abort_all_every", abort_all_every, 1, MAX_REQUESTS)

    document: dict[str, Any] = dict(body) if body is not None else {
        "text": DEFAULT_PROMPT,
        "stream": True,
        "sampling_params": {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS},
    }
    if payload is not None:
        document.update(payload)
    sent_body = json.dumps(document).encode()

    counts = {outcome: 0 for outcome in _Outcome}
    counts_lock = threading.Lock()
    # The executor would queue every submission at once; the semaphore keeps submission in
    # step with completions, so the duration cap also stops what has not been sent yet.
    slots = threading.Semaphore(concurrency)

    def task() -> None:
        try:
            outcome = _one_request(target, sent_body, client_timeout_s)
        except Exception:  # a bug here must still be counted, or the totals stop adding up
            outcome = _Outcome.ERROR
        finally:
            slots.release()
        with counts_lock:
            counts[outcome] += 1

    start = time.monotonic()
    stop_at = start + max_duration_s
    sent = 0
    abort_all_sent = abort_all_tried = 0
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="storm") as pool:
        while sent < requests:
            remaining = stop_at - time.monotonic()
            if remaining <= 0 or not slots.acquire(timeout=remaining):
                break
            pool.submit(task)
            sent += 1
            # Never after the last request: a trailing abort_all would also release whatever the
            # storm left stuck, and the storm would then measure the abort_all, not the clients.
            due = abort_all_every is not None and sent % abort_all_every == 0 and sent < requests
            if due:
                abort_all_tried += 1
                abort_all_sent += _post_abort_all(abort_target)
    duration = time.monotonic() - start
    return StormResult(
        sent=sent,
        completed=counts[_Outcome.COMPLETED],
        aborted=counts[_Outcome.ABORTED],
        errors=counts[_Outcome.ERROR],
        abort_all_sent=abort_all_sent,
        duration_s=duration,
        abort_all_tried=abort_all_tried,
    )


__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DEFAULT_PROMPT", "MAX_CONCURRENCY", "MAX_REQUESTS", "StormResult", "run_storm"]
