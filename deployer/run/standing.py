"""What a failed run's message says the target has now, read from it: its HEAD and each service's process, and
which services are down with the exact command that brings them back."""

from __future__ import annotations

import contextlib
import shlex

from deployer.errors import DeployerError
from deployer.run import serving
from deployer.steps.context import Context
from deployer.steps.gitops import HEAD
from deployer.text import shown


def target_state(ctx: Context) -> str:
    """Where the target stands now, read from it, for a message that must say what was left."""
    from deployer.steps import services  # every manager and its transports: only a failed run reads them

    try:
        head = ctx.run(HEAD, timeout=30).out.strip() or "unknown"
        notes = {ctx.git_before: "the commit before the run", ctx.git_after: "this run's commit",
                 ctx.facts.rollback_commit: "the revert commit"}
        parts = [f"Target now: HEAD {head[:12]} ({notes.get(head, 'not made by this run')})"]
        started = _started(ctx)
        for name in ctx.host.services:
            pid = services.manager_for(ctx, name).pid()
            parts.append(f"{name} {'pid ' + str(pid) if pid else 'not running'}{started.get((name, pid), '')}")
    except DeployerError as exc:
        return f"The target's state could not be read: {exc}"
    return ", ".join(parts) + "."


def _started(ctx: Context) -> dict[tuple[str, int | None], str]:
    """Which build each process this run started runs, by (service, pid), as its own log says so far: HEAD alone
    does not say it (a restart stopped half way leaves a process of the commit beside the revert)."""
    if ctx.record is None:
        return {}
    with contextlib.suppress(DeployerError, OSError, ValueError):  # a log that cannot be read says nothing more
        run = serving.logged(ctx.record.dir.parent, ctx.run_id)
        return {**{(name, pid): " (started on this run's commit)" for name, pid in serving.started(run, False).items()},
                **{(name, pid): " (started on the revert)" for name, pid in serving.started(run, True).items()}}
    return {}


def left_down(ctx: Context, services: list[str]) -> str:
    """Which of services are down now (read on the target), and the exact command that brings them back."""
    from deployer.steps.services import manager_for  # every manager and its transports: only a failure reads them

    down: dict[str, str] = {}
    for name in services:
        try:
            seen = manager_for(ctx, name).observe()
        except DeployerError as exc:
            down[name] = f"not observed: {shown(str(exc))}"
            continue
        if seen.health is False or (seen.health is None and seen.pid is None):
            down[name] = seen.describe()
    if not down:
        return f"Every service answers its health check now ({', '.join(services)})."
    again = shlex.join(["deployer", "restart", "--host", ctx.host_name, *down])
    return (f"Down on {ctx.host_name}: {'; '.join(f'{n} ({why})' for n, why in down.items())}. "
            f"Bring them back with: {again}")
