"""A unit: services on different hosts (prefill on one node, decode on another, the router on a third)
deployed and restarted as one, on top of one Engine (one sub-run, lock, state, log, trailer) per host.

Each host's run is its own `Engine.execute`, in its own thread; the unit moves them through phases meeting at a barrier:
1. locks, taken one host after the other in sorted host order (two overlapping runs meet on the same
   first host: one proceeds, the other stops before it holds anything else);
2. every host's chain up to its commit (preflight, upload, compile, bounds);
3. every host's commit;
4. the unit's restart and checks, done by the first host's thread on every host's connection while the
   others wait: stop in reverse unit order, start in unit order (each healthy before the next starts),
   then the checks (baseline, storm, drain) against the unit's metrics host.
A failure before the commits restores every host; a failure after them rolls back every host of the unit
(`on_failure: rollback` or `rollback_fleet`) and restarts the unit again, or keeps every commit and says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from deployer.config.models import Unit
from deployer.errors import (
    AnalysisInconclusive,
    ChecksFailed,
    DeployerError,
    Interrupted,
    RollbackFailed,
    StepFailed,
    VerificationFailed,
)
from deployer.fleet.router import Routers, UnitRouting
from deployer.run import undo
from deployer.run.engine import VERIFY, Engine, RunResult
from deployer.run.revert_checks import NotRun, failed_check, recorded_baseline
from deployer.run.rollback import Target, check, check_recorded, finish_hint, link_rollback
from deployer.run.standing import left_down
from deployer.runlog import Run, RunLogWriter, utc_now
from deployer.runstate import Phase
from deployer.steps.base import Effect, Scope, Step
from deployer.steps.context import Context
from deployer.steps.gitops import head
from deployer.steps.optional import spanning
from deployer.waiting import joined, waited

Body = Callable[[Context, RunLogWriter], None]

ABORTED = "another host of the unit failed"  # how a host stopped by another host's failure says so


class UnitAborted(DeployerError):
    """Another host of the unit failed: this host stops too (restored, or rolled back with the unit)."""


def steps_for(steps: list[Step], name: str, unit: Unit, host: str) -> list[Step]:
    """The steps a host of a unit runs in its own run: the unit's checks only on its metrics host, and
    co_restart as its part of the unit's restart."""
    kept: list[Step] = []
    for step in steps:
        if step.scope == Scope.unit:
            spans = spanning(step)
            kept.append(spans.part([s for h, s in spans.members_in(name, unit.members()) if h == host]))
        elif step.scope == Scope.each_host or host == (unit.metrics or unit.hosts()[0]):
            kept.append(step)
    return kept


def alone(name: str, unit: Unit, engine: Engine, routers: Routers, *, restart: bool = False,
          rollback_of: Run | None = None, force: bool = False) -> RunResult:
    """One host behind a router (a plain host's unit of one, a unit on one host, or one host's part of a unit) run as
    its unit, so that it leaves the router and comes back as a unit does, its failures handled the same way: its
    apply (restart: its `deployer restart`; rollback_of: `deployer rollback` of that run), and that host's result."""
    engines = {engine.host_name: engine}
    run = UnitRun(name, unit, engines, "restore" if restart or rollback_of else engine.playbook.model.on_failure,
                  routing=routers.for_unit(name, unit, engines))
    if rollback_of is not None:
        return run.rollback({engine.host_name: rollback_of}, force=force)[engine.host_name]
    return (run.restart_only() if restart else run.run())[engine.host_name]


