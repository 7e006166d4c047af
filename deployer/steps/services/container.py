"""A service that is a container (`container:` in the inventory): its engine stops and starts it, and
`inspect`'s State.Pid and State.StartedAt prove the restart.

The engine is the host's, so State.Pid is a pid of the host's namespace: its /proc entry is read on the host
to see that it lives and what it runs. Usually the agent runs on the host. On a host whose `container:` is this
very service (the stock SGLang image: the server is the container's main process, the repo its editable
checkout), the agent runs inside it and its engine's stop ends that agent: the engine's commands, the /proc reads
and the log then go to an agent beside it on the host (transport/container.py), the health URL is still asked
from inside, and once the container runs again a new agent is started in it (Transport.reopen, which also resumes
the lock's heartbeat) before the health wait and the steps after the restart.

`stop -t stop_grace_s` sends TERM, then KILL after the grace (the engines' default of 10 s is too short for a
drain). A bare interpreter as PID 1, without an init, has no default action for TERM: it ignores it and every stop
ends in KILL, so that is warned about.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import time
from dataclasses import dataclass, replace

from deployer.agent.protocol import ExecResult
from deployer.command import container_inspect
from deployer.config.models import Service
from deployer.errors import AgentLost
from deployer.steps.action import Action, Bound
from deployer.steps.context import NOTHING, Context
from deployer.steps.services.manager import (
    PROBE_TIMEOUT_S,
    Manager,
    Observed,
    Phase,
    answered,
    pid_of,
    runs,
)
from deployer.text import visible
from deployer.transport.container import beside_container

# What as PID 1 ignores TERM: an interpreter or a shell with no handler of its own (an init forwards it).
BARE_PID1 = re.compile(r"^(?:python[\d.]*|node|ruby|perl|sh|bash|dash)$")
STOP_SLACK_S = 30.0  # the engine's own work around the grace (the KILL, the cleanup)


@dataclass(frozen=True)
class State:
    """What `inspect --format '{{json .State}}'` says, once it is the shape both engines print."""

    running: bool
    pid: int
    started_at: str

    @classmethod
    def of(cls, result: object) -> State | None:
        if not getattr(result, "ok", False):
            return None
        try:
            state = json.loads(getattr(result, "out", ""))
        except ValueError:
            return None
        if not isinstance(state, dict):
            return None
        running, pid, started = state.get("Running"), state.get("Pid"), state.get("StartedAt")
        if not (isinstance(running, bool) and type(pid) is int and pid >= 0 and isinstance(started, str)):
            return None
        return cls(running, pid, started)

    @property
    def live_pid(self) -> int | None:
        return self.pid if self.running and self.pid > 0 else None


# `deployer logs`: the container's output, both streams in the order written; without a cursor since this start
# (State.StartedAt; everything it kept when $3 is set), with one (a time on the host) what came after it. Each
# read ends at the host's time it began, the cursor it prints last on stderr.
READ = ('engine=$1; box=$2; whole=$3; lines=$4; at=$5; command -v "$engine" >/dev/null 2>&1 || exit 127; '
        'now=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ); set -- "$engine" logs --until "$now"; '
        'if [ -n "$at" ]; then set -- "$@" --since "$at"; elif [ -z "$whole" ]; then '
        'since=$("$engine" inspect --type container --format "{{json .State.StartedAt}}" "$box" 2>/dev/null) '
        '|| exit 3; since=${since#\\"}; set -- "$@" --since "${since%\\"}"; fi; '
        '[ -z "$lines" ] || set -- "$@" --tail "$lines"; "$@" "$box" 2>&1 || exit 1; echo "$now" >&2')


class ContainerManager(Manager):
    """A container: `<engine> stop -t GRACE` and `<engine> start`, proved by its main pid and start time."""

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        super().__init__(ctx, name, service, step, timeout)
        assert service.container is not None
        self.box = service.container
        engine, box = self.box.command, self.box.name
        # The container the agent runs in is this service (config.container.check_own_containers holds the rest).
        self.own = ctx.host.container is not None and ctx.host.container.name == box
        # What runs beside the container says so in the plan: the rest runs inside it, through the agent there.
        at = " (on the host)" if self.own else ""
        if self.own:
            self.host_side = beside(ctx)
            self.memory = replace(self.memory, what=self.memory.what + at)
        self.grace = math.ceil(service.stop_grace_s)  # the engines take whole seconds
        inspect = container_inspect(engine, box, "--format", "{{json .State}}")
        self.inspect = Action.run(f"{name}.inspect", f"read container {box}'s main pid and start time{at}", inspect)
        self.cmdline = Action.get(f"{name}.cmdline", f"what {pid_of(name)} runs (an init, or a bare interpreter){at}",
                                  f"/proc/{pid_of(name)}/cmdline", when="the container runs")
        self.stop_it = Action.run(f"{name}.stop", f"stop {name}: TERM, KILL after {self.grace}s{at}",
                                  (engine, "stop", "-t", str(self.grace), box), failure=f"{engine} stop {box} failed")
        # Its own service left stopped: the agent that would undo the run stopped with it.
        stays = (f" (the container stays stopped, and the run's agent in it with it: start it with `{engine} start "
                 f"{box}`, then `deployer recover` the run)") if self.own else ""
        self.start_it = Action.run(f"{name}.start", f"start {name}{at}", (engine, "start", box),
                                   failure=f"{engine} start {box} failed{stays}")
        self.up = Action.run(f"{name}.up", f"wait for container {box} to run{at}", inspect, repeats=True)
        # Its own service: the stop ended the agent in it; a new one in the restarted container, then its main
        # process (PID 1 in it) and health, from inside.
        self.reopen = Action(f"start a new agent in container {box} ({engine} exec -i {box} <python> ...; the stop "
                             "ended the one in it) and resume the deploy lock's heartbeat there", key=f"{name}.reopen")
        self.main = Action.get(f"{name}.main", f"container {box}'s main process (PID 1 in it) runs", "/proc/1/stat",
                               repeats=True)
        self.still = Action.run(f"{name}.still", f"container {box} still runs the same process{at}", inspect)
        # Both of the container's streams, in the order it wrote them: the engine hands its stderr (where a
        # server's traceback goes) back on its own stderr, which the failure's tail would not show.
        self._log = Action.run(f"{name}.log", f"the end of container {box}'s output (stdout and stderr){at}",
                               ("sh", "-c", 'exec "$0" logs --tail 40 "$1" 2>&1', engine, box), when=f"{name} fails")
        self.started: State | None = None  # what start() brought up

    @classmethod
    def manages(cls, service: Service) -> bool:
        return service.container is not None

    def observe_actions(self) -> list[Action]:
        return [self.inspect, self.cmdline, *([] if self.health is None else [self.health])]

    def stop_actions(self) -> list[Action]:
        return [self.stop_it]

    def free_actions(self) -> list[Action]:
        # Its own service: the health URL is the container's, asked through the agent its stop ended; nothing in
        # a stopped container answers it.
        return [] if self.own else super().free_actions()

    def start_actions(self) -> list[Action]:
        again = [self.reopen, self.main] if self.own else []
        return [self.start_it, self.up, *again, *([] if self.up_health is None else [self.up_health])]

    def tail_label(self) -> str:
        return f"{self.name}'s container output, stdout and stderr combined, its last 40 lines"

    def read_log(self, cursor: str, *, whole: bool, lines: int | None, most: int) -> Action:
        return Action.run(f"{self.name}.read_log", f"read {self.log_source(whole)}",
                          ("sh", "-c", READ, "deployer-read-log", self.box.command, self.box.name,
                           "1" if whole else "", "" if lines is None else str(lines), cursor))

    def log_source(self, whole: bool) -> str:
        return f"container {self.box.name}'s output{'' if whole else ' since this start'}"

    def log_tool(self) -> str:
        return f"the container engine {self.box.command}"

    def log_read(self, result: ExecResult) -> tuple[str, str, int]:
        text, cursor, _ = super().log_read(result)
        return text, cursor, result.out_stream.total - len(result.out_stream.kept)

    def observe(self, health: bool = True) -> Observed:
        engine = [(self.inspect, NOTHING)]
        ask = [(self.health, NOTHING)] if health and self.health is not None else []
        if self.own:  # the engine beside the container, the health URL from inside it: two agents
            results = [*self.host_side.act_all(engine, timeout=PROBE_TIMEOUT_S),
                       *(self.ctx.act_all(ask, timeout=PROBE_TIMEOUT_S) if ask else [])]
        else:
            results = self.ctx.act_all([*engine, *ask], timeout=PROBE_TIMEOUT_S)
        answer = answered(results[1]) if ask else None
        state = State.of(results[0])
        pid = None if state is None else state.live_pid
        if pid is None:
            return Observed(None, answer)
        # The engine's word, checked: a pid is a live process of this host only if its /proc entry is there.
        cmdline = self.host_side.act(self.cmdline, {pid_of(self.name): str(pid)}, timeout=PROBE_TIMEOUT_S)
        if cmdline is None:
            return Observed(None, answer)
        self._warn_bare(cmdline)
        return Observed(pid, answer)

    def _warn_bare(self, cmdline: bytes) -> None:
        argv = cmdline.split(b"\0")
        program = posixpath.basename(argv[0].decode(errors="replace"))
        if BARE_PID1.match(program) and self.warning is None:
            self.warning = (f"container {self.box.name}: PID 1 is "
                            f"{visible(program, multiline=False)!r} without an init: it ignores TERM, so every stop "
                            f"waits out stop_grace_s ({self.grace}s) and ends in KILL (run it with --init, tini or "
                            "dumb-init)")

    def stop(self, pid: int | None) -> str:
        if pid is None:
            return "the container is not running: nothing to stop"
        if self.warning:  # said once, by the stop it slows down (observe also runs for check and the preflight)
            self.ctx.emit("service_warning", service=self.name, warning=self.warning)
        # One phase for the whole stop: the engine itself sends TERM, waits the grace and KILLs.
        self.phase(Phase.stopping, time.monotonic(), self.grace, pid=pid,
                   detail=f"{self.box.engine} stop -t {self.grace}")
        self.host_side.act(self.stop_it, timeout=self.grace + STOP_SLACK_S)
        if self.own:  # recover looks for a cut run's agents by pid: this one is gone, whatever runs under its pid
            self.ctx.emit("agent_ended", why=f"{self.box.engine} stop {self.box.name} ended the agent in it")
        return f"stopped ({self.box.engine} stop -t {self.grace})"

    def answers_after_stop(self) -> bool:
        return not self.own and super().answers_after_stop()

    def start(self) -> int:
        self.host_side.act(self.start_it, timeout=self.timeout)
        if not self.own:
            state = State.of(self.wait_up(self.up, NOTHING))  # wait_up shows starting, loading and healthy
            assert state is not None and state.live_pid is not None, "wait_up returns once the container runs"
            self.started = state
            return state.live_pid
        self.started = self.running_again()
        self.ctx.transport.reopen()  # raises what the new exec met (the container stopped again at once)
        self.ctx.log_action(self.reopen, NOTHING, None)
        try:
            self.wait_up(self.main, NOTHING)  # from inside: its main process and health; shows the phases
        except AgentLost as lost:  # the container stopped under the new agent: the engine says so, and its log why
            again = State.of(self.host_side.act(self.still, timeout=PROBE_TIMEOUT_S))
            if again is not None and again.live_pid is not None:
                raise
            raise self.fail(f"container {self.box.name} stopped during start-up ({lost})") from None
        assert self.started.live_pid is not None, "running_again returns a running container"
        return self.started.live_pid

    def running_again(self) -> State:
        """Its own service: the engine's word that the container runs again, within health_timeout_s."""
        budget = self.service.health_timeout_s
        began = time.monotonic()
        with self.host_side.poll(PROBE_TIMEOUT_S) as poll:
            while (state := State.of(poll.round([(self.up, NOTHING)])[0])) is None or state.live_pid is None:
                if self.start_waited_out(began, budget):
                    raise self.fail(f"container {self.box.name} did not run within {budget:g}s of its start")
        return state

    def probed_pid(self, probed: object, bound: Bound) -> int | None:
        if self.own:  # the probe is PID 1 inside: the engine's State.Pid, read before, is the host's
            return None if self.started is None else self.started.live_pid
        state = State.of(probed)
        return None if state is None else state.live_pid

    def alive(self, probed: object, started: str | None) -> bool:
        if self.own:
            return isinstance(probed, bytes) and runs(probed)
        state = State.of(probed)
        return state is not None and state.live_pid is not None

    def still_runs(self, pid: int) -> bool:
        # The same pid and the same start: a container restarted by its restart policy has a new StartedAt.
        return State.of(self.host_side.act(self.still, timeout=PROBE_TIMEOUT_S)) == self.started


def beside(ctx: Context) -> Context:
    """ctx over the agent beside the container on its host: the same run, bus and facts; none of what the run sends
    behind its own agent's requests (the release, a step's reads sent ahead)."""
    return replace(ctx, transport=beside_container(ctx.transport), closing=None, on_sent=None, prefetched={},
                   ahead={})
