"""A unit's router around its restart: take its workers out (and see the router no longer lists them), wait until
their own in-flight gauges reach 0, and after the restart and its proofs put them back (and see them listed and
healthy). Every call goes through the agent on the router's host, to its loopback.

What the router answers (its worker list, ids, health) is input: it is checked before it drives a call, and shown
escaped in a message.

A run over several units (a fleet run, its rollback, `rollout resume` and `abort`, a restart of several units) shares
one connection to each router's host (RouterHosts): the units of a batch call through it from their own threads.
The agent's client matches replies to requests by id and the agent runs them in the order sent, so concurrent calls
need no lock of ours: they queue at the agent, each a short call to its loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from deployer.agent.protocol import Http
from deployer.command import quote as shell_quote
from deployer.config.routers import Router, RouterWorker, metrics_origin
from deployer.errors import AgentLost, ConfigError, DeployerError
from deployer.fleet.routers import api_of
from deployer.fleet.routers.base import Call, Listed
from deployer.steps.context import Context
from deployer.steps.metrics import MetricParams, parse
from deployer.text import shown, visible
from deployer.transport.base import Transport

if TYPE_CHECKING:
    from deployer.config.models import Unit
    from deployer.run.engine import Engine

ROUTER_TIMEOUT_S = 10.0


class RouterFailed(DeployerError):
    """The router refused a change, never showed it, or a worker never drained: nothing of the unit restarted."""

    exit_code = 5


@dataclass(frozen=True)
class Worker:
    """A unit's worker: how the router names it, and where its own gauges are read (on its host's loopback)."""

    spec: RouterWorker
    url: str
    metrics: str
    ctx: Context  # on the worker's host


class RouterHosts:
    """One connection to each router's host for a whole run over several units, opened on first use (the units of
    a batch wait for the one that opens it) and closed when the run ends; one that was lost is replaced on the next
    use (an opening that fails is tried again by the next unit)."""

    def __init__(self, connect: Callable[[str], Transport]) -> None:
        self._connect = connect
        self._open: dict[str, Transport] = {}
        self._lock = threading.Lock()  # held while connecting: one connection to a host, never two

    def get(self, host: str) -> Transport:
        with self._lock:
            if host not in self._open:
                self._open[host] = self._connect(host)
            return self._open[host]

    def drop(self, host: str, lost: Transport) -> None:
        """lost's agent is gone: closed, and forgotten unless another unit replaced it already."""
        with self._lock:
            if self._open.get(host) is lost:
                del self._open[host]
        lost.close()

    def close(self) -> None:
        with self._lock:
            opened, self._open = list(self._open.values()), {}
        for transport in opened:
            transport.close()


class RouterClient:
    """The router's worker calls, as the adapter of the API its config names makes them (fleet.routers). hosts: the
    run's shared connections, the one given among them: a lost one is dropped, and a listing (a read) that met it
    is sent again once, on a new one; a change never is (it may have been made)."""

    def __init__(self, name: str, spec: Router, transport: Transport, hosts: RouterHosts | None = None) -> None:
        self.name, self.spec, self.transport, self.hosts = name, spec, transport, hosts
        self.api = api_of(spec)
        self.reconnected = False

    def _send(self, call: Call, what: str, *, read: bool = False) -> str:
        transport = self.transport
        try:
            return self._sent(transport, call, what)
        except AgentLost:
            if self.hosts is None:
                raise
            self.hosts.drop(self.spec.host, transport)
            if not read or self.reconnected:
                raise
        self.reconnected = True
        self.transport = self.hosts.get(self.spec.host)
        return self._sent(self.transport, call, what)

    def _sent(self, transport: Transport, call: Call, what: str) -> str:
        """Make one call on the router's host: a request to its loopback, or an argv run there; its answer's text."""
        if isinstance(call, list):
            done = transport.run(call, timeout=ROUTER_TIMEOUT_S)
            if not done.ok:
                seen = "timed out" if done.timed_out else \
                    f"exit {done.exit_code}: {shown(done.err_stream.text.strip())}"
                raise self._refused(what, f"`{visible(shell_quote(done.argv), multiline=False)}` {seen}")
            return done.out_stream.text
        answer = transport.call(Http(self.spec.url + call.path, timeout=ROUTER_TIMEOUT_S, check=False,
                                          method=call.method, json=call.body), ROUTER_TIMEOUT_S + 5)
        if not answer.ok:
            raise self._refused(what, f"HTTP {answer.status}: {shown(answer.text)}" if answer.status is not None
                                else str(answer.error))
        return answer.body.decode("utf-8", "replace")

    def _refused(self, what: str, seen: str) -> RouterFailed:
        return RouterFailed(f"router {self.name} ({self.spec.url} on {self.spec.host}) refused {what}: {seen}")

    def listed(self) -> dict[str, Listed]:
        """url -> the worker, as the router lists it now."""
        text = self._send(self.api.listing(self.spec), "its worker list", read=True)
        try:
            return {worker.url: worker for worker in self.api.workers(self.spec, text)}
        except (ValueError, TypeError, KeyError) as exc:
            raise RouterFailed(f"router {self.name}: its worker list is not what its api ({self.spec.api}) "
                               f"answers: {shown(str(exc))}: {shown(text)}") from None

    def remove(self, worker: Worker, listed: dict[str, Listed]) -> None:
        self._send(self.api.remove(self.spec, worker.url, worker.spec, listed[worker.url]),
                   f"the removal of worker {worker.url} ({worker.spec.service})")

    def add(self, worker: Worker) -> None:
        self._send(self.api.add(self.spec, worker.url, worker.spec),
                   f"the addition of worker {worker.url} ({worker.spec.service})")


