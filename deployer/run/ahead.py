"""What a run sends before its turn: the read-only steps right after a change send their commands with it, and a
commit that comes next goes too when the target itself decides every check before it.

One Ahead per run of the chain (or of a part of it: a unit runs its hosts' chains in phases)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from deployer.errors import DeployerError
from deployer.run import undo
from deployer.steps import optional
from deployer.steps.base import Effect, Step
from deployer.steps.context import Context


@dataclass
class Ahead:
    """What one run of a chain sends before each step's turn, and takes back on a stop."""
    chain: list[Step]
    close_behind: Callable[[Context, Step], None] | None  # the release behind a commit that ends the run
    note_log: Callable[[Context], None]  # ctx.facts.log_sha256: the log so far, on disk, for a commit to name
    unwatch: Callable[[], None] = field(default=lambda: None)  # stops skipping the commit on a stop

    def sent(self, ctx: Context, index: int) -> None:
        """The step at index sent its changes: the read-only steps after it send theirs now (one round trip).
        When the target itself decides each of those (Prefetches.target_decides) and a commit comes next, the commit
        goes too, behind every request since the intent record: lock, intent, changes, checks and commit (and
        the release, when the commit ends the run) are then one round trip whose order the agent enforces
        where the files are."""
        step, rest = self.chain[index], self.chain[index + 1:]
        ahead = list(itertools.takewhile(lambda s: s.effect == Effect.observes, rest))
        ctx.prefetched.update({s.name: optional.prefetch(s, ctx) for s in ahead})
        then = rest[len(ahead)] if len(ahead) < len(rest) else None
        record = ctx.record
        if step.effect != Effect.changes_files or then is None or then.effect != Effect.commits or \
                record is None or not all(optional.target_decides(s, ctx) for s in ahead):
            return
        record.update(sent_ahead=list(dict.fromkeys([*record.state.sent_ahead, then.name])))  # on disk first
        if self.close_behind is not None and then is self.chain[-1]:
            self.close_behind(ctx, then)
        self.note_log(ctx)  # the commit anchors the log as it is when the commit is sent
        behind = ctx.transport.gated()
        try:
            sent = optional.send_ahead(then, ctx, behind)
        finally:
            ctx.facts.log_sha256 = None
        if not sent:
            ctx.closing = None
            return
        ctx.emit("sent_ahead", steps=[then.name], behind=len(behind))
        # A stop (a signal, a failing run log) comes at a safe point: the commit sent past it must not run unless
        # it has started (the release behind it then runs only if it succeeded).
        pending, _ = ctx.ahead[then.name]

        def take_back() -> None:
            with contextlib.suppress(DeployerError):  # a link gone already: the agent ran nothing more
                ctx.transport.skip(pending)
        self.unwatch = ctx.cancel.on_cancel(take_back)

    def settle(self, ctx: Context) -> None:
        """The run stops: commands sent for steps that never ran still ran on the target (logged under their
        step), and a step sent ahead may have run all the same (SendsAhead.settle takes it in)."""
        for name, sent in list(ctx.prefetched.items()):
            ctx.bus.step = name
            for submitted in sent:
                with contextlib.suppress(DeployerError):
                    submitted.result()
        ctx.prefetched.clear()
        for step in self.chain:
            if step.name in ctx.ahead:
                ctx.bus.step = step.name
                try:
                    optional.settle(step, ctx)
                except KeyboardInterrupt:  # a forced stop while it still runs: killed, then taken in
                    undo.stop_running(ctx)
                    optional.settle(step, ctx)
        ctx.bus.step = None
        self.unwatch()
