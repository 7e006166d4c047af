"""Text from a target or a log made safe for a terminal: every control character shown, never obeyed."""

from __future__ import annotations

import unicodedata

# A terminal obeys C0/C1 controls (ESC starts OSC 0 window titles, CSI 2J clears, OSC 52 writes the
# clipboard), and line separators and bidi format characters make text read as other text.
_HIDDEN = {"Cc", "Cf", "Zl", "Zp"}
_KEPT = {"\n", "\t"}  # multi-line output stays readable


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
