"""A rollout as OpenTelemetry spans, exported through the standard OTLP/HTTP exporter (the `otel` extra): the
rollout (or a single host's run), each batch in it, each host in a batch, each step on a host; a step's gates
(an analysis verdict: its metric, measured value and threshold) are its attributes. Built from the same events
as the webhooks' documents, on the emitting thread; the SDK's batch processor sends them from its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import deployer
from deployer.config.notify import NOT_ENDED, VERDICT, Kind, Notify, resolve_headers
from deployer.steps.context import Listener

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

OTEL_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def spans_for(notify: Notify, kind: Kind, say: Sequence[Listener]) -> Spans | None:
    """The spans listener when the inventory asks for OTLP; None (and a notice) when the extra is missing."""
    if notify.otlp is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        for listener in say:
            listener({"type": "notice", "message": "notify: otlp is set in the inventory, but OpenTelemetry is "
                                                   "not installed (pip install 'deployer[otel]'): no spans are sent"})
        return None
    exporter = OTLPSpanExporter(endpoint=notify.otlp.endpoint, headers=resolve_headers(notify.otlp.headers) or None,
                                timeout=max(1.0, notify.flush_s))
    provider = TracerProvider(resource=Resource.create({"service.name": "deployer",
                                                        "service.version": deployer.__version__}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Spans(provider, kind, notify.flush_s)


def scalars(event: dict[str, Any], *names: str, prefix: str = "deployer.") -> dict[str, Any]:
    """The event's fields that an attribute can hold (str, bool, int, float), named prefix + name."""
    return {prefix + name: event[name] for name in names if isinstance(event.get(name), (str, bool, int, float))}


class Spans:
    """One run's events as spans (see the module); a listener, like the run log."""

    def __init__(self, provider: TracerProvider, kind: Kind, flush_s: float) -> None:
        self.provider, self.kind, self.flush_s = provider, kind, flush_s
        self.tracer: Tracer = provider.get_tracer("deployer", deployer.__version__)
        self.root: Span | None = None
        self.batches: dict[int, Span] = {}
        self.hosts: dict[str, Span] = {}
        self.steps: dict[str, Span] = {}  # host -> its step that runs
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> None:
        with self.lock:  # a fleet's hosts emit from their own threads
            self._on(event)

    def _on(self, event: dict[str, Any]) -> None:
        kind, host = event.get("type"), event.get("host")
        if kind in ("fleet_start", "run_start") and self.root is None and (kind == "fleet_start") == (
                self.kind == "fleet"):
            name = "rollout" if kind == "fleet_start" else f"run {event.get('kind', 'apply')}"
            self.root = self._start(name, None, scalars(event, "fleet", "kind", "host", "playbook_name"))
        elif kind == "fleet_resumed" and self.root is None and self.kind == "fleet":
            # `rollout resume`: another process than the one that saw fleet_start, so the rollout's span of this
            # part opens here, saying whose resume it is, and its batches and hosts have a parent again.
            self.root = self._start("rollout", None, {**scalars(event, "fleet", "reason"), "deployer.kind": "apply",
                                                      "deployer.resume_of": str(event.get("fleet"))})
        elif kind in ("fleet_paused", "fleet_resumed") and self.root is not None:
            self.root.add_event(kind.removeprefix("fleet_"), scalars(event, "batch", "reason", "duration_s",
                                                                     prefix=""))
        elif kind == "batch_start" and self.root is not None:
            self._end_batches()
            self.batches[int(event["batch"])] = self._start(f"batch {event['batch']}", self.root,
                                                            {"deployer.batch": int(event["batch"])})
        elif kind == "host_status" and isinstance(host, str):
            self._host(host, event)
        elif kind == "step_start" and isinstance(host, str):
            parent = self.hosts.get(host) or self.root
            self.steps[host] = self._start(f"step {event.get('kind')}", parent,
                                           {"deployer.host": host, **scalars(event, "kind", "unit")})
        elif kind == "step_end" and isinstance(host, str) and host in self.steps:
            step = self.steps.pop(host)
            step.set_attributes(scalars(event, "status", "summary", "duration_s"))
            self._status(step, event.get("status"))
            step.end()
        elif kind == VERDICT:
            # The gate's numbers on the step that judged (or the host's, or the run's span).
            target = self.steps.get(str(host)) or self.hosts.get(str(host)) or self.root
            metric = str(event.get("metric", "gate"))
            if target is not None:
                target.set_attributes(scalars(event, "verdict", "measured", "threshold", "method", "samples",
                                              prefix=f"deployer.gate.{metric}."))
        elif kind in ("fleet_end", "run_end") and self.root is not None and (kind == "fleet_end") == (
                self.kind == "fleet"):
            self._end_batches()
            self.root.set_attributes(scalars(event, "status", "exit_code", "error", "phase"))
            self._status(self.root, event.get("status"))
            self.root.end()

    def _host(self, host: str, event: dict[str, Any]) -> None:
        status = str(event.get("status"))
        if status == "running" and self.batches:
            self.hosts[host] = self._start(f"host {host}", self.batches[max(self.batches)], {"deployer.host": host})
        elif status not in NOT_ENDED and host in self.hosts:
            span = self.hosts.pop(host)
            span.set_attributes(scalars(event, "status", "run_id", "exit_code", "error", "elapsed_s"))
            self._status(span, status)
            span.end()

    def _start(self, name: str, parent: Span | None, attributes: dict[str, Any]) -> Span:
        from opentelemetry import trace

        context = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(name, context=context, attributes=attributes, start_time=time.time_ns())

    def _end_batches(self) -> None:
        for number in list(self.batches):
            self.batches.pop(number).end()

    @staticmethod
    def _status(span: Span, status: object) -> None:
        from opentelemetry.trace import Status, StatusCode

        if status not in (None, "successful", "ok", "skipped", "untouched", "paused"):  # a pause waits, never fails
            span.set_status(Status(StatusCode.ERROR, str(status)))

    def close(self) -> None:
        """Ends what is still open (a run that raised), then sends what is left, within flush_s."""
        with self.lock:
            for span in [*self.steps.values(), *self.hosts.values(), *self.batches.values(),
                         *([self.root] if self.root is not None else [])]:
                if span.is_recording():
                    span.end()
        self.provider.force_flush(int(self.flush_s * 1000))
        self.provider.shutdown()
