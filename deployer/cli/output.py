"""What a command leaves on stdout and as its exit: one JSON document with --json (a failure too), the
typed failures mapped to their exit codes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES = """Exit codes: 0 ok, 1 a step failed (target restored), 2 usage/config error, 3 lock held,
4 connection or host-key error, 5 verification failed, 6 rollback failed, 7 analysis inconclusive (held),
8 rollout paused (resume or abort it), 130 interrupted."""


def emit_json(data: Any) -> None:
    import json  # here: `deployer --help` has no use for it (5 ms of its start)

    click.echo(json.dumps(data, indent=1))


def fail_json(exit_code: int, error: str, **extra: Any) -> None:
    """With --json, a failure is still exactly one JSON object on stdout."""
    emit_json({**extra, "exit_code": exit_code, "error": error})


def failures_to_exit_codes(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from deployer.errors import DeployerError

        as_json = bool(kwargs.get("as_json"))
        try:
            return func(*args, **kwargs)
        except DeployerError as exc:
            stop(exc.exit_code, str(exc), as_json)
        except KeyboardInterrupt:
            stop(130, "interrupted", as_json)
    return wrapper  # type: ignore[return-value]


def stop(exit_code: int, error: str, as_json: bool) -> NoReturn:
    from deployer.ui.console import show_error
    if as_json:
        fail_json(exit_code, error)
    show_error(error)
    sys.exit(exit_code)
