"""The recorded runs as a person names and picks them: a run or a fleet run by `last` or by any unique beginning
of its id, wherever a command takes a run id; and the history use cases: the runs `runs list` shows (history),
one run (recorded, `runs show`), its log verified (verify, `runs verify`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.app.setting import Setting, runs_dir_of
from deployer.errors import ConfigError
from deployer.fleet.record import FLEET, FleetRecord, is_fleet
from deployer.run.shown import CANCELED, FAILED, REFUSED, shown_state
from deployer.runlog import EVENTS, read_run
from deployer.runstate import Phase

if TYPE_CHECKING:
    from collections.abc import Iterator

    from deployer.fleet.record import FleetState
    from deployer.runlog import Run
    from deployer.steps.context import Listener

LAST = "last"
STATES = (*(phase.value for phase in Phase), FAILED, REFUSED, CANCELED)
# A fleet run's own status (fleet.json), beyond its hosts' states: --state paused lists the paused rollouts.
FLEET_STATES = ("running", "successful", "paused", "aborted")
NAMED = 10  # the ids an ambiguous beginning names: enough to pick from, never a screenful


class UnknownRun(ConfigError):
    """No run of the runs dir has that id, or an id that begins so."""


def run_ids(runs_dir: Path) -> list[str]:
    """Every run and fleet run of the runs dir, oldest first (ids sort in start order)."""
    if not runs_dir.is_dir():
        return []
    return sorted(p.name for p in runs_dir.iterdir() if (p / EVENTS).is_file() or (p / FLEET).is_file())


def resolve(runs_dir: Path, given: str, host: str | None = None) -> str:
    """The whole id of the run that `given` names: `last` (see newest), an id, or the beginning of exactly one."""
    if given == LAST:
        return newest(runs_dir, host)
    ids = run_ids(runs_dir)
    found = [given] if given in ids else [run_id for run_id in ids if run_id.startswith(given)]
    if not found:
        raise UnknownRun(f"no run {given!r} in {runs_dir} (see 'deployer runs list')")
    if len(found) > 1:
        older = f" and {len(found) - NAMED} older" if len(found) > NAMED else ""
        raise ConfigError(f"run id {given!r} is ambiguous: {len(found)} runs in {runs_dir} begin so, "
                          f"{', '.join(found[-NAMED:])}{older}; give more of the id")
    return found[0]


def shown_run(runs_dir: Path, given: str, host: str | None) -> str:
    """resolve() for `runs show` and `runs verify`: --host narrows `last` (the newest run on that host), as it does
    for `rollback last`; beside an id it would be ignored, so it is refused."""
    if host is not None and given != LAST:
        raise ConfigError(f"--host picks the newest run on a host for `last`; {given!r} names a run already")
    return resolve(runs_dir, given, host)


def to_undo(runs_dir: Path, given: str, host: str | None = None) -> tuple[str, list[str]]:
    """resolve() for a rollback: `last` is the newest run that left a commit to roll back (last_to_undo), with the
    newer runs it passed over."""
    return last_to_undo(runs_dir, host) if given == LAST else (resolve(runs_dir, given, host), [])


def newest(runs_dir: Path, host: str | None = None) -> str:
    """The newest run on host; without a host, the newest run or fleet run started by a command of its own (a
    fleet's sub-runs, which start after it, are the fleet's)."""
    for run_id, _ in _newest_first(runs_dir, host):
        return run_id
    on = f" on {host}" if host is not None else ""
    raise ConfigError(f"no run{on} in {runs_dir} (see 'deployer runs list')")


def last_to_undo(runs_dir: Path, host: str | None = None) -> tuple[str, list[str]]:
    """What `rollback last` rolls back: the newest apply (run or fleet run, as newest() picks them) whose commit
    still stands, and the newer runs it passed over, each as `ID (state)`: a rollback of the newest run whatever
    it was would most often be refused (an unchanged or refused run made no commit) or undo an undo."""
    from deployer.run.unended import cut

    skipped: list[str] = []
    cuts: list[str] = []  # never ended, their process here gone: their commit (if any) is recover's to judge
    for run_id, run in _newest_first(runs_dir, host):
        if isinstance(run, FleetRecord):
            fleet = run.state
            if fleet.kind == "apply" and not fleet.rolled_back_by and any(
                    one.committed and one.rollback_status != "successful" for one in fleet.hosts.values()):
                return run_id, skipped
            skipped.append(f"{run_id} (fleet {fleet.kind}, {fleet.status})")
            continue
        state = shown_state(run)
        if run.start.get("kind", "apply") == "apply" and run.git.get("after") and state != Phase.rolled_back.value \
                and not any(link.get("status") == "successful" for link in run.all("rolled_back_by")):
            return run_id, skipped
        was_cut = cut(run) is True
        skipped.append(f"{run_id} ({run.start.get('kind', 'apply')}, {state}{', cut' if was_cut else ''})")
        if was_cut:
            cuts.append(run_id)
    on = f" on {host}" if host is not None else ""
    ended = "".join(f"; run {run_id} was cut (it never ended: it may still hold the target's lock and have changed "
                    f"files there): end it with: deployer recover {run_id}" for run_id in cuts)
    raise ConfigError(f"no run{on} in {runs_dir} left a commit to roll back (see 'deployer runs list'){ended}")


def _newest_first(runs_dir: Path, host: str | None) -> Iterator[tuple[str, Run | FleetRecord]]:
    """Runs on host, newest first; without a host, every run and fleet run started by a command of its own."""
    for run_id in reversed(run_ids(runs_dir)):
        if (runs_dir / run_id / FLEET).is_file():
            if host is None:
                yield run_id, FleetRecord.load(runs_dir, run_id)
            continue
        run = read_run(runs_dir, run_id)
        if run.start.get("host") == host if host is not None else not run.start.get("fleet"):
            yield run_id, run


def listed(runs: list[Run], fleets: list[FleetState], host: str | None, states: tuple[str, ...],
           last: int | None, *, refused: bool = False) -> tuple[list[Run], list[FleetState]]:
    """What `runs list` shows of these: the runs on host in one of states, and the fleet runs with such a host
    (each only if given); of each, the last newest. Refusals (the lock held, an unknown host key) changed
    nothing and are no part of the history: only with `refused` (--all), or asked for by their state."""
    unknown = sorted(set(states) - set(STATES) - set(FLEET_STATES))
    if unknown:
        raise ConfigError(f"--state {', '.join(unknown)}: no run has that state; the states are {', '.join(STATES)}; "
                          f"a fleet run's also {', '.join(FLEET_STATES)}")

    def chosen(on: str | None, state: str) -> bool:
        return (host is None or on == host) and (state in states if states else refused or state != REFUSED)

    kept = [run for run in runs if chosen(run.start.get("host"), shown_state(run))]
    kept_fleets = [fleet for fleet in fleets if (host is None and not states)
                   or (fleet.status in states and (host is None or host in fleet.hosts))
                   or any(chosen(name, one.state) for name, one in fleet.hosts.items())]
    return (kept[-last:], kept_fleets[-last:]) if last else (kept, kept_fleets)


@dataclass(frozen=True, kw_only=True)
class HistoryOptions:
    """The recorded runs to list (`runs list`): on host, in one of states, the last newest; refused runs only
    with refused (or asked for by their state). runs_dir: None, the default one (see Setting)."""

    runs_dir: str | Path | None = None
    host: str | None = None
    states: tuple[str, ...] = ()
    last: int | None = None
    refused: bool = False


@dataclass(frozen=True)
class History:
    """The runs and fleet runs listed, oldest first, from runs_dir."""

    runs_dir: Path
    runs: list[Run]
    fleets: list[FleetState]
    cut: frozenset[str] = frozenset()  # the runs that never ended and whose process on this machine is gone
    exit_code: int = 0

    def document(self) -> dict[str, Any]:
        return {"runs_dir": str(self.runs_dir),
                "runs": [{"run_id": r.run_id, "state": shown_state(r), "status": r.status,
                          "host": r.start.get("host"), "kind": r.start.get("kind", "apply"),
                          "playbook": r.start.get("playbook_name"), "fleet": r.start.get("fleet"),
                          "git": r.git, "commits": r.commits, "cut": r.run_id in self.cut} for r in self.runs],
                "fleets": [f.document() for f in self.fleets]}


def history(options: HistoryOptions) -> History:
    from deployer.fleet.record import list_fleets
    from deployer.run.unended import cut
    from deployer.runlog import list_runs

    root = runs_dir_of(options.runs_dir)
    runs, fleets = listed(list_runs(root), list_fleets(root), options.host, options.states, options.last,
                          refused=options.refused)
    return History(root, runs, fleets, frozenset(run.run_id for run in runs if cut(run)))


@dataclass(frozen=True)
class Recorded:
    """One recorded run (`runs show`): its log, or a fleet run's record; target: what its target says now of the
    run's files (a run into a pod: the pod read now)."""

    run: Run | None = None
    fleet: FleetState | None = None
    exit_code: int = 0
    target: list[str] = field(default_factory=list)

    def document(self) -> Any:
        """A run's raw events; a fleet run's record."""
        return self.fleet.document() if self.fleet is not None else self.run.events if self.run is not None else None


