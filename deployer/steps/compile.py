"""Compile the shipped Python here before anything moves, then there under the target's venv."""

from __future__ import annotations

import sys
from collections.abc import Callable

from deployer.config.models import Strict
from deployer.diffs import DiffStat
from deployer.errors import StepFailed
from deployer.steps.base import Action, Step
from deployer.steps.context import NOTHING, Context, Submitted
from deployer.steps.upload import compiled_there, staged

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


# The staged temps (pairs of temp, dest) renamed into place, each directory fsynced after: the owner and mode
# are the temps' own, set when the upload staged them. -I -S and nothing newer than Python 3: any target python.
INSTALL_SCRIPT = (
    "import os, sys\nargs = sys.argv[1:]\nfor tmp, dest in zip(args[::2], args[1::2]):\n    os.rename(tmp, dest)\n"
    "for d in sorted(set(os.path.dirname(dest) for dest in args[1::2])):\n    fd = os.open(d, os.O_RDONLY)\n"
    "    os.fsync(fd)\n    os.close(fd)\n")


class RemoteCompile(Step):
    kind = "remote_compile"
    Params = RemoteCompileParams
    # Observes, though it installs what the upload staged: the install finishes the upload's change (the run
    # stays `changed`, and a failure restores the files as the upload's would), and it rides the upload's
    # round trip as prefetch, so the reads of the steps after it (diff_bounds) see the installed files.
    after = ("upload",)

    def actions(self, ctx: Context) -> list[Action]:
        temps = staged(ctx)
        # -I -S: compiling needs the interpreter, not its site (.pth files, sitecustomize): a faster start.
        python = (ctx.host.python, "-I", "-S", "-c")
        actions = []
        if dests := python_dests(ctx):
            what = "compile the staged files on the target, before they go live" if temps else "compile on the target"
            actions.append(Action.run("compile", what, (*python, REMOTE_SCRIPT, *(temps.get(d, d) for d in dests)),
                                      ctx.repo, failure=f"the target's {ctx.host.python} cannot compile the "
                                      f"shipped files{'; none of them was installed' if temps else ''}"))
        if temps:
            pairs = [part for c in ctx.changes for part in (temps[c.dest], c.path)]
            actions.append(Action.run("install", "rename the compiled files into place (owner and mode set when "
                                      "staged)", (*python, INSTALL_SCRIPT, *pairs), ctx.repo,
                                      failure="cannot rename the staged files into place"))
        return actions

    def plan(self, ctx: Context) -> list[Action]:
        return self.actions(ctx) or [Action("no Python files to compile")]

    def prefetch(self, ctx: Context) -> list[Submitted]:
        # The install only if the compile passed: the agent skips it otherwise.
        sent: list[Submitted] = []
        for action in self.actions(ctx):
            sent.append(ctx.send(action, timeout=self.timeout_s, after=sent[-1] if sent else None))
        return sent

    def decided_there(self, ctx: Context) -> bool:
        return True  # each command passes or fails the step by its exit code (run() below)

    def run(self, ctx: Context) -> str:
        if not self.actions(ctx):
            return "no Python files"
        for submitted in self.sent(ctx) or self.prefetch(ctx):
            submitted.check(submitted.action.failure)
        compiled = f"{len(python_dests(ctx))} file(s) compile under {ctx.host.python}"
        return f"{compiled}; {len(ctx.changes)} file(s) installed" if compiled_there(ctx) else compiled
