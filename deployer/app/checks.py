"""`check` (`deployer check`): can I deploy here now? Every answer read from the host, nothing changed on it.

Each check has a status and, when it fails, the exit code the operation it predicts would end
with (a host key that is not pinned: 4, a held lock: 3, a dest git does not track: 2, ...), so
the command's exit code is that of the first problem. Over several hosts (a group, a unit, a glob)
each host gets its own report, and the exit code is that of the first host with a problem.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deployer.app.setting import Setting, build_of, select_hosts
from deployer.command import Masker
from deployer.config.container import Container
from deployer.config.models import Host, KubernetesHost, Unit
from deployer.errors import AgentLost, ConnectError, DeployerError, HostKeyError, PythonMissing
from deployer.fleet.runner import DEFAULT_PARALLEL
from deployer.fleet.unit import steps_for
from deployer.run import lock as locks
from deployer.run.mounts import gone, inspection, last_placement
from deployer.run.pods import last_left, placed_in_pod, reading, unkept
from deployer.run.preflight import lazy_projection, preflight
from deployer.steps import optional
from deployer.steps.base import Step
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Context, EventBus, Listener, LoadedPlaybook
from deployer.steps.gitops import GIT_DIR, git, names
from deployer.steps.services import manager_for
from deployer.steps.services.budgets import last_times
from deployer.steps.services.gpu import GpuWait, gpu_list
from deployer.steps.services.manager import not_ours
from deployer.transport.base import Transport
from deployer.transport.kinds import rows

Status = Literal["ok", "warn", "fail", "skip"]
Connector = Callable[[EventBus], Transport]
VERSION = "import sys; print(sys.version.split()[0])"


@dataclass(frozen=True)
class Check:
    """One row of `deployer check`: what was checked, how it went, and the exit code it stands for."""
    name: str
    status: Status
    detail: str
    exit_code: int = 0  # when it fails: the exit code the predicted failure has
    # A refusal's whole message, as every other command prints it (the fingerprint, what to run): the
    # row shows its first line.
    message: str | None = None


@dataclass
class CheckReport:
    """Every check of one host, in the order they ran."""
    host: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: Status, detail: str, exit_code: int = 0) -> None:
        self.checks.append(Check(name, status, detail, exit_code if status == "fail" else 0))

    def refused(self, name: str, exc: DeployerError) -> None:
        """A failure the connection raised: its first line in the row, all of it for the operator."""
        message = str(exc)
        self.checks.append(Check(name, "fail", message.splitlines()[0] if message else name, exc.exit_code,
                                 message))

    @property
    def first_problem(self) -> Check | None:
        return next((c for c in self.checks if c.status == "fail"), None)

    @property
    def exit_code(self) -> int:
        first = self.first_problem
        return 0 if first is None else first.exit_code

    def as_json(self) -> dict[str, Any]:
        first = self.first_problem
        return {"host": self.host, "checks": [vars(c) for c in self.checks], "exit_code": self.exit_code,
                "error": None if first is None else first.message or f"{first.name}: {first.detail}"}


@dataclass
class GroupReport:
    """`check` over several hosts: one report per host, in the order the selection names them. The outcome of
    the check use case: one host's report alone when it checked one host."""

    reports: list[CheckReport]

    @property
    def first_problem(self) -> tuple[str, Check] | None:
        return next(((r.host, first) for r in self.reports if (first := r.first_problem) is not None), None)

    @property
    def exit_code(self) -> int:
        found = self.first_problem
        return 0 if found is None else found[1].exit_code

    def as_json(self) -> dict[str, Any]:
        found = self.first_problem
        return {"hosts": {r.host: r.as_json() for r in self.reports}, "exit_code": self.exit_code,
                "error": None if found is None else f"{found[0]}: {found[1].name}: {found[1].detail}"}

    def document(self) -> dict[str, Any]:
        """What `check --json` prints: one host's report, as before groups existed, or every host's."""
        return self.reports[0].as_json() if len(self.reports) == 1 else self.as_json()


@dataclass(frozen=True, kw_only=True)
class CheckOptions(Setting):
    """host: a host, group or unit, a comma list, or a glob (a report per host); playbook: also what it needs of
    each (its metrics exist, its dests are tracked, ...); parallel: hosts checked at once (None: the fleet's
    default). The runs dir is read for each service's last time to healthy."""

    host: str
    playbook: str | Path | None = None
    parallel: int | None = None


