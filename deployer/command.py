"""The one place where argv lists become shell strings, and where secrets are masked."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence

MASK = "***"


def quote(argv: Sequence[str]) -> str:
    """Join argv into one POSIX shell string that reaches the target literally."""
    return shlex.join(argv)


def shell_line(argv: Sequence[str], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None) -> str:
    """A full shell line: optional `cd`, optional environment, then the quoted argv."""
    parts: list[str] = []
    if cwd is not None:
        parts.append(f"cd -- {shlex.quote(cwd)} &&")
    if env:
        parts.append("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
    parts.append(quote(argv))
    return " ".join(parts)


class Masker:
    """Replaces every known secret value with *** in text bound for logs, screens and errors."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str) -> None:
        # The inventory refuses secrets too short to mask (config.MIN_SECRET); an empty one
        # would match everywhere.
        if secret:
            self._secrets.add(secret)
            self._secrets.add(shlex.quote(secret))

    def __call__(self, text: str) -> str:
        # Longest first, so a secret that contains another is masked whole.
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, MASK)
        return text

    def obj(self, value: object) -> object:
        """Mask every string inside a JSON-like structure."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.obj(v) for v in value]
        return value
