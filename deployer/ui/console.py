"""The safe console every line goes through, and the plain one-line messages."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.segment import Segment

from deployer.text import visible


class SafeConsole(Console):
    """A console that never lets the text it prints drive the terminal.

    The one choke point for everything on screen: target output, log lines and error messages reach
    the terminal only as segments, and each segment's text has its control characters made visible
    (`\\x1b`) here, after layout and before rich adds its own styles and cursor moves (control segments,
    which rich makes itself, pass as they are). Markup is another matter: text that is not ours is
    printed with markup=False or through rich.markup.escape."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(visible(segment.text), segment.style, segment.control)
            for segment in buffer)


def make_console(stderr: bool = False) -> Console:
    # emoji off: rich would turn a ":fire:" in a commit subject into an emoji even with markup off.
    return SafeConsole(stderr=stderr, highlight=False, soft_wrap=True, emoji=False)


def show_error(message: str) -> None:
    make_console(stderr=True).print(f"error: {message}", markup=False, highlight=False, style="red")


def say(text: str) -> None:
    """One plain line on stdout, through the same console as every other line (so escaped like them)."""
    make_console().print(text, markup=False, highlight=False)


def show_warning(message: str) -> None:
    """What a run that ended as its record says could not make sure of (on stderr, so --json stays clean)."""
    make_console(stderr=True).print(f"warning: {message}", markup=False, highlight=False, style="yellow")


def show_notice(message: str) -> None:
    """Something the operator should know that is not a failure (on stderr, so --json stays clean)."""
    make_console(stderr=True).print(f"notice: {message}", markup=False, highlight=False, style="yellow")


def columns(console: Console, header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Plain padded columns: ids stay whole and copyable, and grep and cut work on the output."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)] + [row[-1]]
        console.print("  ".join(cells).rstrip(), markup=False, highlight=False, soft_wrap=True)