def inflight(worker: Worker, gauges: list[str]) -> float | None:
    """The worker's in-flight requests: each gauge summed over every series, then added; None: not readable."""
    answer = worker.ctx.transport.http(worker.metrics)
    if not answer.ok:
        return None
    # Only the lines that name a gauge are parsed: a server's /metrics also holds its histograms (the demo's: 13 KB),
    # and a parse of all of it for each gauge cost 46 ms of CPU a worker a read (120 on a loaded machine; 3 now), in
    # the one interpreter where a batch's units drain side by side (issue 37's bench: the largest share of the apply's
    # own CPU; 5.1 s of it in a 16-unit run, 3.2 s now). Every line of a gauge's family holds its name, so what is read
    # of it is what a parse of the whole text reads.
    text = "\n".join(line for line in answer.text.splitlines() if any(gauge in line for gauge in gauges))
    total = 0.0
    for gauge in gauges:
        reading = parse(text, MetricParams(metric=gauge))
        if reading.value is None and not reading.absent:  # a gauge line that does not parse: not read, not drained
            return None
        total += reading.value or 0.0  # a gauge this server does not export has nothing in flight
    return total


@dataclass
class UnitRouting:
    """A unit's workers behind its router: taken out before the restart, put back after it (or after a failure)."""

    client: RouterClient
    workers: list[Worker]
    emit: Callable[..., None]  # onto the unit's run log (its first host's)
    wait: Callable[[float], None]  # a pause that a cancel ends
    owned: Transport | None = None  # a connection to the router's host opened for this unit (closed after it)
    out: bool = False  # the workers are out of the router (a failure puts them back)

    def close(self) -> None:
        if self.owned is not None:
            self.owned.close()

    def take_out(self) -> None:
        """Remove every worker, see that the router no longer lists them, then wait until each has drained."""
        listed = self.client.listed()
        missing = [w.url for w in self.workers if w.url not in listed]
        if missing:
            raise RouterFailed(f"router {self.client.name} does not list the unit's worker(s) "
                               f"{', '.join(map(shown, missing))} (it lists {', '.join(map(shown, listed)) or 'none'})")
        self.out = True  # from the first removal on, a failure puts the workers back
        for worker in self.workers:
            self.client.remove(worker, listed)
            self.emit("router_remove", router=self.client.name, worker=worker.url, service=worker.spec.service)
        self._until(lambda found: not any(w.url in found for w in self.workers), "stop listing")
        self._drain()

    def put_back(self, *, healthy: bool = True) -> None:
        """Add every worker again and see it listed (and healthy, after a restart's proofs)."""
        listed = self.client.listed()
        for worker in self.workers:
            if worker.url not in listed:
                self.client.add(worker)
                self.emit("router_add", router=self.client.name, worker=worker.url, service=worker.spec.service)
        self._until(lambda found: all(w.url in found and (found[w.url].is_healthy or not healthy)
                                      for w in self.workers), "list (as healthy)" if healthy else "list")
        self.out = False

    def _until(self, done: Callable[[dict[str, Listed]], bool], what: str) -> None:
        spec = self.client.spec
        deadline = time.monotonic() + spec.change_timeout_s
        while True:
            found = self.client.listed()
            if done(found):
                self.emit("router_listed", router=self.client.name, workers=sorted(found), check=what)
                return
            if time.monotonic() > deadline:
                urls = ", ".join(w.url for w in self.workers)
                raise RouterFailed(f"router {self.client.name} did not {what} {urls} within {spec.change_timeout_s:g}s "
                                   f"(it lists {', '.join(map(shown, found)) or 'none'})")
            self.wait(spec.interval_s)

    def _drain(self) -> None:
        """Until every worker has read 0 in flight for settle_s (at least twice in a row, interval_s apart): a
        request the router handed on just before the removal may still be on its way to a worker, counted by no
        gauge yet."""
        spec = self.client.spec
        started = time.monotonic()
        quiet_since: float | None = None  # when the passes in a row in which every worker read 0 began
        while True:
            now = time.monotonic()
            if not self._idle(started):
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= spec.settle_s:  # a later quiet pass: at least two readings
                return
            self.wait(spec.interval_s)

    def _idle(self, started: float) -> bool:
        """Each worker's in-flight count, read (and logged) until one is not 0; that one past the drain's deadline
        fails the drain."""
        spec = self.client.spec
        for worker in self.workers:
            value = inflight(worker, spec.inflight)
            self.emit("worker_inflight", router=self.client.name, worker=worker.url,
                      service=worker.spec.service, value=value,
                      elapsed_s=round(time.monotonic() - started, 3), budget_s=spec.drain_timeout_s)
            if value != 0:
                if time.monotonic() > started + spec.drain_timeout_s:
                    seen = "unreadable" if value is None else f"{value:g} in flight"
                    raise RouterFailed(f"worker {worker.url} ({worker.spec.service}) did not drain within "
                                       f"{spec.drain_timeout_s:g}s: {seen} ({' + '.join(spec.inflight)})")
                return False
        return True


