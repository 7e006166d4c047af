"""`canary --record`: the golden answer a playbook's `canary: {golden: FILE}` compares with, recorded from a server
the operator trusts (before the fix, with deterministic inference on)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.app.setting import Setting, build_of

if TYPE_CHECKING:
    from deployer.steps.canary import Answer
    from deployer.steps.context import Listener


@dataclass(frozen=True, kw_only=True)
class GoldenOptions(Setting):
    """host: whose server answers (its canary URL: the step's, or its service's); playbook: whose first canary
    step's request is sent (None: the defaults); out: where the answer is written, only one that passes the
    canary's checks."""

    host: str
    out: str | Path
    playbook: str | Path | None = None


@dataclass(frozen=True)
class Golden:
    """The answer recorded, and where."""

    answer: Answer
    out: str
    exit_code: int = 0

    def document(self) -> dict[str, Any]:
        return {**self.answer.event(), "golden": self.out, "exit_code": 0, "error": None}


def record_golden(options: GoldenOptions, *, listener: Listener | None = None) -> Golden:
    """Send the canary's request once and write a passing answer to out; a failing one raises its DeployerError."""
    from deployer.steps.canary import record
    from deployer.steps.playbook import load_playbook

    build = build_of(options, listener)
    host = build.host(options.host)
    answer = record(options.host, host, build.connector(options.host, host),
                    load_playbook(Path(options.playbook)) if options.playbook else None, Path(options.out))
    return Golden(answer, str(options.out))
