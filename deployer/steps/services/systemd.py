"""A service systemd runs (`systemd:` in the inventory): systemctl stops and starts it, its journal is its log."""

from __future__ import annotations

from deployer.agent.protocol import ExecResult
from deployer.config.models import Service
from deployer.steps.action import Action, Bound
from deployer.steps.context import NOTHING, Context
from deployer.steps.services.manager import PROBE_TIMEOUT_S, Manager, Observed, answered

# `deployer logs`: the unit's journal; without a cursor this start's (the entries of its current invocation; the
# whole journal of the unit when $2 is set or it has none), with one what came after it. The cursor is the last
# line journalctl prints.
READ = ('unit=$1; whole=$2; lines=$3; at=$4; command -v journalctl >/dev/null 2>&1 || exit 127; '
        'set -- journalctl --no-pager --quiet -o short-iso --show-cursor; '
        'if [ -n "$at" ]; then set -- "$@" -u "$unit" --after-cursor "$at"; '
        'else id=; [ -n "$whole" ] || id=$(systemctl show -p InvocationID --value "$unit" 2>/dev/null); '
        'if [ -n "$id" ]; then set -- "$@" "_SYSTEMD_INVOCATION_ID=$id"; else set -- "$@" -u "$unit"; fi; '
        '[ -z "$lines" ] || set -- "$@" -n "$lines"; fi; exec "$@"')
CURSOR = "-- cursor: "


class SystemdManager(Manager):
    """A systemd unit: systemctl stops and starts it, and its main pid is the process it runs."""

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        super().__init__(ctx, name, service, step, timeout)
        assert service.systemd is not None
        unit = service.systemd
        main_pid = ("systemctl", "show", "-p", "MainPID", "--value", unit)
        self.main_pid = Action.run(f"{name}.mainpid", f"read {unit}'s main pid", main_pid)
        self.stop_unit = Action.run(f"{name}.stop", f"stop {name}", ("systemctl", "stop", unit),
                                    failure=f"systemctl stop {unit} failed")
        self.start_unit = Action.run(f"{name}.start", f"start {name}", ("systemctl", "start", unit),
                                     failure=f"systemctl start {unit} failed")
        self.up = Action.run(f"{name}.up", f"wait for {unit} to have a main pid", main_pid, repeats=True)
        self.still = Action.run(f"{name}.still", "its main pid after every service started", main_pid)
        self._log = Action.run(f"{name}.log", f"the end of {unit}'s journal",
                               ("journalctl", "-u", unit, "-n", "40", "--no-pager"), when=f"{name} fails")

    @classmethod
    def manages(cls, service: Service) -> bool:
        return service.systemd is not None

    def observe_actions(self) -> list[Action]:
        return [self.main_pid, *([] if self.health is None else [self.health])]

    def stop_actions(self) -> list[Action]:
        # systemctl stop ends the unit's whole cgroup; the port check proves nothing outside it kept the port.
        return [self.stop_unit, *([] if self.port_free is None else [self.port_free])]

    def start_actions(self) -> list[Action]:
        return [self.start_unit, self.up, *([] if self.up_health is None else [self.up_health])]

    def tail_label(self) -> str:
        return f"{self.name}'s journal, its last 40 lines"

    def read_log(self, cursor: str, *, whole: bool, lines: int | None, most: int) -> Action:
        unit = self.service.systemd
        assert unit is not None
        return Action.run(f"{self.name}.read_log", f"read {self.log_source(whole)}",
                          ("sh", "-c", READ, "deployer-read-log", unit, "1" if whole else "",
                           "" if lines is None else str(lines), cursor))

    def log_source(self, whole: bool) -> str:
        return f"the journal of {self.service.systemd}{'' if whole else ' since this start'}"

    def log_tool(self) -> str:
        return "journalctl (systemd's journal, where a unit's output goes)"

    def log_read(self, result: ExecResult) -> tuple[str, str, int]:
        text, _, cursor = result.out.rpartition(CURSOR)
        if not cursor:  # no entries: nothing to read on from yet
            return "", "", 0
        return text, cursor.strip(), result.out_stream.total - len(result.out_stream.kept)

    @staticmethod
    def pid_in(result: object) -> int | None:
        out = getattr(result, "out", "").strip()
        return int(out) if out.isdigit() and int(out) > 0 else None

    def observe(self, health: bool = True) -> Observed:
        ask = [(self.health, NOTHING)] if health and self.health is not None else []
        results = self.ctx.act_all([(self.main_pid, NOTHING), *ask], timeout=PROBE_TIMEOUT_S)
        return Observed(self.pid_in(results[0]), answered(results[1]) if ask else None)

    def stop(self, pid: int | None) -> str:
        self.ctx.act(self.stop_unit, timeout=self.timeout)
        self.wait_port_free()
        return "stopped"

    def start(self) -> int:
        self.ctx.act(self.start_unit, timeout=self.timeout)
        pid = self.pid_in(self.wait_up(self.up, NOTHING))
        assert pid is not None, "wait_up returns once the unit has a main pid"
        return pid

    def probed_pid(self, probed: object, bound: Bound) -> int | None:
        return self.pid_in(probed)

    def alive(self, probed: object, started: str | None) -> bool:
        return self.pid_in(probed) is not None

    def still_runs(self, pid: int) -> bool:
        return self.pid_in(self.ctx.act(self.still, timeout=PROBE_TIMEOUT_S)) == pid
