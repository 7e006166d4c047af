"""A service deployer starts itself (`start:` in the inventory): detached in its own session, its pid in a
pid file. A service is a process tree: its stop signals every process of the session (and group) it runs in,
KILLs what outlives `stop_grace_s`, and is done only when none of them lives and its port is free."""

from __future__ import annotations

import posixpath
import time
from typing import Any

from deployer.agent.processes import Processes, ProcInfo
from deployer.config.models import Service, resolve_env
from deployer.errors import StepFailed
from deployer.steps.action import Action, Bound, program
from deployer.steps.context import NOTHING, Context
from deployer.steps.services.manager import (
    LOG_TAIL,
    PROBE_TIMEOUT_S,
    STOP_POLL_S,
    Manager,
    Observed,
    Phase,
    answered,
    holders,
    listed,
    new_pid_of,
    pid_of,
    proc_line,
    runs,
)

# Detached start: own session (so a stop finds every process of it, whatever group a child moves to), output
# to the log, stdin closed. The started process records itself before it becomes the server (SERVE): its pid
# with its start time (field 22 of /proc/PID/stat, read after the command name) in one file, renamed into place,
# then its pid in the pid file (for people and their scripts), then it execs the command. A record the launch
# wrote after the fork was lost when a cut run's agent killed the launch in between (its group, not the server's
# new session), and recover found a server answering that no record named. A record that cannot be written
# starts nothing: a server deployer cannot find again would block every later restart. The launch waits until
# the record is written or the process has died (fd 3, closed at the exec, ends the command substitution), so
# the record is in place when it returns. It prints the pid and the sizes before this start of the log and of
# the service's own log (`log:`, 0 when it has none yet), where this start's output begins. The log holds
# whatever the service prints, secrets included: 0600, even when an older deployer made it 0644; the umask is
# changed only for creating it, so the service keeps its own. Where this start's output begins (a 1-based byte
# position in the log it writes to) is kept beside its record too, for `deployer logs` long after the run.
SERVE = ('record=$1; pidfile=$2; shift 2; '
         'kept() { shift 19; echo "$$ $1" >"$record.tmp" && mv -f -- "$record.tmp" "$record"; }; '
         'read -r stat </proc/$$/stat && kept ${stat##*) } && echo $$ >"$pidfile" || '
         '{ echo "deployer: cannot record this start in $record, so nothing was started" >&2; exit 1; }; '
         'exec "$@" 3>&-')
LAUNCH = ('log=$1; pidfile=$2; record=$3; own=$4; from=$5; serve=$6; shift 6; '
          '(umask 077; : >>"$log") && chmod 600 -- "$log" || exit 1; '
          'offset=$(wc -c <"$log"); mine=0; [ -z "$own" ] || mine=$(wc -c <"$own" 2>/dev/null) || mine=0; '
          'at=$offset; [ -z "$own" ] || at=$mine; echo $((at + 1)) >"$from.tmp" && mv -f -- "$from.tmp" "$from"; '
          'pid=$(nohup setsid sh -c "$serve" deployer-serve "$record" "$pidfile" "$@" 3>&1 >>"$log" 2>&1 '
          '</dev/null & echo $!); echo $pid $offset $mine')
# This start's output only: from its offset, the last LOG_TAIL bytes.
TAIL = 'tail -c "+$1" -- "$2" | tail -c "$3"'
# `deployer logs`: without a cursor (a byte position), from where this start began (the position kept in $2; no
# such file: the whole log), its last $5 bytes and of those its last $3 lines; with one, the next $5 bytes from
# it. A log shorter than the cursor was truncated or replaced since: read from its beginning. Then, on stderr,
# the position to read on from and how many bytes were left out.
READ = ('f=$1; from=$2; lines=$3; at=$4; most=$5; [ -f "$f" ] || exit 3; size=$(wc -c <"$f") || exit 1; '
        'first=; [ -n "$at" ] || { first=1; at=1; [ -z "$from" ] || at=$(cat -- "$from" 2>/dev/null) || at=1; }; '
        'case $at in ""|*[!0-9]*) at=1;; esac; [ "$at" -le $((size + 1)) ] || at=1; '
        'n=$((size + 1 - at)); skip=0; '
        'if [ "$n" -gt "$most" ]; then [ -z "$first" ] || { skip=$((n - most)); at=$((at + skip)); }; n=$most; fi; '
        'tail -c "+$at" -- "$f" | head -c "$n" | if [ -n "$lines" ]; then tail -n "$lines"; else cat; fi; '
        'echo "$((at + n)) $skip" >&2')
