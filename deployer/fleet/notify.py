"""A rollout's events out, to the inventory's webhooks: each event a run emits that a team's chat or incident tool
should hear of (config/notify.py names them) becomes one JSON document, POSTed from this machine by a background
thread, so a slow or dead webhook never holds the rollout up; a failed request is tried again a bounded number of
times, a request that still failed is recorded (`notify_failed` in the runs dir's .notify.jsonl) and said once,
and the end of the run waits a bounded time for what is still queued and says how much was not delivered.

One document schema for every type (docs/how-to/notify.md): the fields that do not apply to a type are null."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import deployer
from deployer.command import Masker
from deployer.config.notify import NOT_ENDED, RECOVERED, VERDICT, Kind, Notify, Webhook, resolve_headers
from deployer.runlog import utc_now
from deployer.steps.context import Listener

SCHEMA = "deployer.event/1"
QUEUED = 1000  # documents waiting at most: past that a document is dropped (and counted), never waited for
BACKOFF_S, BACKOFF_MAX_S = 0.5, 8.0
NOTIFY_LOG = ".notify.jsonl"  # a dot: not a run of the runs dir, listed or sorted among its runs
# A fleet's events that are the same document type whatever they carry.
FLEET_TYPES = {"fleet_start": "rollout.start", "batch_start": "batch.start", "fleet_rollback": "rollout.rollback",
               "fleet_stopped": "rollout.stopped", "fleet_paused": "rollout.paused",
               "fleet_resumed": "rollout.resumed", "fleet_aborted": "rollout.aborted", "fleet_end": "rollout.end"}
HOST_TYPES = {"run_start": "run.start", "run_end": "run.end", "rollback": "run.rollback"}


def shown_url(url: str) -> str:
    """A webhook's URL as said in a log or on the screen: its origin only (a chat's webhook URL is itself the
    token, in its path or its query)."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    rest = "/***" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{parts.hostname}{port}{rest}"


@dataclass
class Documents:
    """A run's events as documents: keeps what a later document needs (the fleet, each host's batch and unit)."""

    kind: Kind
    units: dict[str, str] = field(default_factory=dict)  # host -> its unit
    fleet: str | None = None
    batches: list[list[str]] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)  # host -> the status it ended with
    closed: set[int] = field(default_factory=set)  # the batches whose batch.end was made
    run: str | None = None  # a single host's run: named by its run_start only, and in each of its documents

    def of(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == VERDICT:
            return [self.document("analysis.verdict", event)]
        if kind == RECOVERED:
            return [self.document("run.recover", event)]
        if self.kind == "host":
            if kind == "run_start":
                self.run = event.get("run_id")
            return [self.document(HOST_TYPES[kind], event)] if kind in HOST_TYPES else []
        if kind in ("fleet_start", "fleet_resumed") and event.get("batches") is not None:  # resumed: another process
            self.fleet, self.batches = event.get("fleet"), [list(b) for b in event.get("batches") or []]
        if kind in FLEET_TYPES:
            return [self.document(FLEET_TYPES[kind], event)]
        if kind != "host_status" or event.get("status") in NOT_ENDED:
            return []
        status, host = str(event.get("status")), str(event.get("host"))
        if status.startswith("rollback ") or status == "restarted with its unit":
            return [self.document("host.rollback", event, status=status.removeprefix("rollback "))]
        self.ended[host] = status
        found = [self.document("host.end", event)]
        batch = self.batch_of(host)
        if batch is not None and batch not in self.closed and all(h in self.ended for h in self.batches[batch]):
            self.closed.add(batch)
            statuses = {h: self.ended[h] for h in self.batches[batch]}
            failed = [h for h, s in statuses.items() if s not in ("successful", "untouched")]
            found.append(self.document("batch.end", {"time": event.get("time"), "hosts": statuses},
                                       batch=batch, status="failed" if failed else "successful"))
        return found

    def batch_of(self, host: str | None) -> int | None:
        return next((n for n, hosts in enumerate(self.batches) if host in hosts), None)

    def document(self, kind: str, event: dict[str, Any], **given: Any) -> dict[str, Any]:
        """The stable schema: every field present in every type, then the event's own fields under data."""
        host = event.get("host")
        known = {"schema": SCHEMA, "type": kind, "time": event.get("time") or utc_now(),
                 "deployer": deployer.__version__, "fleet": event.get("fleet") or self.fleet,
                 "run": event.get("run_id") or self.run, "host": host, "unit": self.units.get(host) if host else None,
                 "batch": event.get("batch", self.batch_of(host)), "status": event.get("status"),
                 "exit_code": event.get("exit_code"), "error": event.get("error"), "phase": event.get("phase"),
                 "verdict": event.get("verdict")}
        known.update(given)
        skip = {"type", "time", "fleet", "run_id", "host", "batch", "status", "exit_code", "error", "phase",
                "verdict", "step"}
        known["data"] = {k: v for k, v in event.items() if k not in skip and k not in given}
        return known


class Notifier:
    """The inventory's webhooks as a listener of one run's events (see the module)."""

    def __init__(self, notify: Notify, kind: Kind, runs_dir: Path, say: Sequence[Listener],
                 units: dict[str, str] | None = None) -> None:
        self.hooks = [(hook, resolve_headers(hook.headers)) for hook in notify.webhooks]
        self.flush_s = notify.flush_s
        self.masker = Masker([*notify.secrets(), *(hook.url for hook in notify.webhooks)])  # a URL may be a token
        self.documents = Documents(kind, units or {})
        self.log = runs_dir / NOTIFY_LOG
        self.say = say
        self.queue: queue.Queue[tuple[int, dict[str, Any]] | None] = queue.Queue(QUEUED)
        self.stop = threading.Event()  # the end's wait ran out: no further tries
        self.lock = threading.Lock()
        self.queued = self.delivered = self.failed = self.dropped = 0
        self.said: set[int] = set()  # the webhooks whose failure was said (once each)
        self.thread = threading.Thread(target=self._deliver, name="deployer-notify", daemon=True)
        self.thread.start()

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:  # a fleet's hosts emit from their own threads
            documents = self.documents.of(event)
            for document in documents:
                for index, (hook, _) in enumerate(self.hooks):
                    if hook.wants(document["type"]):
                        try:
                            self.queue.put_nowait((index, document))
                            self.queued += 1
                        except queue.Full:
                            self.dropped += 1

    def close(self) -> int:
        """Waits at most flush_s for what is queued, then gives up the rest; says, and returns, how many
        documents were not delivered."""
        deadline = time.monotonic() + self.flush_s
        with contextlib.suppress(queue.Full):
            self.queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        self.thread.join(max(0.0, deadline - time.monotonic()))
        self.stop.set()
        with self.lock:
            missed = self.queued - self.delivered + self.dropped
            if missed:
                waited = "" if not self.thread.is_alive() else f" within {self.flush_s:g}s"
                failures = f"; see {self.log}" if self.failed else ""
                self._say({"type": "notice", "message": (
                    f"notify: {missed} of {self.queued + self.dropped} event(s) were not delivered{waited}"
                    f"{failures}")})
            return missed

    def _say(self, event: dict[str, Any]) -> None:
        for listener in self.say:
            listener(event)

    def _deliver(self) -> None:
        while (item := self.queue.get()) is not None and not self.stop.is_set():
            index, document = item
            hook, headers = self.hooks[index]
            attempts, error = self._post(hook, headers, document)
            with self.lock:
                if error is None:
                    self.delivered += 1
                    continue
                self.failed += 1
            self._failed(index, hook, document, attempts, error)

    def _post(self, hook: Webhook, headers: dict[str, str], document: dict[str, Any]) -> tuple[int, str | None]:
        import urllib.error  # here: on the notify thread, at its first delivery, not on the run's way to start
        import urllib.request

        body = json.dumps(document, default=str).encode()
        request_headers = {"Content-Type": "application/json", "User-Agent": f"deployer/{deployer.__version__}",
                           **headers}
        error: str | None = None
        for attempt in range(1, hook.retries + 2):
            if attempt > 1 and self.stop.wait(min(BACKOFF_S * 2 ** (attempt - 2), BACKOFF_MAX_S)):
                return attempt - 1, error
            request = urllib.request.Request(hook.url, data=body, headers=request_headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=hook.timeout_s) as answer:  # http(s): config/notify.py
                    answer.read()
                return attempt, None
            except urllib.error.HTTPError as exc:  # a status other than 2xx (urllib follows redirects itself)
                error = f"HTTP {exc.code} {exc.reason}"
            except (OSError, ValueError) as exc:  # refused, reset, timed out, a bad answer
                error = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
        return hook.retries + 1, error

    def _failed(self, index: int, hook: Webhook, document: dict[str, Any], attempts: int, error: str) -> None:
        url = shown_url(hook.url)
        record = self.masker.obj({"type": "notify_failed", "time": utc_now(), "url": url, "event": document["type"],
                                  "fleet": document["fleet"], "host": document["host"], "attempts": attempts,
                                  "error": error})
        assert isinstance(record, dict)
        with contextlib.suppress(OSError):  # the rollout goes on; the notice below still says it
            self.log.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as out:
                out.write(json.dumps(record) + "\n")
        with self.lock:
            first = index not in self.said
            self.said.add(index)
        if first:
            self._say({**record, "type": "notice", "message": self.masker(
                f"notify: webhook {url} failed ({error}) after {attempts} attempt(s): {document['type']} not "
                f"delivered (further failures of it: {self.log})")})


@contextlib.contextmanager
def notifying(notify: Notify | None, kind: Kind, listeners: list[Listener], *, runs_dir: Path,
              say: Sequence[Listener], units: dict[str, str] | None = None) -> Iterator[None]:
    """The inventory's notify: on a run's listeners (webhooks, and spans when an OTLP endpoint is configured),
    for the run inside the block; its end flushes them, each within its bound."""
    if notify is None:
        yield
        return
    closing: list[Any] = []
    if notify.webhooks:
        notifier = Notifier(notify, kind, runs_dir, say, units)
        listeners.append(notifier)
        closing.append(notifier)
    from deployer.fleet.spans import spans_for

    if (spans := spans_for(notify, kind, say)) is not None:
        listeners.append(spans)
        closing.append(spans)
    try:
        yield
    finally:
        for each in closing:
            each.close()
