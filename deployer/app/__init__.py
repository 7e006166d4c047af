"""The use cases behind the commands, and deployer's Python API: the command line's only way into the core (see
DESIGN.md), and the same calls a CI job or a notebook makes.

    from deployer import app

    outcome = app.apply(app.ApplyOptions(playbook="fix.yaml", host="gpu-node"))
    print(outcome.run_id, outcome.changed, outcome.exit_code)
    app.rollback(app.RollbackOptions(run_id=outcome.run_id))

Each use case takes its typed options (frozen dataclasses; Setting's fields name the inventory, the runs dir and
the host-key choice) and returns an outcome: its `exit_code` (what the command exits with), `changed` where it
ran something, its `run_id` where it is recorded, and `document()`, the JSON object the command's --json prints.

    apply(ApplyOptions)          RunOutcome (one host), FleetOutcome (several), PlanOutcome (dry_run)
    plan(PlanOptions)            PlanOutcome: each host's actions as data, the downtime
    rollback(RollbackOptions)    RunOutcome, FleetOutcome; deploys(DeploysOptions): a host's deployer commits
    recover(RecoverOptions)      RecoveredRun, FleetOutcome, NothingToRecover
    check(CheckOptions)          GroupReport: a report per host, every check a row
    restart(RestartOptions)      RunOutcome, HostsOutcome (a group in turn, a unit as one)
    read_logs(LogOptions)        LogsOutcome; service_logs(LogOptions).follow(show, stop) follows them
    init(InitOptions)            Made: the playbook written from a local change
    history, recorded, verify    the recorded runs: listed, one shown, its log verified
    lock_status, release_lock    the deploy lock on a host; record_golden: a canary's golden answer
    bake(BakeOptions)            Baked: a succeeded run's commit as a patch and a Dockerfile layer on its image

Failures, one rule: a use case RAISES the typed DeployerError of deployer.errors (each carries its exit code:
ConfigError 2, ConnectError 4...) for a refusal before any run started, when nothing was recorded (a config that
does not load, an unknown host or run, downtime not allowed). Once a run started, it RETURNS its outcome, a
failed or refused one too (the lock held: exit 3; a step that failed and was restored: 1; a check that failed
after the commit: 5): its run log and record hold the rest, under the outcome's run_id.

Events: `listener` (any callable taking an event dict) hears every event of the engines and connections the use
case makes, and the notices it has for the operator (a notice event: which run `last` chose, a run that never
ended); `watch` is handed each run as it starts (app.watch.Watched: its hosts, its cancel token, its listeners)
and the run goes on inside the context it returns: the command line draws its live view and turns signals into
the token's cancel there. Both may be left out.

The names below load on first use, so that `import deployer.app` (and `deployer --help`) stays cheap; each
use case's module is named apart from its function (app.restart is restarts.restart), so that importing the
module never hides the function."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deployer.app.applies import ApplyOptions, apply
    from deployer.app.bakes import Baked, BakeOptions, bake
    from deployer.app.checks import CheckOptions, CheckReport, GroupReport, check
    from deployer.app.golden import Golden, GoldenOptions, record_golden
    from deployer.app.locks import LockOptions, LockReleased, LockStatus, lock_status, release_lock
    from deployer.app.logs import LogOptions, LogsOutcome, LogText, ServiceLogs, read_logs, service_logs
    from deployer.app.outcome import FleetOutcome, HostsOutcome, RunOutcome
    from deployer.app.plans import HostPlan, PlanOptions, PlanOutcome, plan
    from deployer.app.recovery import NothingToRecover, RecoveredRun, RecoverOptions, recover
    from deployer.app.restarts import RestartOptions, restart
    from deployer.app.rollbacks import DeploysOptions, DeploysOutcome, RollbackOptions, deploys, rollback
    from deployer.app.runs import History, HistoryOptions, Recorded, Verified, VerifyOptions, history, recorded, verify
    from deployer.app.scaffold import InitOptions, Made, init
    from deployer.app.setting import Setting
    from deployer.app.watch import Watch, Watched

# name -> the module of this package that defines it
_EXPORTS = {
    "Setting": "setting", "Watch": "watch", "Watched": "watch",
    "RunOutcome": "outcome", "FleetOutcome": "outcome", "HostsOutcome": "outcome",
    "restart": "restarts", "RestartOptions": "restarts",
    "rollback": "rollbacks", "RollbackOptions": "rollbacks", "deploys": "rollbacks", "DeploysOptions": "rollbacks",
    "DeploysOutcome": "rollbacks",
    "apply": "applies", "ApplyOptions": "applies",
    "plan": "plans", "PlanOptions": "plans", "PlanOutcome": "plans", "HostPlan": "plans",
    "check": "checks", "CheckOptions": "checks", "GroupReport": "checks", "CheckReport": "checks",
    "read_logs": "logs", "service_logs": "logs", "LogOptions": "logs", "LogsOutcome": "logs", "LogText": "logs",
    "ServiceLogs": "logs",
    "history": "runs", "HistoryOptions": "runs", "History": "runs", "recorded": "runs", "Recorded": "runs",
    "verify": "runs", "VerifyOptions": "runs", "Verified": "runs",
    "lock_status": "locks", "release_lock": "locks", "LockOptions": "locks", "LockStatus": "locks",
    "LockReleased": "locks",
    "record_golden": "golden", "GoldenOptions": "golden", "Golden": "golden",
    "init": "scaffold", "InitOptions": "scaffold", "Made": "scaffold",
    "recover": "recovery", "RecoverOptions": "recovery", "RecoveredRun": "recovery", "NothingToRecover": "recovery",
    "bake": "bakes", "BakeOptions": "bakes", "Baked": "bakes",
}

__all__ = [
    "ApplyOptions",
    "BakeOptions",
    "Baked",
    "CheckOptions",
    "CheckReport",
    "DeploysOptions",
    "DeploysOutcome",
    "FleetOutcome",
    "Golden",
    "GoldenOptions",
    "GroupReport",
    "History",
    "HistoryOptions",
    "HostPlan",
    "HostsOutcome",
    "InitOptions",
    "LockOptions",
    "LockReleased",
    "LockStatus",
    "LogOptions",
    "LogText",
    "LogsOutcome",
    "Made",
    "NothingToRecover",
    "PlanOptions",
    "PlanOutcome",
    "Recorded",
    "RecoverOptions",
    "RecoveredRun",
    "RestartOptions",
    "RollbackOptions",
    "RunOutcome",
    "ServiceLogs",
    "Setting",
    "Verified",
    "VerifyOptions",
    "Watch",
    "Watched",
    "apply",
    "bake",
    "check",
    "deploys",
    "history",
    "init",
    "lock_status",
    "plan",
    "read_logs",
    "record_golden",
    "recorded",
    "recover",
    "release_lock",
    "restart",
    "rollback",
    "service_logs",
    "verify",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # once: the next lookup finds it here
    return value