def check(options: CheckOptions, *, listener: Listener | None = None) -> GroupReport:
    """Every host's checks (each problem a failed row, never an exception); a config that cannot be loaded, or
    a playbook that does not parse, raises its ConfigError."""
    from deployer.app.applies import notice_unended
    from deployer.config import targets
    from deployer.steps.playbook import load_playbook

    loaded, hosts = select_hosts(options, options.host)
    steps = load_playbook(Path(options.playbook)) if options.playbook else None
    build = build_of(options, listener)
    # A run of this machine cut on these hosts may have left nothing on the target (no intent record, its lock
    # released by hand) that says the host is not as any run left it: named, as before an apply.
    notice_unended(build.runs_dir, list(hosts), listener)
    for step in steps[1] if steps else []:  # a canary `via:` names a router of this inventory
        optional.reach_routers(step, lambda: build.routers(loaded))
    return check_hosts({name: loaded.hosts[name] for name in hosts}, steps, connect=build.connector,
                       units={name: loaded.units[name] for name in targets.units_of(loaded, hosts)},
                       listeners=[listener] if listener is not None else [],
                       parallel=options.parallel or DEFAULT_PARALLEL,
                       runs_dir=build.runs_dir)


def check_hosts(hosts: dict[str, Host], playbook: tuple[LoadedPlaybook, list[Step]] | None, *,
                connect: Callable[[str, Host], Connector], units: dict[str, Unit] | None = None,
                listeners: list[Listener] | None = None, parallel: int = DEFAULT_PARALLEL,
                runs_dir: Path | None = None) -> GroupReport:
    """Every host checked as `check_host` checks one, their connections opened concurrently; a host of a
    unit against its part of the playbook (its own services' restart; the checks on the metrics host).
    runs_dir: where each service's last time to healthy is read from."""
    def one(name: str) -> CheckReport:
        mine = playbook
        for unit_name, unit in (units or {}).items():
            if playbook is not None and name in unit.hosts():
                mine = (playbook[0], steps_for(playbook[1], unit_name, unit, name))
        return check_host(name, hosts[name], mine, connect=connect(name, hosts[name]), listeners=listeners,
                          runs_dir=runs_dir)

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(hosts))), thread_name_prefix="deployer-check") as pool:
        return GroupReport(list(pool.map(one, hosts)))


def check_host(host_name: str, host: Host, playbook: tuple[LoadedPlaybook, list[Step]] | None, *,
               connect: Connector, listeners: list[Listener] | None = None,
               runs_dir: Path | None = None) -> CheckReport:
    report = CheckReport(host_name)
    if playbook is not None:
        problems = [f"{s.where}: {s.name}: {p}" for s in playbook[1]
                    if (p := optional.check_host(s, host_name, host))]
        report.add("playbook", "fail" if problems else "ok", "; ".join(problems) or str(playbook[0].path), 2)
    bus = EventBus(Masker(host.secrets()), host_name)
    bus.listeners.extend(listeners or [])
    try:
        transport = connect(bus)
    except HostKeyError as exc:
        report.refused("host key", exc)
        report.add("auth", "skip", "not tried: the host key is not trusted")
        return report
    except ConnectError as exc:
        report.add("host key", "skip", "not reached")
        report.refused("auth", exc)
        return report
    with transport:
        kind_rows = rows(host.transport)(transport, host, _dests(playbook))  # the kind's own: how it reached the host
        for row in kind_rows:
            report.add(*row)
        if any(row.status == "fail" for row in kind_rows):
            return report
        if host.container is not None and not _check_container(report, transport, host.container):
            return report
        ctx = _context(host_name, host, transport, bus, playbook)
        if host.container is not None:
            _check_places(report, ctx, _dests(playbook), runs_dir)
        if isinstance(host, KubernetesHost):
            _check_pod(report, ctx, _dests(playbook), runs_dir)
        _check_target(report, ctx, playbook, runs_dir)
    if runs_dir is not None:
        _check_budgets(report, host_name, host, runs_dir)
    return report


def _check_container(report: CheckReport, transport: Transport, container: Container) -> bool:
    """The agent started in the container: no probe of its own, the start's failure says what is wrong
    (an engine not installed, a container absent or stopped) as apply would."""
    try:
        hello = transport.agent().verified()
    except AgentLost as exc:
        report.refused("container", exc)
        return False
    report.add("container", "ok", f"{container.engine} container {container.name}: the agent runs in it "
               f"(pid {hello.pid} there)")
    return True


def _check_places(report: CheckReport, ctx: Context, dests: list[str], runs_dir: Path | None) -> None:
    """Where each dest (the repo, without a playbook) lives in the container, as apply's preflight places it, and
    whether the files of the host's newest run are still there: a recreated container has another id."""
    started = inspection(ctx)
    assert started is not None
    try:
        seen = started.result()
    except DeployerError as exc:
        report.add("placement", "fail", str(exc), exc.exit_code)
        return
    required = ctx.playbook.model.persist == "required"
    listed: list[str | None] = [*dests] or [None]  # None: the repo itself
    for dest in listed:
        place = seen.place(ctx.repo if dest is None else ctx.in_repo(dest))
        refused = required and not place.persistent
        report.add("placement", "fail" if refused else "ok", f"{dest or 'the repo'}: {place.describe()}"
                   f"{' (persist: required refuses it)' if refused else ''}", 2)
    assert ctx.host.container is not None
    last = None if runs_dir is None else last_placement(runs_dir, ctx.host_name, ctx.host.container.name)
    if last is not None and (said := gone(last[1], seen.id)) is not None:
        report.add("run files", "warn", f"run {last[0]}: {said}")