@dataclass
class UnitRun:
    name: str
    unit: Unit
    engines: dict[str, Engine]  # every host of the unit
    on_failure: str
    ctxs: dict[str, Context] = field(default_factory=dict)
    # The unit's workers behind its router (made from every host's context once they meet), taken out around the
    # restart of an apply.
    routing: Callable[[dict[str, Context]], UnitRouting] | None = None
    failure: DeployerError | None = None  # the post-commit outcome, set by the leader for every host
    through: set[str] = field(default_factory=set)  # hosts past the last meeting

    @property
    def hosts(self) -> list[str]:
        return sorted(self.engines)  # the canonical order: locks, threads, and the leader

    @property
    def unchanged(self) -> bool:
        """Every host of the unit already holds the fix (known once every host prepared): the unit changes nothing,
        and restarts only when asked (`apply --restart`). One that changes elsewhere restarts the unit as one,
        these hosts too: co_restart is one restart across the unit's hosts, never a part of it."""
        return len(self.ctxs) == len(self.engines) and all(c.facts.already_applied for c in self.ctxs.values())

    @property
    def metrics_host(self) -> str:
        return self.unit.metrics or self.unit.hosts()[0]

    def run(self, on_result: Callable[[str, RunResult], None] | None = None) -> dict[str, RunResult]:
        """Apply on every host of the unit; a host whose lock was never tried has no result (never touched)."""
        return self._drive(self._body, {}, on_result)

    def rollback(self, runs: dict[str, Run], *, force: bool, held: Collection[str] = (),
                 on_result: Callable[[str, RunResult], None] | None = None) -> dict[str, RunResult]:
        """Roll back the unit's sub-runs of one fleet run: every host reverted, then one unit restart and
        the unit's checks again; each original run gets its rolled_back_by link, as a single rollback does.
        held: the hosts whose runs made no commit, as they held the fix already; nothing of theirs is reverted, and
        they restart with the unit (a run of kind restart), as they did with its apply."""
        baseline = recorded_baseline(runs[self.metrics_host]) if self.metrics_host in runs else {}
        again = next(run.run_id for host, run in sorted(runs.items()) if host not in held)  # what a hint names
        results = self._drive(lambda host, barrier, locked: self._rollback_body(
            host, None if host in held else runs[host], barrier, locked, force, baseline, again),
            {host: {"kind": "restart"} if host in held else {"rollback_of": run.run_id} for host, run in runs.items()},
            on_result)
        for host, result in results.items():
            if host not in held:
                link_rollback(runs[host], result.run_id, result.status, result.phase, result.git_after)
        return results

    def restart_only(self, on_result: Callable[[str, RunResult], None] | None = None) -> dict[str, RunResult]:
        """`deployer restart --host UNIT`: every host locked, then the unit's restart and checks as one, as after
        its commits (no file changes); each host's run is of kind restart."""
        return self._drive(self._restart_body, {host: {"kind": "restart"} for host in self.hosts}, on_result)

    def _restart_body(self, host: str, barrier: threading.Barrier, locked: threading.Event) -> Body:
        def body(ctx: Context, log: RunLogWriter) -> None:
            self.ctxs[host] = ctx
            locked.set()
            ctx.git_before = head(ctx)
            self._meet(barrier, ctx, "every host of the unit locked")
            if host == self.hosts[0]:
                self._restart_as_is(self.engines[self.metrics_host].steps)
            barrier.wait()
            self.through.add(host)
            if self.failure is not None:
                raise self.failure
        return body

    def _restart_as_is(self, steps: list[Step]) -> None:
        """The unit restarted and checked on the code it holds (`deployer restart`, `apply --restart` of a fix every
        host already holds), by the leader; a failure is every host's."""
        try:
            self._routed(steps)
        except DeployerError as failure:
            # No file changed: every host's record ends settled, whatever its services do now.
            for one in self.ctxs.values():
                assert one.record is not None
                one.bus.step = None
                one.record.advance(Phase.failed_restored, utc_now(), error=str(failure))
            self.failure = failure if isinstance(failure, Interrupted) else VerificationFailed(
                f"unit {self.name}: {failure}\n" + "\n".join(
                    left_down(c, [s for h, s in self.unit.members() if h == c.host_name])
                    for c in self.ctxs.values()))

    def _drive(self, make_body: Callable[[str, threading.Barrier, threading.Event], Body],
               start: dict[str, dict[str, Any]],
               on_result: Callable[[str, RunResult], None] | None) -> dict[str, RunResult]:
        """One thread per host, started in sorted order, each once the one before holds its lock."""
        barrier = threading.Barrier(len(self.hosts))
        results: dict[str, RunResult] = {}
        threads = []
        for host in self.hosts:
            locked = threading.Event()

            def work(host: str = host, locked: threading.Event = locked) -> None:
                try:
                    results[host] = self.engines[host].execute(make_body(host, barrier, locked),
                                                               **start.get(host, {}))
                finally:
                    # A host that ends before the last meeting (refused its lock, failed, a bug) wakes every
                    # host waiting for it. After it, an abort could break a host not yet woken from it.
                    if host not in self.through:
                        barrier.abort()
                    locked.set()
                if on_result is not None:
                    on_result(host, results[host])

            thread = threading.Thread(target=work, name=f"deployer-unit-{host}")
            thread.start()
            threads.append(thread)
            waited(locked.wait)  # this host holds its lock (or failed to) before the next host tries its own
            if barrier.broken:
                break
        for thread in threads:
            joined(thread)
        return results

    def _rollback_body(self, host: str, run: Run | None, barrier: threading.Barrier, locked: threading.Event,
                       force: bool, baseline: Mapping[str, float], again: str) -> Body:
        """run: the host's run to roll back (None: the host held the fix, it only restarts with the unit); again: the
        run a rollback that stopped names to finish it."""
        target = Target.of(run) if run is not None else None

        def body(ctx: Context, log: RunLogWriter) -> None:
            self.ctxs[host] = ctx
            locked.set()
            try:
                # As deployer.run.rollback.rollback checks, before any host of the unit changes.
                ctx.git_before = head(ctx)
                if run is not None and target is not None:
                    check_recorded(ctx, run, target)
                    check(ctx, target, force=force)
                    ctx.facts.files = target.files
            except DeployerError:
                barrier.abort()
                raise
            self._meet(barrier, ctx, "every host of the unit was checked")
            assert ctx.record is not None
            with ctx.cancel.finishing_first(f"unit {self.name}'s rollback") as ctx.cancel:
                if run is not None and target is not None:
                    ctx.record.advance(Phase.rolling_back, utc_now(), git_before=ctx.git_before)
                    try:
                        revert = self.engines[host].revert_commit(ctx, before=target.before, dests=target.files,
                                                                  rollback_of=run.run_id)
                        # When an earlier attempt already made the revert commit, this run made none of its own.
                        ctx.git_after = revert if revert != ctx.git_before else None
                    except DeployerError:
                        barrier.abort()
                        raise
                self._meet(barrier, ctx, "every host of the unit reverted", reverted=run is not None)
                if host == self.hosts[0]:
                    checks, left_out = self._reverted(baseline)
                    try:
                        self._routed(checks, prefix="rollback:")
                        self._not_run(left_out)
                    except (StepFailed, VerificationFailed) as exc:  # every host's revert stands
                        self.failure = ChecksFailed(
                            f"unit {self.name}: {exc}\nEvery host's revert stands; the reverted build failed a check. "
                            "A rollback again would not change the old build: `deployer check --host "
                            f"{self.name}` shows the unit now, `deployer restart --host {self.name}` restarts it",
                            commit=None, checks=[failed_check(exc)])
                    except DeployerError as exc:
                        self.failure = RollbackFailed(f"unit {self.name}: the restart after the revert stopped: {exc}\n"
                                                      f"{finish_hint(exc, again)}")
                barrier.wait()
                self.through.add(host)
                if self.failure is not None:
                    raise self.failure
        return body

    def _body(self, host: str, barrier: threading.Barrier, locked: threading.Event) -> Body:
        engine = self.engines[host]
        commit_at = next(i for i, s in enumerate(engine.steps) if s.effect == Effect.commits)
        before, commit = engine.steps[:commit_at], engine.steps[commit_at:commit_at + 1]

        def body(ctx: Context, log: RunLogWriter) -> None:
            self.ctxs[host] = ctx
            locked.set()
            self._meet(barrier, ctx, "every host of the unit locked")
            try:
                engine.prepare(ctx, log)
            except DeployerError:
                barrier.abort()
                raise
            self._meet(barrier, ctx, "every host of the unit prepared")
            kept = ctx.facts.already_applied
            if kept:
                ctx.emit("unchanged", files=ctx.facts.unchanged, head=ctx.git_before,
                         restart=engine.restart or not self.unchanged)
            try:
                # A host already holding the fix ships and commits nothing; in a unit that changes elsewhere it
                # still takes the unit's checks before the commits (a baseline on its metrics host).
                engine.run_steps(ctx, [s for s in before if s.scope == Scope.metrics_host and not self.unchanged]
                                 if kept else before)  # a failure restores this host and raises
            except DeployerError:
                barrier.abort()
                raise
            self._meet(barrier, ctx, "every host of the unit shipped and within bounds")
            try:
                engine.run_steps(ctx, [] if kept else commit)
            except DeployerError:
                barrier.abort()
                raise
            self._meet(barrier, ctx, "every host of the unit committed")
            if host == self.hosts[0]:
                if not self.unchanged:
                    self._after_commits()
                elif engine.restart:
                    self._restart_as_is([s for s in self._post_steps() if s.effect in VERIFY])
            barrier.wait()  # the leader has restarted, checked (and maybe rolled back) the whole unit
            self.through.add(host)
            if self.failure is not None:
                raise self.failure
        return body

    def _meet(self, barrier: threading.Barrier, ctx: Context, what: str, *, reverted: bool = False) -> None:
        """Wait for the other hosts; when one of them failed, undo this host as its own failure would."""
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            failure = UnitAborted(f"unit {self.name}: stopped before {what}: {ABORTED}")
            if reverted:  # a rollback: this host's revert stays; the unit was not restarted onto it
                raise RollbackFailed(f"{failure}\nThis host's files were reverted, but the unit was not restarted; "
                                     "run the rollback again to finish it") from None
            engine, record = self.engines[ctx.host_name], ctx.record
            assert record is not None
            if record.state.git_after is None:
                engine.restore(ctx, failure)
                raise failure from None
            # Committed while another host could not; no service was restarted yet, so none is again.
            raise self._settle_failure([ctx], failure, []) from None

    # -- after every host committed: the leader works on every host's connection ------------------

    def _after_commits(self) -> None:
        ctxs = [self.ctxs[h] for h in self.hosts]
        post = self._post_steps()
        out, back = self._split(post)
        routing: UnitRouting | None = None
        restarted = False
        try:
            if self.routing is not None:
                routing = self.routing(self.ctxs)  # may connect to the router's host
                routing.take_out()  # no request reaches a worker that is about to stop
            restarted = True
            self._run_unit_steps(out)
            if routing is not None:
                routing.put_back()
            self._run_unit_steps(back)
        except DeployerError as failure:
            # A check through the router failed with the new workers back in it: out again before anything
            # restarts them (or while they stay on the failed change).
            again = self._take_out_again(routing) if routing is not None and restarted and not routing.out else None
            # A rollback's steps as a manual one's (the restart and the drain, never a storm); while the unit is out,
            # its canary's request through the router waits until the old workers are back in it.
            verify, left_out = self._reverted(self.ctxs[self.metrics_host].facts.baseline)
            redo, redo_back = self._split(verify) if routing is not None and routing.out else (verify, [])
            self.failure = self._settle_failure(ctxs, failure, redo)
            # An inconclusive analysis holds its commit: no rollback ran, so none left a check out.
            if self.on_failure in ("rollback", "rollback_fleet") and \
                    not isinstance(self.failure, (RollbackFailed, AnalysisInconclusive)):
                self._not_run(left_out)
            if again is not None:
                self.failure = type(self.failure)(f"{self.failure}\n{again}")
            if routing is not None and routing.out:
                rolled_back = self.on_failure in ("rollback", "rollback_fleet") and not isinstance(
                    self.failure, RollbackFailed)
                self.failure = self._after_failure(routing, self.failure, on_new_code=restarted and not rolled_back,
                                                   then=redo_back if rolled_back else [])
            return
        finally:
            if routing is not None:
                routing.close()
        for ctx in ctxs:
            ctx.bus.step = None

    @staticmethod
    def _take_out_again(routing: UnitRouting) -> str | None:
        """The unit's workers out of the router again (removed, unlisted, drained); what went wrong, if anything."""
        try:
            routing.take_out()
        except DeployerError as exc:
            return f"Taking the unit out of router {routing.client.name} again failed: {exc}"
        return None

    def _run_unit_steps(self, steps: list[Step], prefix: str = "") -> None:
        for step in steps:
            self._run_unit_step(step, prefix)

    def _routed(self, steps: list[Step], prefix: str = "") -> None:
        """A restart onto code the workers served before (`restart`, a rollback's): the unit out of its router
        around it (a canary's request through the router once it is back); after a failure while out its workers
        go back (unhealthy ones too) and the failure says so."""
        out, back = self._split(steps)
        if self.routing is None:
            self._run_unit_steps(out, prefix)
            return
        routing = self.routing(self.ctxs)  # may connect to the router's host
        try:
            routing.take_out()
            self._run_unit_steps(out, prefix)
            routing.put_back()
            if (problem := self._asked_back_in(routing, back, prefix)) is not None:
                raise VerificationFailed(problem)
        except DeployerError as failure:
            raise self._after_failure(routing, failure, on_new_code=False) if routing.out else failure from None
        finally:
            routing.close()

    def _split(self, steps: list[Step]) -> tuple[list[Step], list[Step]]:
        """The steps run while the unit is out of its router, and those through it once it is back and listed."""
        if self.routing is None:
            return steps, []
        from deployer.steps.canary import around_router  # step kinds load on demand (steps/kinds.py)

        return around_router(steps)

    def _asked_back_in(self, routing: UnitRouting, steps: list[Step], prefix: str) -> str | None:
        """The checks through the router once the workers of a restart onto the code they served before (a restart's,
        a rollback's) are back in it and listed; when one fails, what to say: they stay in, on that code."""
        try:
            self._run_unit_steps(steps, prefix)
        except DeployerError as exc:
            router, build = routing.client.name, "the old build" if prefix else "the build they served"
            return (f"The old workers are back in router {router}, but the {'rollback' if prefix else 'restart'}'s "
                    f"check through it failed: {exc}\nThe unit stays in router {router} on {build}: a person must look")
        return None

    def _after_failure(self, routing: UnitRouting, failure: DeployerError, *, on_new_code: bool,
                       then: list[Step] | None = None) -> DeployerError:
        """The unit's workers go back into the router once they serve the old code again (never restarted, or
        restarted by the rollback: then its checks through it); a unit left on the new code stays out, said so."""
        router = routing.client.name
        if on_new_code:
            return type(failure)(f"{failure}\nThe unit stays out of router {router} (its workers may serve the "
                                 "failed change); put them back by hand once they serve")
        try:
            routing.put_back(healthy=False)
        except DeployerError as exc:
            return type(failure)(f"{failure}\nPutting the old workers back into router {router} failed too: {exc}")
        if (problem := self._asked_back_in(routing, then or [], "rollback:")) is not None:
            return RollbackFailed(f"{failure}\n{problem}")
        return type(failure)(f"{failure}\nThe old workers are back in router {router}")

    def _reverted(self, baseline: Mapping[str, float]) -> tuple[list[Step], list[NotRun]]:
        """The restarts and checks a rollback runs again, as they judge the reverted build (run/revert_checks.py),
        and the checks it leaves out (said by _not_run once the others ran)."""
        chosen = self.engines[self.metrics_host].revert_checks.choose(
            [s for s in self._post_steps() if s.effect in VERIFY], baseline)
        return [s for s in chosen if not isinstance(s, NotRun)], [s for s in chosen if isinstance(s, NotRun)]

    def _not_run(self, left_out: list[NotRun]) -> None:
        """The checks a rollback left out, logged as not run on the unit's metrics host (never as passed)."""
        host = self.metrics_host
        for left in left_out:
            self.engines[host].not_run(self.ctxs[host], left)

    def _post_steps(self) -> list[Step]:
        """The playbook's steps after the commit, in order (from the metrics host, which has them all)."""
        steps = self.engines[self.metrics_host].steps
        commit_at = next(i for i, s in enumerate(steps) if s.effect == Effect.commits)
        return steps[commit_at + 1:]

    def _run_unit_step(self, step: Step, prefix: str = "") -> None:
        if not prefix:  # a rollback stays in rolling_back through its restart and checks
            for host in self.hosts:
                self.engines[host].enter(self.ctxs[host], step.effect)
        if step.scope == Scope.unit:
            self.restart(step, prefix + step.name)
        elif step.scope == Scope.metrics_host:
            host = self.metrics_host
            self.engines[host].run_step(self.ctxs[host], step, prefix + step.name)
        else:
            for host in self.hosts:
                self.engines[host].run_step(self.ctxs[host], step, prefix + step.name)

    def restart(self, step: Step, name: str) -> None:
        """A step of scope unit (co_restart) across the unit's hosts, through the same code as on one host; every
        host it involves gets its own step_start and step_end, and the unit's name on its events."""
        spans = spanning(step)
        members = [(self.ctxs[host], service) for host, service in spans.members_in(self.name, self.unit.members())
                   if host in self.ctxs]
        involved = list(dict.fromkeys(ctx.host_name for ctx, _ in members))
        started = time.monotonic()
        for host in involved:
            self.ctxs[host].bus.step = name
            self.ctxs[host].emit("step_start", kind=step.kind, unit=self.name)
        try:
            summaries = spans.across(members, name, self.unit.gang_leader(), unit=self.name)
        except DeployerError as exc:
            for host in involved:
                self._end_step(host, "failed", started, error=str(exc))
            raise
        for host in involved:
            self._end_step(host, "ok", started, summary=summaries[host])

    def _end_step(self, host: str, status: str, started: float, **detail: str) -> None:
        ctx = self.ctxs[host]
        ctx.emit("step_end", status=status, duration_s=round(time.monotonic() - started, 3), **detail)
        ctx.bus.step = None

    def _settle_failure(self, ctxs: list[Context], failure: DeployerError, redo: list[Step]) -> DeployerError:
        """After the commits: the whole unit rolled back and restarted again (redo), or keeping every commit, as one
        host's run is (run/undo.py). A host that already held the fix made no commit: nothing of it is reverted."""
        def again() -> None:
            try:
                self._run_unit_steps(redo, "rollback:")
            except (StepFailed, VerificationFailed) as exc:  # every revert stands: rolled back, the check named
                raise ChecksFailed(str(exc), commit=None, checks=[failed_check(exc)]) from None
        return undo.after_commit_failure(
            [self.engines[ctx.host_name].past(ctx) for ctx in ctxs], failure,
            rollback=self.on_failure in ("rollback", "rollback_fleet"), again=again,
            restarts=any(step.effect == Effect.restarts for step in redo), unit=self.name)