KILL_WAIT_S = 10.0  # how long a KILLed process may take to disappear


def sessions_of(name: str) -> str:
    return f"<sessions of {name}>"


def groups_of(name: str) -> str:
    return f"<groups of {name}>"


def tree_of(name: str) -> str:
    return f"<tree of {name}>"


def own_pid_of(name: str) -> str:
    return f"<pid in the own pid file of {name}>"


def log_start_of(name: str) -> str:
    return f"<log start of {name}>"


def living(found: Processes) -> list[ProcInfo]:
    return [p for p in found.procs if p.alive]


def recorded_process(record: bytes | None, pidfile: bytes | None, started: bytes | None) -> tuple[str, str | None]:
    """The pid deployer recorded for a service and the start time of that process (None: not recorded). The
    record holds both, written at once; without one (an older deployer), the pid file and the start-time file."""
    def text(read: bytes | None) -> str:
        return read.decode(errors="replace").strip() if read else ""
    if record is not None:
        pid, _, start = text(record).partition(" ")
        return pid, start.strip()
    return text(pidfile), None if started is None else text(started)


class CommandManager(Manager):
    """A service deployer starts itself: detached, with a pid file and a record of its process's start time."""

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        super().__init__(ctx, name, service, step, timeout)
        state = ctx.state_dir()
        self.pidfile = posixpath.join(state, f"{name}.pid")
        self.logfile = posixpath.join(state, f"{name}.log")
        self.record = posixpath.join(state, f"{name}.proc")
        self.startfile = posixpath.join(state, f"{name}.started")  # an older deployer's record of the start time
        self.fromfile = posixpath.join(state, f"{name}.from")  # where the last start's output begins in its log
        self.cwd = posixpath.join(ctx.repo, service.cwd or "")
        old, new, tree = pid_of(name), new_pid_of(name), tree_of(name)
        grace = f"{service.stop_grace_s:g}s"
        port = {} if self.port is None else {"ports": str(self.port)}
        on_port = "" if self.port is None else f" and whoever listens on port {self.port}"
        self.read_record = Action.get(f"{name}.record", f"read the pid and start time of {name}'s process",
                                      self.record)
        self.read_pid = Action.get(f"{name}.pidfile", "or, as an older deployer recorded them, its pid file",
                                   self.pidfile)
        self.read_started = Action.get(f"{name}.started", "and the start time of the process it names", self.startfile)
        self.stat = Action.get(f"{name}.stat", f"is {old} running (and the process the pid file meant)",
                               f"/proc/{old}/stat", when="the pid file names a pid")
        # A launcher that exited leaves its server in the session it led: still the run's own process.
        self.heir = None if self.port is None else Action.procs(
            f"{name}.heir", f"who listens on port {self.port}: {name}'s when in the session {old} led",
            {"ports": str(self.port)}, when="the recorded process is gone")
        self.listener = None if service.adopt is None else Action.procs(
            f"{name}.listener", f"who listens on port {self.port}: adopted as {name}", port,
            when="the pid file names no live process")
        theirs = own_pid_of(name)
        self.read_theirs = None if service.pidfile is None else Action.get(
            f"{name}.their_pidfile", f"read the pid {name} writes itself", service.pidfile,
            when="deployer's pid file names no live process")
        self.their_stat = Action.get(f"{name}.their_stat", f"is {theirs} running: adopted as {name}",
                                     f"/proc/{theirs}/stat", when="its own pid file names a pid")
        self.stop_command = None if service.stop is None else Action.run(
            f"{name}.stop", f"stop {name}", tuple(service.stop), self.cwd, failure=f"the stop command of {name} failed")
        self.leader = Action.procs(f"{name}.leader", f"find {old}{on_port}: the sessions and groups they run in are "
                                   f"{name}'s tree", {"pids": old, **port}, when=f"{old} is running")
        selectors = {"sessions": sessions_of(name), "groups": groups_of(name), **port}
        self.tree = Action.procs(f"{name}.tree", f"list {tree}: every process of those sessions and groups"
                                 f"{on_port}", selectors, when=f"{old} is running")
        self.term = None if service.stop else Action.signal(f"{name}.term", f"stop {name}: TERM every process of "
                                                            "its tree", "TERM", tree, when=f"{old} is running")
        freed = "" if self.port is None else f" and port {self.port} to be free"
        self.stopping = Action.procs(f"{name}.stopping", f"wait up to {grace} for {tree} to exit{freed}", selectors,
                                     repeats=True, when=f"{old} is running")
        self.kill = Action.signal(f"{name}.kill", f"KILL every process of {tree} still alive", "KILL", tree,
                                  when=f"any still runs after {grace}")
        self.dying = Action.procs(f"{name}.dying", f"wait up to {KILL_WAIT_S:g}s for the KILLed to go", selectors,
                                  repeats=True, when="it was KILLed")
        assert service.start is not None
        self.mkdir = Action.run(f"{name}.mkdir", "create deployer's state dir", ("mkdir", "-p", "--", state),
                                failure="cannot create deployer's state dir")
        self.launch = Action.run(f"{name}.launch", f"start {name} (log {self.logfile})",
                                 ("sh", "-c", LAUNCH, "deployer-launch", self.logfile, self.pidfile, self.record,
                                  service.log or "", self.fromfile, SERVE, *service.start),
                                 self.cwd, env=tuple(resolve_env({**ctx.host.env, **service.env}).items()),
                                 failure=f"cannot start {name}", gist=f"sh -c <launch> … {program(service.start)}")
        # A launcher may exit once it has backgrounded the server: the service is then what serves its port.
        # By pid too: until setsid has run in it, the launched process is not yet in a session of its own.
        self.up = Action.procs(f"{name}.up", f"wait for {new} or its session to keep running{on_port}",
                               {"sessions": new, "pids": new, **port}, repeats=True)
        self.repoint = Action.put(f"{name}.repoint", f"record the process serving port {self.port} (its pid and "
                                  f"start time) as {name}", self.record,
                                  when="the launched process exited and another serves the port")
        self.repoint_pid = Action.put(f"{name}.repoint_pid", "and its pid in the pid file", self.pidfile,
                                      when="the launched process exited and another serves the port")
        self.reap_list = Action.procs(f"{name}.reap_list", f"list what {new} launched", {"sessions": new, "pids": new},
                                      when=f"{name} never came up")
        self.reap = Action.signal(f"{name}.reap", f"KILL what {new} launched", "KILL", f"<launched by {name}>",
                                  when=f"{name} never came up")
        self.still = Action.get(f"{name}.still", f"{new} still runs after every service started", f"/proc/{new}/stat")
        # A server that writes its own log (`log:`) leaves in deployer's only what its launcher said.
        self._log = Action.run(f"{name}.log", f"the tail of {service.log or self.logfile} since {name} was started",
                               ("sh", "-c", TAIL, "deployer-log", log_start_of(name), service.log or self.logfile,
                                str(LOG_TAIL)), when=f"{name} fails",
                               gist=f"sh -c <the last {LOG_TAIL} bytes of {service.log or self.logfile} since "
                                    "this start>")
        self.started_at = ""  # the start time of the process start() launched
        self.log_from: str | None = None  # where this start's output begins in the log; None: not started yet

    @classmethod
    def manages(cls, service: Service) -> bool:
        return service.start is not None

    def observe_actions(self) -> list[Action]:
        theirs = [] if self.read_theirs is None else [self.read_theirs, self.their_stat]
        return [self.read_record, self.read_pid, self.read_started, self.stat,
                *([] if self.heir is None else [self.heir]), *theirs,
                *([] if self.listener is None else [self.listener]), *([] if self.health is None else [self.health])]

    def judged_there(self) -> dict[str, Any] | None:
        # The record alone: a service found otherwise (an older deployer's pid file, a launcher's heir, adopted)
        # refuses the premise, and observe() tells here.
        return {"service": self.name, "health": self.service.health, "timeout": PROBE_TIMEOUT_S,
                "record": self.record}

    def stop_actions(self) -> list[Action]:
        return [a for a in (self.leader, self.tree, self.stop_command, self.term, self.stopping, self.kill,
                            self.dying) if a is not None]

    def start_actions(self) -> list[Action]:
        return [self.mkdir, self.launch, self.up, *([] if self.up_health is None else [self.up_health]),
                self.repoint, self.repoint_pid, self.reap_list, self.reap]

    def log_bound(self) -> Bound:
        return {log_start_of(self.name): self.log_from or "1"}

    def read_log(self, cursor: str, *, whole: bool, lines: int | None, most: int) -> Action:
        return Action.run(f"{self.name}.read_log", f"read {self.log_source(whole)}",
                          ("sh", "-c", READ, "deployer-read-log", self.service.log or self.logfile,
                           "" if whole else self.fromfile, "" if lines is None else str(lines), cursor, str(most)))

    def log_source(self, whole: bool) -> str:
        held = "its own log" if self.service.log else "stdout and stderr"
        return f"{held}{'' if whole else ' since this start'}, in {self.service.log or self.logfile}"

    def tail_label(self) -> str:
        held = f"own log {self.service.log}" if self.service.log else "stdout and stderr, combined,"
        # Before this restart started it (a stop that failed), the log's end is the old server's.
        return f"{self.name}'s {held} {'since this start' if self.log_from else 'before this restart'}"

    def observe(self, health: bool = True) -> Observed:
        text, meant = recorded_process(*self.ctx.act_all(
            [(self.read_record, NOTHING), (self.read_pid, NOTHING), (self.read_started, NOTHING)],
            timeout=PROBE_TIMEOUT_S))
        ask = [(self.health, NOTHING)] if health and self.health is not None else []
        pid = None
        if text.isdigit():
            # A pid file can outlive its process, and the number then name another one: the start time tells.
            stat = self.ctx.act(self.stat, {pid_of(self.name): text}, timeout=PROBE_TIMEOUT_S)
            pid = int(text) if runs(stat, meant) else self._heir(int(text), meant)
        adopted = None if pid is not None else self._adoptable()
        answer = answered(self.ctx.act_all(ask, timeout=PROBE_TIMEOUT_S)[0]) if ask else None
        return Observed(pid if adopted is None else adopted, answer, adopted is not None)

    def _heir(self, launched: int, started: str | None) -> int | None:
        """The server a launcher deployer started left behind in the session it led (`nohup server &`, then
        exit), serving the port: it began after the launcher did. A pid is not reused while a session bears its
        number, so the session names the launch."""
        if self.heir is None or not started or not started.isdigit():
            return None
        found = self.ctx.act(self.heir, timeout=PROBE_TIMEOUT_S)
        return next((p.pid for p in living(found) if self.port in p.listens and p.sid == launched
                     and p.start.isdigit() and int(p.start) >= int(started)), None)

    def _adoptable(self) -> int | None:
        """The process deployer did not start that is the service: the live one the service's own pid file
        names, else (`adopt: port`) whoever listens on its port. Its session and group are then its tree."""
        if self.read_theirs is not None:
            written = self.ctx.act(self.read_theirs, timeout=PROBE_TIMEOUT_S)
            text = written.decode(errors="replace").strip() if written else ""
            # Input, not truth: digits only, never init (its "tree" would be the whole machine), and alive.
            if text.isdigit() and int(text) > 1 and runs(self.ctx.act(
                    self.their_stat, {own_pid_of(self.name): text}, timeout=PROBE_TIMEOUT_S)):
                return int(text)
        if self.listener is not None and self.port is not None:
            found = self.ctx.act(self.listener, timeout=PROBE_TIMEOUT_S)
            return next((p.pid for p in found.procs if p.alive and self.port in p.listens), None)
        return None

    # -- the stop: the whole tree, and the port ----------------------------------------------------------

    def stop(self, pid: int | None) -> str:
        self.old_tree = set()
        if pid is None:
            if self.stop_command is not None:
                self.ctx.act(self.stop_command, timeout=self.timeout)
            return "ran its stop command; no live pid to wait for" if self.stop_command else "no live pid to signal"
        began = time.monotonic()
        # The tree is listed before anything is stopped: once its leader is gone, its session no longer shows.
        found = self.ctx.act(self.leader, {pid_of(self.name): str(pid)}, timeout=PROBE_TIMEOUT_S)
        # The service's process and whoever serves its port: the sessions and groups they run in are its tree
        # (the launch is setsid, so the pid leads its session; an adopted one brings its own).
        heads = [p for p in found.procs if p.alive and (p.pid == pid or p.listens)]
        selectors = {sessions_of(self.name): ",".join(sorted({str(p.sid) for p in heads if p.sid > 1})),
                     groups_of(self.name): ",".join(sorted({str(p.pgid) for p in heads if p.pgid > 1}))}
        tree = living(self.ctx.act(self.tree, selectors, timeout=PROBE_TIMEOUT_S))
        self.old_tree = {p.pid for p in tree}
        self.phase(Phase.stopping, began, self.service.stop_grace_s, pid=pid,
                   detail=f"{len(tree)} processes of its tree")
        if self.stop_command is not None:
            self.ctx.act(self.stop_command, timeout=self.timeout)
        if self.term is not None:
            self.ctx.act(self.term, {tree_of(self.name): listed(tree)}, timeout=PROBE_TIMEOUT_S)
        left = self._gone(self.stopping, selectors, pid, self.service.stop_grace_s, began)
        if not left:
            return "stopped"  # which processes: the tree's procs event and the stopping phase
        # KILL only what is of its tree: a stranger that took the port since is named, never signalled.
        ours = {*selectors[sessions_of(self.name)].split(","), *selectors[groups_of(self.name)].split(",")}
        mine = [p for p in living(left) if str(p.sid) in ours or str(p.pgid) in ours or p.pid in self.old_tree]
        self.ctx.act(self.kill, {tree_of(self.name): listed(mine)}, timeout=PROBE_TIMEOUT_S)
        self.old_tree |= {p.pid for p in mine}
        left = self._gone(self.dying, selectors, pid, KILL_WAIT_S, began)
        if left:
            survivors = [proc_line(p) for p in left.procs if p.alive and not p.listens]
            held = [] if self.port is None else holders(left, self.port)
            raise self.fail("the stop did not end its tree: " + "; ".join(
                [*([f"survived SIGKILL: {', '.join(survivors)}"] if survivors else []),
                 *([f"port {self.port} is held by {', '.join(held)}"] if held else [])]))
        return f"killed after {self.service.stop_grace_s:g}s grace"  # whom: the kill's signal and procs events


    def _gone(self, probe: Action, selectors: Bound, pid: int, seconds: float, began: float) -> Processes | None:
        """Poll until no process of the tree lives and the port is free (None), or `seconds` have passed (what
        is still there): one round trip a round."""
        deadline = time.monotonic() + seconds
        waiting = False
        with self.ctx.poll(PROBE_TIMEOUT_S) as poll:
            while True:
                found = poll.round([(probe, selectors)])[0]
                if not living(found) and not found.unowned:
                    return None
                if time.monotonic() >= deadline:
                    return found  # type: ignore[no-any-return]
                if not waiting and all(p.pid != pid for p in living(found)):
                    waiting = True  # the leader is gone; the rest of its tree (or its port) is not
                    self.phase(Phase.waiting_tree, began, self.service.stop_grace_s, pid=pid,
                               detail=", ".join(proc_line(p) for p in living(found)))
                self.ctx.cancel.wait(STOP_POLL_S)

    # -- the start ---------------------------------------------------------------------------------------

    def start(self) -> int:
        _, launch = self.ctx.act_all([(self.mkdir, NOTHING), (self.launch, NOTHING)], timeout=self.timeout)
        printed = str(launch.out).split()
        if len(printed) != 3 or not all(word.isdigit() for word in printed):
            raise self.fail(f"the launch printed no pid: {str(launch.out)[:80]!r}")
        launched, offset, own_offset = printed
        self.log_from = str(int(own_offset if self.service.log else offset) + 1)
        bound = {new_pid_of(self.name): launched}
        try:
            found = self.wait_up(self.up, bound)
        except StepFailed:
            self._reap(bound)
            raise
        assert isinstance(found, Processes)
        if self.service.detaches and not any(self.port in p.listens for p in living(found)):
            # Its health answered in the round whose process list was read a moment before it bound: read again.
            found = self.ctx.act(self.up, bound, timeout=PROBE_TIMEOUT_S)
        server = self.server(found, int(launched))
        self.started_at = server.start
        if server.pid != int(launched):
            self.ctx.act(self.repoint, data=f"{server.pid} {server.start}\n".encode(), timeout=self.timeout)
            self.ctx.act(self.repoint_pid, data=f"{server.pid}\n".encode(), timeout=self.timeout)
        return server.pid

    def server(self, found: Processes, launched: int) -> ProcInfo:
        """The service's process once it answers: the one serving its port (a launcher's server), else the
        launched one."""
        alive = living(found)
        serving = [p for p in alive if self.port in p.listens]
        first = next((p for p in serving if p.pid == launched), None) or min(serving, key=lambda p: p.pid,
                                                                             default=None)
        chosen = first or next((p for p in alive if p.pid == launched), None) or min(alive, key=lambda p: p.pid)
        return chosen

    def _reap(self, bound: Bound) -> None:
        """A start that never came up leaves nothing running: KILL every process of the session it launched."""
        left = living(self.ctx.act(self.reap_list, bound, timeout=PROBE_TIMEOUT_S))
        if left:
            self.ctx.act(self.reap, {f"<launched by {self.name}>": listed(left)}, timeout=PROBE_TIMEOUT_S)

    def alive(self, probed: object, started: str | None) -> bool:
        # A start that detaches has done its part once it returns: until its server serves, nothing need live.
        return isinstance(probed, Processes) and (self.service.detaches or bool(living(probed)))

    def still_runs(self, pid: int) -> bool:
        return runs(self.ctx.act(self.still, {new_pid_of(self.name): str(pid)}, timeout=PROBE_TIMEOUT_S),
                    self.started_at)
