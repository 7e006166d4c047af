"""Put the new bytes on the target: whole files atomically, or a patch through git apply."""

from __future__ import annotations

import posixpath

from pydantic import Field

from deployer.agent.protocol import sha256_hex
from deployer.config.models import Strict
from deployer.errors import StepFailed
from deployer.steps.base import Action, Effect, Step
from deployer.steps.context import Context, Submitted
from deployer.steps.git import owner_and_mode_kept
from deployer.steps.gitops import git
from deployer.steps.optional import SendsChanges, sent


def staged_temp(path: str, new_sha256: str) -> str:
    """Where an upload stages the new bytes of path until remote_compile has compiled them: beside it (the
    rename into place is atomic), named from the dest and its new bytes alone, so a restore or a recover
    derives every name from the run's record and never has to trust a listing of the target."""
    directory, name = posixpath.split(path)
    return posixpath.join(directory, f".{name}.deployer-staged-{new_sha256[:16]}.tmp")


class UploadParams(Strict):
    timeout_s: float = Field(default=120.0, description="Seconds the upload (or the patch's git apply) may take.")


class Upload(Step, SendsChanges):
    """Ship the files (or apply the patch) into the target's repo, each file written whole and checked."""

    kind = "upload"
    Params = UploadParams
    effect = Effect.changes_files

    def actions(self, ctx: Context) -> list[Action]:
        if ctx.playbook.patch is not None:
            verify = [Action.get(f"verify:{c.dest}", f"read {c.dest} back", c.path) for c in ctx.changes]
            if all(c.old == c.new for c in ctx.changes):  # applied by hand, not committed: the commit is left
                return verify
            return [Action.run("apply_check", "check the patch applies (patch on stdin)", git("apply", "--check", "-"),
                               ctx.repo, failure="the patch does not apply to the target's tree"),
                    Action.run("apply", "apply the patch (patch on stdin), then give the files back their owner and "
                               "mode", git("apply", "-"), ctx.repo, failure="git apply failed"), *verify]
        if temps := staged(ctx):
            return [Action.put(f"stage:{c.dest}", f"stage {c.dest} ({len(c.new)} bytes, sha256 "
                               f"{sha256_hex(c.new)[:12]}) beside it, owner and mode set, sha256 checked; "
                               "remote_compile compiles it, then renames it into place",
                               c.path, stage=temps[c.dest], size=len(c.new)) for c in ctx.changes]
        return [Action.put(f"write:{c.dest}", f"write {c.dest} ({len(c.new)} bytes, sha256 {sha256_hex(c.new)[:12]}) "
                           "via temp file + sha256 check + rename", c.path, size=len(c.new)) for c in ctx.changes]

    def plan(self, ctx: Context) -> list[Action]:
        return self.actions(ctx)

    def run(self, ctx: Context) -> str:
        actions = self.actions(ctx)
        if ctx.playbook.patch is not None:
            verify = actions[-len(ctx.changes):]
            if len(actions) > len(verify):  # none to apply when the work tree already holds the patch
                check, apply = actions[:2]
                ctx.act(check, stdin=ctx.playbook.patch, timeout=self.timeout_s)
                # git apply writes each file anew: as the user deployer runs as, with git's idea of the mode.
                with owner_and_mode_kept(ctx, ctx.dests, self.timeout_s):
                    ctx.act(apply, stdin=ctx.playbook.patch, timeout=self.timeout_s)
            for change, action in zip(ctx.changes, verify, strict=True):
                if ctx.act(action, timeout=self.timeout_s) != change.new:
                    raise StepFailed(self.name, f"after git apply, {change.dest} differs from the file the plan showed")
        else:
            ctx.cancel.check()
            puts = sent(self, ctx)  # sent with the lock already (run/whole.py)
            if puts is None:
                puts = self.send_changes(ctx) or []
                ctx.sent()  # then the read-only steps after this one
            for put in puts:
                put.result()
        return f"{len(ctx.changes)} file(s) {'staged beside their dests' if compiled_there(ctx) else 'on the target'}"

    def send_changes(self, ctx: Context) -> list[Submitted] | None:
        """Every whole file at once (the agent writes them in order); a patch is applied in its turn."""
        if ctx.playbook.patch is not None:
            return None
        return [ctx.send(action, data=c.new, timeout=self.timeout_s)
                for action, c in zip(self.actions(ctx), ctx.changes, strict=True)]


def compiled_there(ctx: Context) -> bool:
    """Whole files that remote_compile compiles on the target before they go live: the upload only stages them
    (staged), and remote_compile renames them into place once the target's python compiled those bytes. Only
    when it comes before diff_bounds and the commit, which read and commit the live tree; placed after them it
    compiles the live files, as does a patch's (git apply writes in place)."""
    for item in ctx.playbook.model.steps:
        kind = item if isinstance(item, str) else next(iter(item))
        if kind in ("diff_bounds", "commit", "remote_compile"):
            return kind == "remote_compile" and ctx.playbook.patch is None
    return False


def staged(ctx: Context) -> dict[str, str]:
    """dest -> the temp its new bytes are staged in until remote_compile installs them ({}: not staged)."""
    return {c.dest: staged_temp(c.path, sha256_hex(c.new)) for c in ctx.changes} if compiled_there(ctx) else {}
