"""`logs` (`deployer logs`): a service's log read on its host through the agent, as its manager keeps it (what a
`start:` service printed, a unit's journal, a container's output), this start's unless the whole is asked for;
`follow` then reads what each wrote since, one bounded read per service and poll, until it is told to stop."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.app.setting import Setting, build_of, select_hosts
from deployer.errors import ConfigError, DeployerError
from deployer.steps import gitops
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Context, LoadedPlaybook, Submitted
from deployer.steps.services import manager_for
from deployer.text import shown, visible

if TYPE_CHECKING:
    from deployer.build import Build
    from deployer.config.models import Inventory
    from deployer.steps.context import Listener
    from deployer.steps.services.manager import Manager

MOST = 1 << 20  # bytes of text one read brings back, for each service
FOLLOW_POLL_S = 0.5
READ_TIMEOUT_S = 60.0
NO_LOG, NO_TOOL = 3, 127  # what a manager's read_log exits with when there is nothing to read, or nothing to read it


@dataclass(frozen=True, kw_only=True)
class LogOptions(Setting):
    """host: a host, or a group or unit (each of its hosts that has service); service: one (None: every service of
    each host). What to show of each log: this start's (whole: all of it), its last `lines` lines when given."""

    host: str
    service: str | None = None
    whole: bool = False
    lines: int | None = None


@dataclass(frozen=True)
class LogText:
    """One read of one service's log: its text, escaped and masked (a follow's read: what came since the last)."""

    host: str
    service: str
    source: str  # what the log holds and where it is kept
    text: str
    skipped: int = 0  # bytes left out: more than one read brings back
    missing: bool = False  # it has no log on the host yet (never started, no such container)

    def document(self) -> dict[str, Any]:
        return {"host": self.host, "service": self.service, "source": self.source, "text": self.text,
                "skipped_bytes": self.skipped, "missing": self.missing}


def chosen(inventory: Inventory, hosts: list[str], service: str | None) -> dict[str, list[str]]:
    """Each host's services to show: every one, or the one named, on the hosts that have it (a unit's or a
    group's service runs on some of them); no host having it is a config error naming theirs."""
    if service is None:
        return {host: list(inventory.hosts[host].services) for host in hosts}
    having = {host: [service] for host in hosts if service in inventory.hosts[host].services}
    if not having:
        theirs = "; ".join(f"{host}: {', '.join(inventory.hosts[host].services) or '(none)'}" for host in hosts)
        raise ConfigError(f"no service {service!r} on {', '.join(hosts)}; the services are {theirs}")
    return having


class Reader:
    """One service's log on one host, and where its next read begins."""

    def __init__(self, manager: Manager, options: LogOptions) -> None:
        self.manager, self.options = manager, options
        self.cursor = ""  # none yet: the first read is this start's (or the whole log), as the options say
        self.pending: Submitted | None = None

    def send(self) -> None:
        lines = self.options.lines if not self.cursor else None
        action = self.manager.read_log(self.cursor, whole=self.options.whole, lines=lines, most=MOST)
        self.pending = self.manager.host_side.send(action, timeout=READ_TIMEOUT_S, capture=MOST)

    def result(self) -> LogText:
        assert self.pending is not None, "send() first"
        result, self.pending = self.pending.result(), None
        ctx, name = self.manager.ctx, self.manager.name
        source = self.manager.log_source(self.options.whole)
        if result.exit_code == NO_TOOL:
            raise ConfigError(f"{ctx.host_name}: cannot read {name}'s log ({source}): {self.manager.log_tool()} is "
                              "not on the host's PATH")
        if result.exit_code == NO_LOG:
            return LogText(ctx.host_name, name, source, "", missing=True)
        if not result.ok:
            said = (result.err or result.out).strip()[-300:]
            raise DeployerError(f"{ctx.host_name}: cannot read {name}'s log ({source}): "
                                f"{'timed out' if result.timed_out else f'exit {result.exit_code}'}: {shown(said)}")
        text, cursor, skipped = self.manager.log_read(result)
        self.cursor = cursor or self.cursor
        return LogText(ctx.host_name, name, source, visible(ctx.bus.masker(text)), skipped)


@contextlib.contextmanager
def opened(build: Build, services: dict[str, list[str]], options: LogOptions) -> Iterator[list[Reader]]:
    """A connection to each host (its agent started), and a reader for each of its services, in the order given."""
    with contextlib.ExitStack() as stack:
        readers = []
        for name, names in services.items():
            host = build.host(name)
            bus = build.bus(name, host)
            transport = stack.enter_context(build.connector(name, host)(bus))
            ctx = Context(run_id="<logs>", host_name=name, host=host, transport=transport,
                          playbook=LoadedPlaybook.none("logs"), bus=bus, cancel=CancelToken())
            ctx.git_dir = gitops.git_dir(transport, host.repo)  # a `start:` service's log is kept in it
            readers += [Reader(manager_for(ctx, service, "logs"), options) for service in names]
        yield readers


def read_all(readers: list[Reader]) -> list[LogText]:
    """One read of each: all sent, then each answer taken (a round trip per host, not per service)."""
    for reader in readers:
        reader.send()
    return [reader.result() for reader in readers]


@dataclass(frozen=True)
class LogsOutcome:
    """One read of each service's log, in the order chosen."""

    logs: list[LogText]
    exit_code: int = 0

    def document(self) -> dict[str, Any]:
        return {"logs": [one.document() for one in self.logs], "exit_code": 0, "error": None}


@dataclass(frozen=True)
class ServiceLogs:
    """The logs options name: each host's services chosen (a config error raised already), to read or follow."""

    build: Build
    services: dict[str, list[str]]
    options: LogOptions

    def read(self) -> LogsOutcome:
        with opened(self.build, self.services, self.options) as readers:
            return LogsOutcome(read_all(readers))

    def follow(self, show: Callable[[LogText], None], stop: threading.Event) -> None:
        """Show each log as read() does, then what each service wrote since, every FOLLOW_POLL_S, until stop is
        set (a read under way ends first: each is bounded, in time and in bytes)."""
        with opened(self.build, self.services, self.options) as readers:
            for text in read_all(readers):
                show(text)
            while not stop.wait(FOLLOW_POLL_S):
                for text in read_all(readers):
                    if text.text or text.skipped:
                        show(text)


def service_logs(options: LogOptions, *, listener: Listener | None = None) -> ServiceLogs:
    """The services whose logs options name, on their hosts; no host having the service is a ConfigError."""
    loaded, hosts = select_hosts(options, options.host)
    services = chosen(loaded, hosts, options.service)
    return ServiceLogs(build_of(options, listener), services, options)


def read_logs(options: LogOptions, *, listener: Listener | None = None) -> LogsOutcome:
    """One read of each log options name (the Python API's `logs`)."""
    return service_logs(options, listener=listener).read()
