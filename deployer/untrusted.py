"""Values read from the target are input, not truth: bounded and escaped before a message shows them."""

from __future__ import annotations

SHOWN_CHARS = 80


def shown(value: object) -> str:
    """A value as a message may print it: repr-escaped (control and format characters as \\x1b, \\u202e ...)
    and cut to a readable length."""
    if isinstance(value, str | bytes) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}... ({len(value)} long)"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS * 2 else f"{text[:SHOWN_CHARS * 2]}..."


def printable(value: object, limit: int) -> bool:
    """A string that is safe to show as it is: at most `limit` characters, none of them control or format."""
    return isinstance(value, str) and len(value) <= limit and value.isprintable()
