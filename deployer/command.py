"""The one place where argv lists become shell strings, and where secrets are masked."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

MASK = "***"
# The shortest piece of a secret masked where text was cut: shorter ones are too likely to be
# ordinary text, and tell too little about the secret.
MIN_FRAGMENT = 3
# What a shell's backslash quoting (`printf %q`, xtrace) leaves bare; everything else gets a backslash.
SHELL_SAFE = re.compile(r"[^\w@%+=:,./-]")


def quote(argv: Sequence[str]) -> str:
    """Join argv into one POSIX shell string that reaches the target literally."""
    return shlex.join(argv)


def container_inspect(engine: str, container: str, *options: str) -> tuple[str, ...]:
    """`<engine> inspect` of one container (never an image or a volume of that name), with options before the
    name (--format): docker's and podman's spelling alike."""
    return (engine, "inspect", "--type", "container", *options, container)


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
            self._secrets.update(quoted_forms(secret))

    def __call__(self, text: str) -> str:
        # Longest first, so a secret that contains another is masked whole.
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, MASK)
        return text

    def tail(self, text: str, limit: int) -> str:
        """The last `limit` characters of text, masked before the cut so no cut can split a secret.

        text may itself be the tail of longer output, cut inside a secret; it may also end inside
        one (a command killed while printing it). A secret's end at the start, or its start at the
        end, is masked too, from MIN_FRAGMENT characters on."""
        masked = self(text)
        for secret in self._secrets:
            masked = _mask_edges(masked, secret)
        return masked[-limit:]

    def obj(self, value: object) -> object:
        """Mask every string inside a JSON-like structure."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.obj(v) for v in value]
        return value


def quoted_forms(secret: str) -> set[str]:
    """The secret as it may stand in a command line or its echo: raw, and each way a shell, JSON or Python
    quotes it, whole or as the inside of a quoted word (`'--token=it'"'"'s'` holds no `'it'"'"'s'`)."""
    inside_single = {secret.replace("'", "'\"'\"'"), secret.replace("'", "'\\''")}
    return {secret, shlex.quote(secret), *inside_single,
            SHELL_SAFE.sub(lambda m: "\\" + m.group(), secret),
            re.sub(r'(["\\$`])', r"\\\1", secret),
            json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], repr(secret)[1:-1]}


def _mask_edges(text: str, secret: str) -> str:
    for size in range(min(len(secret), len(text)) - 1, MIN_FRAGMENT - 1, -1):
        if text.startswith(secret[-size:]):
            text = MASK + text[size:]
            break
    for size in range(min(len(secret), len(text)) - 1, MIN_FRAGMENT - 1, -1):
        if text.endswith(secret[:size]):
            return text[:-size] + MASK
    return text
