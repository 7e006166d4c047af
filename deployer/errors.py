"""The typed failures of deployer; each carries the exit code the CLI returns."""

from __future__ import annotations


class DeployerError(Exception):
    """Root of every failure a person is expected to read and act on."""

    exit_code = 1


class ConfigError(DeployerError):
    """A playbook, inventory or command line that cannot be used as written."""

    exit_code = 2


class DaemonError(DeployerError):
    """deployer's daemon could not be started, asked or stopped (commands run without it all the same)."""

    exit_code = 1


class StepFailed(DeployerError):
    """A step of the chain failed; the target was restored (or the message says what was left)."""

    exit_code = 1

    def __init__(self, step: str, message: str, *, command: str | None = None,
                 exit_code: int | None = None, stderr_tail: str = "", timed_out: bool = False,
                 tail_label: str = "stderr (tail)") -> None:
        self.step = step
        self.command = command
        self.command_exit = exit_code
        self.stderr_tail = stderr_tail
        self.tail_label = tail_label  # what the tail holds, as its heading names it
        self.timed_out = timed_out
        parts = [f"step '{step}' failed: {message}"]
        if command is not None:
            how = "timed out" if timed_out else f"exited {exit_code}"
            parts.append(f"  command: {command}\n  {how}")
        if stderr_tail.strip():
            parts.append(f"  {tail_label}:\n" + _indent(stderr_tail.rstrip(), "    "))
        super().__init__("\n".join(parts))


class AnalysisInconclusive(DeployerError):
    """An analysis could not judge the new build (too few requests, a metric absent, a canary that restarted):
    inconclusive is held, never passed. Its commit stays on the target whatever on_failure says, for a person to
    decide: keep it (run the analysis again under traffic) or `deployer rollback RUN_ID`."""

    exit_code = 7


class RolloutPaused(DeployerError):
    """A fleet run stopped at a pause of its rollout (a `pause: {}` step, or an inconclusive analysis under
    `on_inconclusive: pause`), between batches, its state recorded: `deployer rollout resume FLEET_ID` goes on,
    `deployer rollout abort FLEET_ID` rolls back what it did."""

    exit_code = 8


class LockHeld(DeployerError):
    """Another run holds the deploy lock on the target."""

    exit_code = 3


class ConnectError(DeployerError):
    """The target could not be reached or authenticated."""

    exit_code = 4


class HostKeyError(ConnectError):
    """The target's host key is unknown or changed; nothing ran."""


class VerificationFailed(DeployerError):
    """A check after the commit failed (restart, drain); the run was rolled back."""

    exit_code = 5


class ChecksFailed(VerificationFailed):
    """A rollback's revert stands (its commit made, the services restarted or not), but a check of the reverted
    build failed: the run ends rolled_back, naming the check; running the rollback again would not change it."""

    def __init__(self, message: str, *, commit: str | None, checks: list[str]) -> None:
        self.commit = commit  # the revert (None: a unit's, one a host)
        self.checks = checks  # the failed check first, then the ones it kept from running
        super().__init__(message)


class RollbackFailed(DeployerError):
    """Undoing a run did not complete; the message says what state the target is in."""

    exit_code = 6


class RecordRefused(RollbackFailed):
    """A record on the target (the intent record) names something recover may not do; nothing was changed,
    and the record and the lock stay on the target for a person to look at."""


class Interrupted(DeployerError):
    """The operator interrupted the run (SIGINT/SIGTERM)."""

    exit_code = 130


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())


class TransportError(DeployerError):
    """Bytes or commands did not reach the target as intended (mismatched upload, lost channel)."""

    exit_code = 1


class AgentLost(TransportError):
    """The agent's stream closed or broke (a reply too large, of the wrong shape or nested too deep): nothing
    more can be asked over it. Before any change that is a connection failure; after one, the restore says."""

    exit_code = 4


class PythonMissing(AgentLost):
    """The host answered, but its shell found no `python:` there to start the agent with: the inventory is wrong,
    not the link (the agent never ran, so nothing changed)."""

    exit_code = 2


class RequestSkipped(TransportError):
    """The agent did not run a request: the earlier one it depended on (`after`) did not succeed."""


class OutputTruncated(TransportError):
    """A command printed more than the caller kept, and the caller needed all of it."""