@dataclass(frozen=True)
class Routers:
    """The inventory's routers, and a connection to a router's host outside a unit: what takes a unit out of its
    router around every restart of it (apply, restart, rollback). shared: one connection to each router's host for
    every unit until the run ends (sharing); None: each unit opens its own and closes it after the unit."""

    specs: dict[str, Router] = field(default_factory=dict)
    connect: Callable[[str], Transport] | None = None
    shared: RouterHosts | None = None

    @contextmanager
    def sharing(self) -> Iterator[Routers]:
        """These routers, their hosts' connections shared by every unit until the end of the with (whatever ends
        it: success, a failure, a pause, a signal), then closed; already shared: the outer with closes them."""
        if self.shared is not None or self.connect is None:
            yield self
            return
        hosts = RouterHosts(self.connect)
        try:
            yield replace(self, shared=hosts)
        finally:
            hosts.close()

    def for_unit(self, name: str, unit: Unit,
                 engines: dict[str, Engine]) -> Callable[[dict[str, Context]], UnitRouting] | None:
        """The unit's routing, made once its hosts' contexts meet; None: the unit is behind no router."""
        if unit.router is None:
            return None
        return lambda ctxs: self._routing(name, unit, engines, ctxs)

    def _routing(self, name: str, unit: Unit, engines: dict[str, Engine], ctxs: dict[str, Context]) -> UnitRouting:
        """The unit's workers and a client of its router, on the router host's connection (the unit's own when
        the router runs on one of its hosts, else the run's shared one, else one of its own)."""
        assert unit.router is not None
        spec = self.specs[unit.router]
        owned = shared = None
        if spec.host in ctxs:
            transport = ctxs[spec.host].transport
        elif self.connect is None:
            raise ConfigError(f"unit {name}: no connection to router {unit.router}'s host {spec.host}")
        elif self.shared is not None:
            shared = self.shared
            transport = shared.get(spec.host)
        else:
            transport = owned = self.connect(spec.host)
        workers = []
        for worker in unit.workers:
            host, _, service = worker.service.partition(":")
            origin = metrics_origin(engines[host].host.services[service].health)
            workers.append(Worker(worker, worker.url or origin, origin + "/metrics", ctxs[host]))
        leader = ctxs[sorted(ctxs)[0]]
        return UnitRouting(RouterClient(unit.router, spec, transport, shared), workers,
                           emit=lambda kind, **data: leader.emit(kind, unit=name, **data), wait=leader.cancel.wait,
                           owned=owned)
