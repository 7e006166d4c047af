"""A step's plan as data, with no target: the host, the playbook and the facts earlier steps learned are the real
models built in memory, and the transport refuses every request, so a plan() that reached for the target fails
the test instead of quietly needing one.

The tests beside this module each give params and host facts and assert the exact list of Actions plan() returns
(argv, paths, URLs, bodies, waits and budgets), in milliseconds: a change to one step is checked here in seconds,
and the end-to-end tests (a real sshd, real services) keep what needs real processes."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from deployer.command import Masker
from deployer.config.models import FileSpec, Playbook, SshHost
from deployer.steps.action import Action
from deployer.steps.base import Step
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Change, Context, EventBus, Facts, LoadedPlaybook
from deployer.steps.kinds import KINDS
from deployer.transport.base import Transport, TransportInfo

REPO = "/srv/app"
GIT_DIR = "/srv/app/.git"
PYTHON = "/opt/venv/bin/python"
STATE = "/srv/app/.git/deployer"  # deployer's own files on the target (Context.state_dir)
RUN_ID = "20260101T000000.000Z-plan"
# What an action makes the run do: each field compared. `what` too: a wait's budget and a write's size and sha256
# are said there and nowhere else.
DOES = ("kind", "key", "what", "argv", "cwd", "env", "target", "stage", "method", "body", "when", "repeats",
        "failure", "expect", "within")
# How a plan is shown, not what the run does (a brief plan's grouping and wording): not compared here.
SHOWN = ("size", "gist", "group")


def does(actions: Sequence[Action]) -> list[dict[str, Any]]:
    """The actions as what the run does, field by field (a mismatch shows the field that differs)."""
    return [{name: getattr(action, name) for name in DOES} for action in actions]


class NoTarget(Transport):
    """A transport with nothing behind it: planning must not need the target."""

    info = TransportInfo(kind="none", target="nowhere")

    def __init__(self) -> None:
        super().__init__(python=PYTHON)

    def _pipe(self, argv: Sequence[str]) -> NoReturn:
        raise AssertionError(f"plan() reached for the target: {list(argv)}")

    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> NoReturn:
        raise AssertionError(f"plan() asked for a tunnel to {remote_host}:{remote_port}")

    def _close_link(self) -> None:
        return


def host(**fields: Any) -> SshHost:
    """An inventory host as the inventory loader validates one (an SSH host: nothing here connects to it)."""
    return SshHost.model_validate({"address": "gpu-1.example", "repo": REPO, "python": PYTHON, **fields})


def change(dest: str, new: bytes, *, old: bytes | None = b"old\n", tracked: bool = True) -> Change:
    """One shipped file as preflight records it."""
    return Change(dest=dest, path=f"{REPO}/{dest}", new=new, old=old, tracked=tracked, source=f"fix/{dest}")


def context(target: SshHost | None = None, *, changes: Sequence[Change] = (), patch: bytes | None = None,
            steps: Sequence[Any] = ("upload",), facts: Facts | None = None, host_name: str = "gpu-1") -> Context:
    """What a step sees when it plans: the host, the playbook (its steps decide where remote_compile installs),
    the changes preflight found and the facts earlier steps learned; the target's git identity is known (preflight
    reads it), so a commit's plan need not ask."""
    target = target or host()
    model = Playbook(name="fix", files=[] if patch is not None else
                     [FileSpec(src=Path(c.dest).name, dest=c.dest, create=not c.tracked) for c in changes],
                     patch=None if patch is None else "fix.diff", steps=list(steps))
    playbook = LoadedPlaybook(path=Path("/work/fix/fix.yaml"), raw=b"", model=model,
                              sources={c.dest: c.new for c in changes} if patch is None else {}, patch=patch)
    return Context(run_id=RUN_ID, host_name=host_name, host=target, transport=NoTarget(), playbook=playbook,
                   bus=EventBus(Masker(target.secrets()), host_name), cancel=CancelToken(), changes=list(changes),
                   git_before="0" * 40, git_dir=GIT_DIR,
                   facts=facts or Facts(identity="dev@example.com"))


def step(kind: str, params: dict[str, Any] | None = None, name: str | None = None) -> Step:
    """The step a playbook's `- kind: params` becomes (its params validated as the loader validates them)."""
    cls = KINDS[kind]
    return cls(cls.Params.model_validate(params or {}), name or kind, "fix.yaml:1:1")


def sha(data: bytes) -> str:
    """The first 12 hex digits of data's sha256, as an upload names the bytes it writes."""
    return hashlib.sha256(data).hexdigest()[:12]
