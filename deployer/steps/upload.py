"""Put the new bytes on the target: whole files atomically, or a patch through git apply."""

from __future__ import annotations

from deployer.agent.client import Put
from deployer.config import Strict
from deployer.context import Change, Context
from deployer.errors import StepFailed
from deployer.steps.base import Action, Effect, Step
from deployer.steps.git import git, owner_and_mode_kept
from deployer.transport.base import sha256_hex


class UploadParams(Strict):
    timeout_s: float = 120.0


class Upload(Step):
    kind = "upload"
    Params = UploadParams
    effect = Effect.changes_files

    def plan(self, ctx: Context) -> list[Action]:
        if ctx.playbook.patch is not None:
            return [Action("check the patch applies (patch on stdin)", git("apply", "--check", "-"), ctx.repo),
                    Action("apply the patch (patch on stdin), then give the files back their owner and mode",
                           git("apply", "-"), ctx.repo)]
        return [Action(f"write {c.dest} ({len(c.new)} bytes, sha256 {sha256_hex(c.new)[:12]}) "
                       "via temp file + sha256 check + rename") for c in ctx.changes]

    def run(self, ctx: Context) -> str:
        if ctx.playbook.patch is not None:
            ctx.check(git("apply", "--check", "-"), "the patch does not apply to the target's tree",
                      stdin=ctx.playbook.patch, timeout=self.timeout_s)
            # git apply writes each file anew: as the user deployer runs as, with git's idea of the mode.
            with owner_and_mode_kept(ctx, ctx.dests, self.timeout_s):
                ctx.check(git("apply", "-"), "git apply failed", stdin=ctx.playbook.patch, timeout=self.timeout_s)
            for change in ctx.changes:
                self._verify(ctx, change)
        else:
            ctx.cancel.check()
            # Every file at once (the agent writes them in order), then the read-only steps after this one.
            puts = [ctx.transport.submit(Put(c.path, c.new, keep_owner=True, mkdirs=True), self.timeout_s)
                    for c in ctx.changes]
            ctx.sent()
            for change, pending in zip(ctx.changes, puts, strict=True):
                result = pending.result(self.timeout_s)
                ctx.emit("uploaded", dest=change.dest, sha256=result.sha256, size=result.size)
        return f"{len(ctx.changes)} file(s) on the target"

    def _verify(self, ctx: Context, change: Change) -> None:
        landed = ctx.transport.get(change.path, timeout=self.timeout_s)
        if landed != change.new:
            raise StepFailed(self.name, f"after git apply, {change.dest} differs from the file the plan showed")
        ctx.emit("uploaded", dest=change.dest, sha256=sha256_hex(landed), size=len(landed))
