"""`deployer restart`: the services of a host restarted with every proof co_restart gives, as a run of its own
(its lock, record and log: kind restart), changing no file; and what recover says when services stay down.

The run's playbook is made here: one co_restart over the chosen services, then the checks (effect verifies) a
playbook given with -p runs after its commit. Its copy in the run dir is that playbook, so the run's record
is complete (`runs verify --target` loads it like any other)."""

from __future__ import annotations

from pathlib import Path

import yaml

from deployer.config.models import Playbook
from deployer.errors import DeployerError, Interrupted, VerificationFailed
from deployer.run.engine import Engine, RunResult
from deployer.run.standing import left_down
from deployer.runlog import RunLogWriter, utc_now
from deployer.runstate import Phase
from deployer.steps.base import Effect, Step
from deployer.steps.context import Context, LoadedPlaybook
from deployer.steps.gitops import head
from deployer.steps.playbook import parse_playbook
from deployer.steps.services.co_restart import CoRestart, CoRestartParams, services_restarted

WHERE = "(deployer restart)"


def restart_playbook(services: list[str], checks_from: Path | None, *, name: str = "restart",
                     description: str = "") -> tuple[LoadedPlaybook, list[Step]]:
    """The playbook a restart (or a recover that restarts) runs: co_restart over services (none: no restart),
    then the post-commit checks of the playbook at checks_from, with its co_restart's budget."""
    timeout_s, checks = CoRestartParams().timeout_s, []
    if checks_from is not None:
        _, steps, _ = parse_playbook(checks_from)
        restarts = [s for s in steps if s.effect == Effect.restarts]
        if restarts:
            timeout_s = restarts[0].timeout_s
        commit_at = next((i for i, s in enumerate(steps) if s.effect == Effect.commits), -1)
        checks = [s for s in steps[commit_at + 1:] if s.effect == Effect.verifies]
    restart = [CoRestart(CoRestartParams(services=services, timeout_s=timeout_s), "co_restart", WHERE)]
    chain: list[Step] = [*(restart if services else []), *checks]
    data = {"name": name, "description": description,
            "steps": [{s.kind: s.params.model_dump(mode="json")} for s in chain]}
    raw = yaml.safe_dump(data, sort_keys=False)
    # With nothing to run (a recover on a host without services) no playbook loads; the copy still says so.
    model = Playbook.model_validate(data) if chain else Playbook.model_construct(
        name=name, description=description, files=[], patch=None, steps=[], on_failure="restore")
    # Its path names no file: what it ran is its copy in the run dir (playbook_sha256 is of those bytes).
    return LoadedPlaybook(path=Path(WHERE), raw=raw.encode(), model=model, sources={}, patch=None), chain


def restart(engine: Engine, services: list[str]) -> RunResult:
    """Run the engine's restart playbook under the host's lock; a failure names the services left down. The
    restart goes on to its end whatever a first signal asks (a second forces): a restart is this run's whole
    job, and one stopped between its stops and its starts is an outage nobody asked for. The checks after it
    stop at their safe points."""

    def body(ctx: Context, log: RunLogWriter) -> None:
        ctx.git_before = head(ctx)
        ctx.bus.step = None
        ctx.emit("status", status="running")
        try:
            for step in engine.steps:
                engine.enter(ctx, step.effect)
                if step.effect == Effect.restarts:
                    whole_restart(engine, ctx, step, "the restart")
                else:
                    engine.run_step(ctx, step, step.name)
        except DeployerError as failure:
            # Nothing was changed on disk: the record ends settled (its intent record cleared), whatever the
            # services do now; the message says which are down and how to try again (after a forced stop too).
            assert ctx.record is not None
            ctx.bus.step = None
            ctx.record.advance(Phase.failed_restored, utc_now(), error=str(failure))
            left = left_down(ctx, restarted_services(engine))
            if isinstance(failure, Interrupted):
                raise Interrupted(f"{failure}\n{left}") from None
            raise VerificationFailed(f"{failure}\n{left}") from None

    return engine.execute(body, kind="restart", services=services)


def restarted_services(engine: Engine) -> list[str]:
    """The services the engine's restart steps restart, in order."""
    return services_restarted(engine.steps, engine.host)


def whole_restart(engine: Engine, ctx: Context, step: Step, what: str) -> None:
    """A restart step run to its end whatever a first signal asks (a second forces the stop); that signal then
    stops the next step before it begins."""
    stop = ctx.cancel
    try:
        with stop.finishing_first(what) as ctx.cancel:
            engine.run_step(ctx, step, step.name)
    finally:
        ctx.cancel = stop
