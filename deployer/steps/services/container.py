"""A service that is a container (`container:` in the inventory): its engine stops and starts it, and
`inspect`'s State.Pid and State.StartedAt prove the restart.

The agent runs on the host here (the engine is the host's), so State.Pid is a pid of the host's namespace:
its /proc entry is read to see that it lives and what it runs. `stop -t stop_grace_s` sends TERM, then KILL
after the grace (the engines' default of 10 s is too short for a drain). A bare interpreter as PID 1, without
an init, has no default action for TERM: it ignores it and every stop ends in KILL, so that is warned about.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import time
from dataclasses import dataclass

from deployer.agent.protocol import ExecResult
from deployer.command import container_inspect
from deployer.config.models import Service
from deployer.steps.action import Action, Bound
from deployer.steps.context import NOTHING, Context
from deployer.steps.services.manager import PROBE_TIMEOUT_S, Manager, Observed, Phase, answered, pid_of
from deployer.text import visible

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
        self.grace = math.ceil(service.stop_grace_s)  # the engines take whole seconds
        inspect = container_inspect(engine, box, "--format", "{{json .State}}")
        self.inspect = Action.run(f"{name}.inspect", f"read container {box}'s main pid and start time", inspect)
        self.cmdline = Action.get(f"{name}.cmdline", f"what {pid_of(name)} runs (an init, or a bare interpreter)",
                                  f"/proc/{pid_of(name)}/cmdline", when="the container runs")
        self.stop_it = Action.run(f"{name}.stop", f"stop {name}: TERM, KILL after {self.grace}s",
                                  (engine, "stop", "-t", str(self.grace), box), failure=f"{engine} stop {box} failed")
        self.start_it = Action.run(f"{name}.start", f"start {name}", (engine, "start", box),
                                   failure=f"{engine} start {box} failed")
        self.up = Action.run(f"{name}.up", f"wait for container {box} to run", inspect, repeats=True)
        self.still = Action.run(f"{name}.still", f"container {box} still runs the same process", inspect)
        # Both of the container's streams, in the order it wrote them: the engine hands its stderr (where a
        # server's traceback goes) back on its own stderr, which the failure's tail would not show.
        self._log = Action.run(f"{name}.log", f"the end of container {box}'s output (stdout and stderr)",
                               ("sh", "-c", 'exec "$0" logs --tail 40 "$1" 2>&1', engine, box), when=f"{name} fails")
        self.started: State | None = None  # what start() brought up

    @classmethod
    def manages(cls, service: Service) -> bool:
        return service.container is not None

    def observe_actions(self) -> list[Action]:
        return [self.inspect, self.cmdline, *([] if self.health is None else [self.health])]

    def stop_actions(self) -> list[Action]:
        return [self.stop_it]

    def start_actions(self) -> list[Action]:
        return [self.start_it, self.up, *([] if self.up_health is None else [self.up_health])]

    def confirm_actions(self) -> list[Action]:
        return [self.still]

    @property
    def log(self) -> Action:
        return self._log

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
        ask = [(self.health, NOTHING)] if health and self.health is not None else []
        results = self.ctx.act_all([(self.inspect, NOTHING), *ask], timeout=PROBE_TIMEOUT_S)
        answer = answered(results[1]) if ask else None
        state = State.of(results[0])
        pid = None if state is None else state.live_pid
        if pid is None:
            return Observed(None, answer)
        # The engine's word, checked: a pid is a live process of this host only if its /proc entry is there.
        cmdline = self.ctx.act(self.cmdline, {pid_of(self.name): str(pid)}, timeout=PROBE_TIMEOUT_S)
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
        self.ctx.act(self.stop_it, timeout=self.grace + STOP_SLACK_S)
        return f"stopped ({self.box.engine} stop -t {self.grace})"

    def start(self) -> int:
        self.ctx.act(self.start_it, timeout=self.timeout)
        state = State.of(self.wait_up(self.up, NOTHING))  # wait_up shows starting, loading and healthy
        assert state is not None and state.live_pid is not None, "wait_up returns once the container runs"
        self.started = state
        return state.live_pid

    def probed_pid(self, probed: object, bound: Bound) -> int | None:
        state = State.of(probed)
        return None if state is None else state.live_pid

    def alive(self, probed: object, started: str | None) -> bool:
        state = State.of(probed)
        return state is not None and state.live_pid is not None

    def still_runs(self, pid: int) -> bool:
        # The same pid and the same start: a container restarted by its restart policy has a new StartedAt.
        return State.of(self.ctx.act(self.still, timeout=PROBE_TIMEOUT_S)) == self.started