def recorded(given: str, runs_dir: str | Path | None = None, inventory: str | Path | None = None, *,
             target: bool = False, host: str | None = None) -> Recorded:
    """The run or fleet run `given` names (`last`: the newest, on host if given; or any unique beginning of an id);
    with target, a run into a pod with the pod read now, through the inventory's host (its kubectl, where it runs)."""
    root = runs_dir_of(runs_dir)
    run_id = shown_run(root, given, host)
    if is_fleet(root, run_id):
        return Recorded(fleet=FleetRecord.load(root, run_id).state)
    run = read_run(root, run_id)
    return Recorded(run=run, target=pod_now(run, inventory) if target else [])


def pod_now(run: Run, inventory: str | Path | None) -> list[str]:
    """What the pod a run shipped into says now of its files (run/pods.py), or why it could not be read."""
    from deployer.app.setting import inventory_of
    from deployer.config.models import KubernetesHost
    from deployer.errors import DeployerError
    from deployer.run.pods import recorded as left_by
    from deployer.transport.kubernetes import read_pod_now

    left = left_by(run)
    if left is None:
        return []
    name = str(run.start.get("host"))
    try:
        host = inventory_of(Setting(inventory=inventory)).hosts.get(name)
        if not isinstance(host, KubernetesHost) or host.pod.name != left.pod:
            return [f"pod {left.pod} not read now: the inventory has no kubernetes host {name} of that pod"]
        return [left.judge(read_pod_now(name, host))[1]]
    except DeployerError as exc:
        return [f"pod {left.pod} not read now: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]


@dataclass(frozen=True, kw_only=True)
class VerifyOptions(Setting):
    """The run or fleet run to verify (`last`, or any unique beginning of an id): its log's hash chain and
    artifacts (every sub-run's), and with on_target its commits on its host."""

    run_id: str
    on_target: bool = False
    host: str | None = None  # with run_id `last`: the newest run on this host


@dataclass(frozen=True)
class Verified:
    """What verifying found: each problem (a fleet's: `HOST: problem`), the hosts whose history could not be read
    and why, and with on_target what each target vouched for. A tampered log (5) outweighs a host whose history
    could not be read (4, as for a single run)."""

    run_id: str
    problems: list[str]
    unreachable: dict[str, str]
    vouched: dict[str, list[str]] | None

    @property
    def errors(self) -> list[str]:
        return self.problems + [f"{host}: not verified against the target: {why}"
                                for host, why in self.unreachable.items()]

    @property
    def exit_code(self) -> int:
        return 5 if self.problems else 4 if self.unreachable else 0

    def document(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "problems": self.problems, "unreachable": self.unreachable,
                "exit_code": self.exit_code, "error": "; ".join(self.errors) or None,
                **({"on_target": self.vouched} if self.vouched is not None else {})}


def verify(options: VerifyOptions, *, listener: Listener | None = None) -> Verified:
    """Verify as options say; a host that cannot be reached for a single run raises its ConnectError."""
    from deployer import runlog
    from deployer.app.setting import build_of
    from deployer.fleet.followup import verify_fleet

    build = build_of(options, listener)
    vouched: dict[str, list[str]] = {}  # host -> what its target vouched for

    def verify_one(runs_path: Path, one: str) -> list[str]:
        found = runlog.verify(runs_path, one)
        if options.on_target:
            from deployer.run import rollback as rollbacks
            run = runlog.read_run(runs_path, one)
            checked = vouched.setdefault(str(run.start.get("host")), [])
            found += rollbacks.verify_on_target(build.for_run(run), run, checked)
        return found

    unreachable: dict[str, str] = {}
    run_id = shown_run(build.runs_dir, options.run_id, options.host)
    if is_fleet(build.runs_dir, run_id):
        per_host, unreachable = verify_fleet(build.runs_dir, run_id, verify_one)
        problems = [f"{host}: {problem}" for host, found in per_host.items() for problem in found]
    else:
        problems = verify_one(build.runs_dir, run_id)
    return Verified(run_id, problems, unreachable, vouched if options.on_target else None)
