"""Compile the shipped Python here before anything moves, then there under the target's venv."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pydantic import Field

from deployer.config.models import Strict
from deployer.diffs import DiffStat
from deployer.errors import StepFailed
from deployer.steps.base import Action, Step
from deployer.steps.context import NOTHING, Context, Submitted
from deployer.steps.optional import JudgesEarly, Ordered, Prefetches, RunsHere, sent
from deployer.steps.upload import compiled_there, staged


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


class LocalCompile(Step, RunsHere, JudgesEarly, Ordered):
    """Compile the Python files to ship here, before the target is touched."""

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
    timeout_s: float = Field(default=120.0, description="Seconds the compile on the target may take.")


# compile() is what py_compile does, without writing a .pyc into the target's tree. Then, only when every file
# compiled, the staged temps (the pairs of temp and dest after the files) renamed into place, each directory
# fsynced after: the owner and mode are the temps' own, set when the upload staged them. One interpreter start
# for both: each costs 10-30 ms on the target. -I -S and nothing newer than Python 3: any target python. A
# rename that fails exits RENAME_FAILED, a file that does not compile 1.
RENAME_FAILED = 74
RENAMING = "cannot rename the staged files into place"
INSTALL_SCRIPT = (
    "import os, sys\nn = int(sys.argv[1])\nfor f in sys.argv[2:2 + n]:\n    compile(open(f, 'rb').read(), f, 'exec')\n"
    "pairs = sys.argv[2 + n:]\ntry:\n    for tmp, dest in zip(pairs[::2], pairs[1::2]):\n        os.rename(tmp, dest)\n"
    "    for d in sorted(set(os.path.dirname(dest) for dest in pairs[1::2])):\n        fd = os.open(d, os.O_RDONLY)\n"
    "        os.fsync(fd)\n        os.close(fd)\nexcept OSError as exc:\n    sys.stderr.write('%s\\n' % exc)\n"
    f"    sys.exit({RENAME_FAILED})\n")


class RemoteCompile(Step, Prefetches, Ordered):
    """Compile the uploaded files with the host's python, before they take effect."""

    kind = "remote_compile"
    Params = RemoteCompileParams
    # Observes, though it installs what the upload staged: the install finishes the upload's change (the run
    # stays `changed`, and a failure restores the files as the upload's would), and it rides the upload's
    # round trip as prefetch, so the reads of the steps after it (diff_bounds) see the installed files.
    after = ("upload",)

    def actions(self, ctx: Context) -> list[Action]:
        temps, dests = staged(ctx), python_dests(ctx)
        if not dests and not temps:
            return []
        # -I -S: compiling needs the interpreter, not its site (.pth files, sitecustomize): a faster start.
        argv = (ctx.host.python, "-I", "-S", "-c", INSTALL_SCRIPT, str(len(dests)), *(temps.get(d, d) for d in dests),
                *(part for c in ctx.changes if c.dest in temps for part in (temps[c.dest], c.path)))
        cannot = f"the target's {ctx.host.python} cannot compile the shipped files"
        if not temps:
            return [Action.run("compile", "compile on the target", argv, ctx.repo, failure=cannot)]
        if not dests:
            return [Action.run("install", "rename the staged files into place (owner and mode set when staged)",
                               argv, ctx.repo, failure=RENAMING)]
        return [Action.run("compile", "compile the staged files on the target, then, only if all compiled, rename "
                           "them into place (owner and mode set when staged)", argv, ctx.repo,
                           failure=f"{cannot}; none of them was installed")]

    def plan(self, ctx: Context) -> list[Action]:
        return self.actions(ctx) or [Action("no Python files to compile")]

    def prefetch(self, ctx: Context) -> list[Submitted]:
        return [ctx.send(action, timeout=self.timeout_s) for action in self.actions(ctx)]

    def target_decides(self, ctx: Context) -> bool:
        return True  # each command passes or fails the step by its exit code (run() below)

    def run(self, ctx: Context) -> str:
        if not self.actions(ctx):
            return "no Python files"
        for submitted in sent(self, ctx) or self.prefetch(ctx):
            rename_failed = submitted.result().exit_code == RENAME_FAILED  # past the compile: its message would lie
            submitted.check(RENAMING if rename_failed else submitted.action.failure)
        dests = python_dests(ctx)
        compiled = f"{len(dests)} file(s) compile under {ctx.host.python}" if dests else ""
        installed = f"{len(ctx.changes)} file(s) installed" if compiled_there(ctx) else ""
        return "; ".join(part for part in (compiled, installed) if part)
