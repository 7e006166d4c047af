"""Text from a target or a log is input, not truth: made safe for a terminal (every control character shown,
never obeyed), and bounded and escaped before a message quotes it."""

from __future__ import annotations

import unicodedata

# A terminal obeys C0/C1 controls (ESC starts OSC 0 window titles, CSI 2J clears, OSC 52 writes the
# clipboard), and line separators and bidi format characters make text read as other text.
_HIDDEN = {"Cc", "Cf", "Zl", "Zp"}
_KEPT = {"\n", "\t"}  # multi-line output stays readable
SHOWN_CHARS = 80


def visible(text: str, *, multiline: bool = True) -> str:
    r"""text with each control or format character written as its escape (ESC as `\x1b`).

    Newlines and tabs are kept when multiline, escaped otherwise (a one-line field stays one line)."""
    if text.isprintable():  # the common case: nothing to show, no walk per character
        return text
    return "".join(_shown(char) if _hidden(char, multiline) else char for char in text)


def _hidden(char: str, multiline: bool) -> bool:
    if char in _KEPT:
        return not multiline
    return unicodedata.category(char) in _HIDDEN


def _shown(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


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