def _check_pod(report: CheckReport, ctx: Context, dests: list[str], runs_dir: Path | None) -> None:
    """A pod's: what `persist: required` refuses of the dests (the kind's rows said where each lives), and whether
    the files of the host's newest run are still there: another pod (a new uid) or a new container of it."""
    try:
        placed = placed_in_pod(ctx, dests)
    except DeployerError as exc:
        report.add("pod files", "fail", str(exc), exc.exit_code)
        return
    assert placed is not None and isinstance(ctx.host, KubernetesHost)
    if ctx.playbook.model.persist == "required" and (lost := unkept(placed)):
        report.add("placement", "fail", f"persist: required refuses {', '.join(lost)}: a new pod would not have "
                   "it", 2)
    last = None if runs_dir is None else last_left(runs_dir, ctx.host_name, str(placed["pod"]))
    seen = reading(ctx)
    if last is not None and seen is not None:
        kept, said = last.judge(seen.result())
        report.add("run files", "ok" if kept else "warn", said)


def _context(host_name: str, host: Host, transport: Transport, bus: EventBus,
             playbook: tuple[LoadedPlaybook, list[Step]] | None) -> Context:
    loaded = playbook[0] if playbook else LoadedPlaybook.none("check")
    return Context(run_id="<check>", host_name=host_name, host=host, transport=transport, playbook=loaded,
                   bus=bus, cancel=CancelToken())


def _check_target(report: CheckReport, ctx: Context, playbook: tuple[LoadedPlaybook, list[Step]] | None,
                  runs_dir: Path | None) -> None:
    host = ctx.host
    try:  # the agent's first request: it starts under the host's python
        version = ctx.transport.run((host.python, "-c", VERSION), timeout=30)
    except PythonMissing as exc:
        report.refused("python", exc)
        return
    report.add("python", "ok" if version.ok else "fail",
               f"{host.python}: Python {version.out.strip()}" if version.ok
               else f"{host.python} does not run: {(version.err or version.out).strip()[-200:]}", 1)
    git_dir = ctx.run(GIT_DIR, timeout=30)
    if not git_dir.ok:
        report.add("repo", "fail", f"{host.repo} is not a git checkout: {git_dir.err.strip()[-200:]}", 2)
        return
    ctx.git_dir = git_dir.out.strip()
    report.add("repo", "ok", host.repo)
    head = ctx.run(git("log", "-1", "--format=%H %s"), timeout=30)
    report.add("HEAD", "ok" if head.ok else "fail", head.out.strip() or head.err.strip(), 1)
    dests = _dests(playbook)
    _check_dirt(report, ctx, dests)
    _check_lock(report, ctx, runs_dir)
    _check_services(report, ctx)
    _check_metrics(report, ctx, playbook)
    if playbook is not None:
        _check_dests(report, ctx, playbook[0])
        _check_judged(report, ctx, playbook[1])


def _check_judged(report: CheckReport, ctx: Context, steps: list[Step]) -> None:
    """What apply judges right after its preflight, before it touches the target (the shipped Python compiles
    here, the projected diff is within the bounds): from the same reads, so check and apply agree."""
    judging = [s for s in steps if optional.judges(s)]
    if not judging:
        return
    try:
        projected = lazy_projection(ctx, preflight(ctx, allow_dirty=True))
    except DeployerError as exc:
        report.add("preflight", "fail", str(exc), exc.exit_code)
        return
    for step in judging:
        problems = optional.judge_here(step, ctx, projected)
        report.add(optional.judges(step), "fail" if problems else "ok",
                   f"{step.where}: {step.name}: {'; '.join(problems)}" if problems else f"{step.name}: ok "
                   f"(projected: {projected().summary()})", 1)


def _dests(playbook: tuple[LoadedPlaybook, list[Step]] | None) -> list[str]:
    return [f.dest for f in playbook[0].model.files] if playbook else []


def _check_dirt(report: CheckReport, ctx: Context, dests: list[str]) -> None:
    status = ctx.run(git("--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=no"),
                     timeout=30)
    dirty = sorted({entry[3:] for entry in names(status.out) if len(entry) > 3})
    blocking = [d for d in dirty if d in dests]
    if blocking:
        report.add("dirty files", "fail", f"uncommitted changes in the playbook's files: {', '.join(blocking)} "
                   "(apply refuses; --allow-dirty ships over them)", 1)
    elif dirty:
        report.add("dirty files", "warn", f"{len(dirty)} modified: {', '.join(dirty[:5])}"
                   f"{' ...' if len(dirty) > 5 else ''} (not in the playbook's files)")
    else:
        report.add("dirty files", "ok", "none")


