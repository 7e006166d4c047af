"""Compile the shipped Python here before anything moves, then there under the target's venv."""

from __future__ import annotations

import sys
from collections.abc import Callable

from deployer.config.models import Strict
from deployer.diffs import DiffStat
from deployer.errors import StepFailed
from deployer.steps.base import Action, Step
from deployer.steps.context import NOTHING, Context, Submitted

# compile() is what py_compile does, without writing a .pyc into the target's tree.
REMOTE_SCRIPT = "import sys\nfor f in sys.argv[1:]:\n    compile(open(f, 'rb').read(), f, 'exec')\n"


def python_dests(ctx: Context) -> list[str]:
    return [c.dest for c in ctx.changes if c.dest.endswith(".py")]


def compile_error(ctx: Context, dest: str) -> str | None:
    """Where and why the shipped bytes of dest do not compile here (None: they do)."""
    change = next(c for c in ctx.changes if c.dest == dest)
    try:
        compile(change.new, dest, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte in the source
        where = f"{exc.lineno}:{exc.offset}" if isinstance(exc, SyntaxError) else "1:1"
        why = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        return f"{change.source}:{where}: {why} (shipped as {dest})"
    return None


class LocalCompile(Step):
    kind = "local_compile"
    before = ("upload",)
    judges = "compile"

    def plan(self, ctx: Context) -> list[Action]:
        version = ".".join(map(str, sys.version_info[:2]))
        return [Action(f"compile {dest} here (Python {version})", key=f"compile:{dest}") for dest in python_dests(ctx)]

    def judge_here(self, ctx: Context, projected: Callable[[], DiffStat]) -> list[str]:
        return [error for dest in python_dests(ctx) if (error := compile_error(ctx, dest))]

    def run(self, ctx: Context) -> str:
        actions = self.plan(ctx)
        for action, dest in zip(actions, python_dests(ctx), strict=True):
            if error := compile_error(ctx, dest):
                raise StepFailed(self.name, f"{error}; nothing on the target was changed")
            ctx.log_action(action, NOTHING, None)
        return f"{len(actions)} file(s) compile here"


class RemoteCompileParams(Strict):
    timeout_s: float = 120.0


class RemoteCompile(Step):
    kind = "remote_compile"
    Params = RemoteCompileParams
    after = ("upload",)

    def action(self, ctx: Context) -> Action:
        # -I -S: compiling needs the interpreter, not its site (.pth files, sitecustomize): a faster start.
        argv = (ctx.host.python, "-I", "-S", "-c", REMOTE_SCRIPT, *python_dests(ctx))
        return Action.run("compile", "compile on the target", argv, ctx.repo,
                          failure=f"the target's {ctx.host.python} cannot compile the shipped files")

    def plan(self, ctx: Context) -> list[Action]:
        return [self.action(ctx)] if python_dests(ctx) else [Action("no Python files to compile")]

    def prefetch(self, ctx: Context) -> list[Submitted]:
        return [ctx.send(self.action(ctx), timeout=self.timeout_s)] if python_dests(ctx) else []

    def run(self, ctx: Context) -> str:
        dests = python_dests(ctx)
        if not dests:
            return "no Python files"
        sent = self.sent(ctx) or self.prefetch(ctx)
        sent[0].check(self.action(ctx).failure)
        return f"{len(dests)} file(s) compile under {ctx.host.python}"
