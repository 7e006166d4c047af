"""An action: one thing a step does (a command, a read, a write or an HTTP request on the target, or
work done here), as plain data.

A step builds its actions in one place: `plan` renders them and `apply` sends them, so the dry run
shows exactly what the run does. A value only the run can know (a PID it reads on the way) stands in
the action as a placeholder such as `<pid of decode>`; the run binds it, and the run log records each
action it did under the action's key, with the values it bound.

`plan` shows the actions two ways, both from the same data: exactly (`render`: every command line as the
run log records it) and briefly (`briefly`: a line per thing a person cares about, where every action that
may change the target is still named).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, replace
from enum import Enum
from itertools import groupby
from typing import TYPE_CHECKING, Any

from deployer.command import quote, shell_line

if TYPE_CHECKING:
    from deployer.agent.protocol import Request

# `<pid of decode>`: words, never shell syntax (a launch script's `</dev/null & echo $! >` is not one).
PLACEHOLDER = re.compile(r"<[a-z][\w .-]*>")
Bound = Mapping[str, str]  # placeholder -> the value the run found for it


class Kind(str, Enum):
    run = "run"  # an argv on the target
    get = "get"  # read a file on the target
    put = "put"  # replace a file on the target atomically
    http = "http"  # a request to a URL as the target sees it
    procs = "procs"  # list processes: of sessions, process groups, pids, and listeners on TCP ports
    signal = "signal"  # a signal to listed processes, each only while it is still the process listed
    local = "local"  # work done on this machine


# The run-log event that records an action of each kind.
EVENT = {Kind.run: "command", Kind.get: "get", Kind.put: "uploaded", Kind.http: "http", Kind.procs: "procs",
         Kind.signal: "signal", Kind.local: "local"}
SELECTORS = ("sessions", "groups", "pids", "ports")  # what a procs action lists, each a comma-separated list


@dataclass(frozen=True)
class Action:
    """One thing a step does on the target, as data: shown by plan, run by apply."""
    what: str
    _: KW_ONLY
    kind: Kind = Kind.local
    key: str = ""  # names the action in the run log; unique within its step
    argv: tuple[str, ...] = ()
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    target: str = ""  # the path of a get or put, the URL of an http request
    stage: str = ""  # a put that only stages: the temp beside target it writes (renamed into place later)
    method: str = "GET"
    body: str | None = None  # an http POST's JSON body
    when: str | None = None  # done only then (a fallback, an escalation, a failure); None: always
    repeats: bool = False  # a poll or a storm: planned once, done as often as the run needs
    failure: str = ""  # what it means when it fails (the step then fails); "": the step judges the result
    expect: bytes | None = None  # a command's exact output that counts as success, on the target itself
    # A numstat's totals that count as success, on the target: (("files", (min, max) or None), ...).
    within: tuple[tuple[str, tuple[int, int] | None], ...] | None = None
    size: int | None = None  # the bytes a put sends, where the plan knows them
    gist: str = ""  # a command in a few words, where its argv alone would not say it (a launch script's program)
    group: str = ""  # the thing a person cares about that it is part of ("stop decode"): brief plans show one line

    @classmethod
    def run(cls, key: str, what: str, argv: tuple[str, ...], cwd: str | None = None, **extra: Any) -> Action:
        return cls(what, kind=Kind.run, key=key, argv=argv, cwd=cwd, **extra)

    @classmethod
    def get(cls, key: str, what: str, path: str, **extra: Any) -> Action:
        return cls(what, kind=Kind.get, key=key, target=path, **extra)

    @classmethod
    def put(cls, key: str, what: str, path: str, **extra: Any) -> Action:
        return cls(what, kind=Kind.put, key=key, target=path, **extra)

    @classmethod
    def http(cls, key: str, what: str, url: str, **extra: Any) -> Action:
        return cls(what, kind=Kind.http, key=key, target=url, **extra)

    @classmethod
    def procs(cls, key: str, what: str, selectors: Mapping[str, str], **extra: Any) -> Action:
        """`procs sessions=<session of prefill> ports=30000`: each selector a comma-separated list (or a
        placeholder the run binds to one)."""
        assert set(selectors) <= set(SELECTORS), selectors
        return cls(what, kind=Kind.procs, key=key, argv=tuple(f"{k}={v}" for k, v in selectors.items()), **extra)

    @classmethod
    def signal(cls, key: str, what: str, sig: str, procs: str, **extra: Any) -> Action:
        """`signal KILL <tree of prefill>`: procs is `pid:start,...` (a placeholder the run binds)."""
        return cls(what, kind=Kind.signal, key=key, argv=(sig, procs), **extra)

    def command(self) -> str:
        """A command's line exactly as the run log records it when the action runs."""
        assert self.kind == Kind.run
        return shell_line(self.argv, cwd=self.cwd, env=dict(self.env))

    def line(self) -> str:
        """What is done, exactly: the command line, `get PATH`, `put PATH`, `METHOD URL`, or the description."""
        if self.kind == Kind.run:
            return self.command()
        if self.kind == Kind.http:
            return f"{self.method} {self.target}" + ("" if self.body is None else f" {self.body}")
        if self.kind in (Kind.procs, Kind.signal):
            return " ".join((self.kind.value, *self.argv))
        if self.stage:  # the file it writes: the dest is only where the rename goes later
            return f"put {self.stage}"
        return f"{self.kind.value} {self.target}" if self.target else self.what

    def render(self) -> str:
        text = self.what if self.kind == Kind.local else f"{self.what}: {self.line()}"
        if self.repeats:
            text += " [repeated]"
        return text if self.when is None else f"{text} [only if {self.when}]"

    @property
    def changes(self) -> bool:
        """May it change the target? Commands count, whatever they are: only a step knows one that only reads."""
        return self.kind in (Kind.run, Kind.put, Kind.signal) or (self.kind == Kind.http and self.method != "GET")

    def program(self) -> str:
        """A command in a few words: its gist, or its program and first words; an inline program as `<program>`."""
        assert self.kind == Kind.run
        return self.gist or program(self.argv)

    def effect(self) -> str:
        """What it does, in a few words: a command's program, `send N bytes -> PATH`, `TERM <tree of decode>`."""
        if self.kind == Kind.run:
            return self.program()
        if self.kind == Kind.put:
            return f"send {self.size} bytes -> {self.target}" if self.size is not None else f"write {self.target}"
        if self.kind == Kind.signal:
            return " ".join(self.argv)
        return self.line()

    def brief(self) -> str:
        """The action alone on a brief plan's line: as render() shows it, a command's line and a put's path
        shortened to their effect()."""
        text = self.what if self.kind == Kind.local else f"{self.what}: {self.effect()}"
        if self.repeats:
            text += " [repeated]"
        return text if self.when is None else f"{text} [only if {self.when}]"

    def placeholders(self) -> list[str]:
        return list(dict.fromkeys(PLACEHOLDER.findall(self.line())))

    def bind(self, values: Bound) -> Action:
        """The action with each placeholder replaced by the value the run found for it."""
        if not values:
            return self

        def fill(text: str) -> str:
            return PLACEHOLDER.sub(lambda m: values.get(m.group(0), m.group(0)), text)
        return self.mapped(fill)

    def mapped(self, f: Callable[[str], str]) -> Action:
        """Every value the action shows or sends, passed through f (binding placeholders, masking secrets)."""
        return replace(self, what=f(self.what), argv=tuple(f(a) for a in self.argv),
                       cwd=None if self.cwd is None else f(self.cwd), env=tuple((k, f(v)) for k, v in self.env),
                       target=f(self.target), stage=f(self.stage), body=None if self.body is None else f(self.body),
                       gist=f(self.gist), group=f(self.group))

    def describe(self) -> dict[str, Any]:
        """The action in `plan --json`; a command's argv too, since its line quotes the placeholders it holds."""
        command = {"argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env)} if self.kind == Kind.run else {}
        return {"key": self.key, "kind": self.kind.value, "what": self.what, "line": self.line(), **command,
                "placeholders": self.placeholders(), "when": self.when, "repeats": self.repeats}

    def request(self, *, timeout: float, stdin: bytes | None = None, data: bytes | None = None,
                capture: int) -> Request[Any]:
        """The agent request that does it (placeholders bound first). A request carries a check flag only
        when the action may fail the step: in a batch, anything else must not stop the requests after it."""
        from deployer.agent.processes import Procs, Signal
        from deployer.agent.protocol import Get, Http, Put, Run

        if self.kind == Kind.run:
            return Run(self.argv, cwd=self.cwd, env=dict(self.env), stdin=stdin, timeout=timeout, tail=capture,
                       check=bool(self.failure) or self.expect is not None or self.within is not None,
                       expect_stdout=self.expect,
                       numstat_within=None if self.within is None else dict(self.within))
        if self.kind == Kind.get:
            return Get(self.target)
        if self.kind == Kind.put:
            assert data is not None, "a put sends data"
            return Put(self.target, data, keep_owner=True, mkdirs=True, temp=self.stage or None)
        if self.kind == Kind.http and self.method in ("GET", "POST"):
            return Http(self.target, timeout=timeout, check=bool(self.failure), method=self.method,
                        json=None if self.body is None else json.loads(self.body))
        if self.kind == Kind.procs:
            chosen = dict(selector.split("=", 1) for selector in self.argv)
            return Procs(**{name: numbers(chosen.get(name, "")) for name in SELECTORS})
        if self.kind == Kind.signal:
            sig, listed = self.argv
            return Signal(sig, [(number(pid), start) for pid, start in
                                (entry.split(":", 1) for entry in listed.split(",") if entry)])
        raise ValueError(f"the agent does not do {self.line()!r}")


@dataclass(frozen=True)
class Brief:
    """One line of a brief plan, and the actions (indices into the step's list) it stands for."""
    text: str
    actions: tuple[int, ...]


def briefly(actions: Sequence[Action]) -> list[Brief]:
    """A step's actions, a line per thing a person cares about: an action alone as brief() shows it, and a run of
    actions of one group as one line naming the group, then each effect on the target and each wait (in order),
    or, when it only reads, how many reads. Nothing that may change the target goes unnamed."""
    lines = []
    for _, run in groupby(enumerate(actions), key=lambda pair: pair[1].group or pair[0]):
        members = list(run)
        first = members[0][1]
        text = summed(first.group, [a for _, a in members]) if first.group else first.brief()
        lines.append(Brief(text, tuple(i for i, _ in members)))
    return lines


def summed(group: str, actions: Sequence[Action]) -> str:
    """A group's line: its name, then what it changes (the changes done only under one condition together) and
    what it waits for, in order, each once; or, when it only reads, how many reads it does."""
    said: list[tuple[list[str], str | None]] = []  # effects, and the condition they are done under
    for a in actions:
        if not (a.changes or a.repeats):
            continue
        # A wait says what it waits for and how long (a command polled: its program too).
        text = a.effect() if not a.repeats else f"{a.what}: {a.effect()}" if a.changes else a.what
        when = a.when if a.changes else None
        if said and when is not None and said[-1][1] == when:
            said[-1][0].append(text)
        else:
            said.append(([text], when))
    if not said:
        return f"{group} ({len(actions)} read{'s' if len(actions) > 1 else ''})"
    return f"{group}: " + "; ".join(dict.fromkeys(", ".join(texts) + ("" if when is None else f" [only if {when}]")
                                                  for texts, when in said))


SHORT = 60  # a command's first words, shown in a brief plan, in at most this many characters
# Options of git that harden it (steps/gitops.py), and say nothing to a person about what it does.
GIT_HARDENING = ("-c", "-C", "--git-dir", "--work-tree")


def program(argv: Sequence[str]) -> str:
    """A command in a few words: its program's name and first words, an inline program (`sh -c`, `python -c`)
    as `<program>`, git as `git SUBCOMMAND`; `…` where words were left out."""
    name, rest = posixpath.basename(argv[0]), list(argv[1:])
    if name == "git":
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in GIT_HARDENING else rest[1:]
        return f"git {rest[0]}{' …' if len(rest) > 1 else ''}" if rest else "git"
    if "-c" in rest:
        at = rest.index("-c")
        tail = rest[at + 2:]
        return " ".join([quote([name, *rest[:at]]), "-c <program>", *(["…"] if tail else [])])
    words = [name]
    for word in rest:
        if len(quote([*words, word])) > SHORT:
            return f"{quote(words)} …"
        words.append(word)
    return quote(words)


def number(text: str) -> int:
    """A pid or port the run bound: digits only (an unbound placeholder, or anything else, is refused)."""
    if not text.isdigit():
        raise ValueError(f"not a number: {text!r}")
    return int(text)


def numbers(listed: str) -> list[int]:
    return [number(part) for part in listed.split(",") if part]