def _check_lock(report: CheckReport, ctx: Context, runs_dir: Path | None) -> None:
    from deployer.app.locks import holder_now

    assert ctx.git_dir is not None
    state = locks.read_state(ctx.transport, ctx.git_dir, ctx.host.lock_ttl_s, ctx.host_name)
    if state is None:
        report.add("lock", "ok", "free")
    else:
        holder = None if state.taking or state.invalid is not None else state.info.get("run_id")
        # As apply says of it: recover is the way out of a lock whose run is gone (it refuses a live one); this
        # machine's record of the run, where it ran here, says which.
        judged = holder_now(runs_dir, state, ctx.host_name) if runs_dir is not None and holder else None
        if judged is not None and (judged.cut or judged.going):
            hint = f"; {judged.text}"
        elif holder:
            hint = (f"; if run {holder} is gone (killed, disconnected), end it with: deployer recover {holder} "
                    f"--host {ctx.host_name}")
        else:
            hint = ""
        report.add("lock", "fail", state.describe() + hint, 3)


def _check_services(report: CheckReport, ctx: Context) -> None:
    if not ctx.host.services:
        report.add("services", "skip", "the inventory defines none")
    for name, service in ctx.host.services.items():
        manager = manager_for(ctx, name)
        try:
            seen = manager.observe(health=False)
        except DeployerError as exc:
            report.add(f"service {name}", "fail", f"cannot read its state: {exc}", 1)
            continue
        pid = seen.pid
        answer = ctx.transport.http(service.health, timeout=2.0).status if service.health else None
        running = f"running (adopted, pid {pid})" if seen.adopted else f"pid {pid} alive" if pid else "not running"
        health = "no health URL" if not service.health else (
            f"{service.health} answers {answer}" if answer else f"{service.health} does not answer")
        if pid is None and answer == 200 and service.health:  # running, just not deployer's: never "not running"
            running, health = "served by a process deployer did not start", not_ours(ctx.host_name, name,
                                                                                       service)
        well = pid is not None and (not service.health or answer == 200)
        report.add(f"service {name}", "ok" if well else "fail", f"{running}; {health}", 1)
        if manager.warning:  # what its manager saw wrong (a container without an init)
            report.add(f"service {name}", "warn", manager.warning)
        if service.gpus:  # what apply's preflight refuses (CoRestart.refusals), read the same way
            problem = GpuWait(manager).problem()
            report.add(f"gpus {name}", "fail" if problem else "ok",
                       problem or f"nvidia-smi lists {gpu_list(service.gpus)}", 1)


def _check_budgets(report: CheckReport, host_name: str, host: Host, runs_dir: Path) -> None:
    """Each service's last time to healthy against its budget: a budget below it is a warning."""
    for timing in last_times(runs_dir, host_name, host):
        report.add(f"service {timing.service} start", "warn" if timing.short else "ok", timing.describe())


def _check_metrics(report: CheckReport, ctx: Context, playbook: tuple[LoadedPlaybook, list[Step]] | None) -> None:
    url = ctx.host.metrics
    if url is None:
        report.add("metrics", "skip", "no metrics URL in the inventory")
    else:
        answer = ctx.transport.http(url, timeout=2.0).status
        report.add("metrics", "ok" if answer == 200 else "fail",
                   f"{url} answers {answer}" if answer else f"{url} does not answer", 1)
    for step in playbook[1] if playbook else []:
        for row in optional.live_checks(step, ctx):
            report.add(row.name, "ok" if row.ok else "fail", row.detail, 1)


def _check_dests(report: CheckReport, ctx: Context, loaded: LoadedPlaybook) -> None:
    specs = loaded.model.files
    if not specs:
        report.add("dests", "skip", f"a patch ({loaded.model.patch}): `deployer plan` checks that it applies")
        return
    listed = ctx.run(git("ls-files", "-z", "--", *(s.dest for s in specs)), timeout=30)
    tracked = set(names(listed.out))
    missing = [s.dest for s in specs if s.dest not in tracked and not getattr(s, "create", False)]
    if missing:
        report.add("dests", "fail", f"not tracked by git on the target: {', '.join(missing)} "
                   "(a typo? a new file needs `create: true`)", 2)
    else:
        report.add("dests", "ok", f"{len(specs)} tracked" + (
            f", {len(specs) - len(tracked & {s.dest for s in specs})} new (create: true)"
            if len(tracked) < len(specs) else ""))
