"""The inventory's `notify:`: where a rollout's events go besides the screen and the run log (webhooks, and
OpenTelemetry spans through OTLP/HTTP when the `otel` extra is installed), and the names of those events.

Every header value is masked in every output and log: a webhook's headers are where its token lives."""

from __future__ import annotations

import os
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from deployer.errors import ConfigError

# The `type` of every document a webhook receives (docs/how-to/notify.md lists their fields). Dotted names, the
# thing first: a new event of a thing (rollout.aborted beside rollout.paused) fits beside the others.
EVENT_TYPES = (
    "rollout.start",  # a fleet run starts: its hosts and batches
    "batch.start", "batch.end",  # a batch of hosts (units) starts; ends: each host's status
    "host.end",  # a host's run in a fleet ended: its status, run id, exit code, error
    "rollout.rollback",  # a failed fleet rolls back every host that committed
    "host.rollback",  # one host's rollback in it ended
    "rollout.stopped",  # the strategy stopped the rollout after a failed batch: the rest stays untouched
    "rollout.paused", "rollout.resumed", "rollout.aborted",  # a rollout paused between batches; went on; aborted
    "analysis.verdict",  # reserved: an analysis judged a build (its metric, measured value, threshold, verdict)
    "rollout.end",  # a fleet run ended: its status and exit code
    "run.start", "run.end",  # a single-host run (apply, rollback) starts; ends
    "run.rollback",  # a run's commit reverted: its on_failure, or `deployer rollback RUN` (whose run it names)
    "run.recover",  # `deployer recover` ended a cut run: what it found of it (its outcome, its commit)
)

# The events of a run that the documents (and spans) come from, beside those named in fleet/notify.py: what a
# watched run is (a fleet's events speak for its hosts' runs; a single host's run speaks for itself), an
# analysis's verdict (once the analysis emits it), and a host's statuses on its way rather than at an end.
Kind = Literal["host", "fleet"]
VERDICT = "analysis_verdict"
RECOVERED = "recovered"  # a recover's finding, on its own or in a fleet's `recover FLEET_ID`
NOT_ENDED = ("running", "rolling back")


def event_type(kind: str) -> str:
    if kind not in EVENT_TYPES:
        raise ValueError(f"not an event type: {kind!r} (one of {', '.join(EVENT_TYPES)})")
    return kind


def http_url(url: str) -> str:
    """An http or https URL with a host: the requests go from this machine, to nothing else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, not {url!r}")
    return url


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # config.models.Strict's (it imports this)


class FromEnv(Strict):
    """A header value read from this machine's environment when the run starts."""

    value_from_env: str = Field(min_length=1, description=(
        "The environment variable, on the machine deployer runs on, that holds the value."))

    def resolve(self) -> str:
        found = os.environ.get(self.value_from_env)
        if found is None:
            raise ConfigError(f"environment variable {self.value_from_env} is not set (a notify header reads it "
                              "with value_from_env)")
        return found


HeaderValue = str | FromEnv
HEADERS_HELP = ("HTTP headers sent with each request: a value or {value_from_env: NAME}; every value is masked as "
                "*** in every output and log.")


def resolve_headers(headers: dict[str, HeaderValue]) -> dict[str, str]:
    return {k: v.resolve() if isinstance(v, FromEnv) else v for k, v in headers.items()}


class Webhook(Strict):
    url: Annotated[str, AfterValidator(http_url)] = Field(description=(
        "Where each event is POSTed as one JSON document (http or https), from the machine deployer runs on."))
    events: list[Annotated[str, AfterValidator(event_type)]] = Field(default_factory=list, description=(
        "The event types this webhook receives (rollout.start, batch.end, host.end, ...); empty: every one."))
    headers: dict[str, HeaderValue] = Field(default_factory=dict, description=HEADERS_HELP)
    timeout_s: float = Field(default=5.0, gt=0, le=60, description="Each request's time limit.")
    retries: int = Field(default=3, ge=0, le=10, description=(
        "Further tries of a request that failed (an error, a timeout, an HTTP status other than 2xx), each "
        "after a doubling wait from 0.5 s (at most 8 s)."))

    def wants(self, kind: str) -> bool:
        return not self.events or kind in self.events


class Otlp(Strict):
    endpoint: Annotated[str, AfterValidator(http_url)] | None = Field(default=None, description=(
        "The OTLP/HTTP traces endpoint (http://collector:4318/v1/traces); default: OpenTelemetry's own "
        "environment variables (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT)."))
    headers: dict[str, HeaderValue] = Field(default_factory=dict, description=HEADERS_HELP)


class Notify(Strict):
    webhooks: list[Webhook] = Field(default_factory=list, description=(
        "Webhooks that hear of each rollout's events (JSON over HTTP), e.g. a team chat's or an incident tool's."))
    otlp: Otlp | None = Field(default=None, description=(
        "The rollout as OpenTelemetry spans (rollout, batch, host, step) through OTLP/HTTP: needs "
        "`pip install 'deployer[otel]'`."))
    flush_s: float = Field(default=5.0, ge=0, le=60, description=(
        "How long the end of a run waits, at most, for the events not yet delivered."))

    def secrets(self) -> list[str]:
        """Every header value: masked wherever a URL, an error or an event could show one (but one of 1-3
        characters, a flag rather than a token: masking it would blank out the text around it)."""
        headers = [*(w.headers for w in self.webhooks), *([self.otlp.headers] if self.otlp else [])]
        return [value for h in headers for value in resolve_headers(h).values() if len(value) >= 4]
