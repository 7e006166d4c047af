"""The safe console every line goes through, and the plain one-line messages.

rich (about 25 ms to import, and a Console to make for each message) is imported only when something needs it:
a terminal, forced colour, or more than plain lines (a table, a chart's bars). Where rich would write neither
styles nor cursor moves, `line_console` writes our lines itself, byte for byte as rich would."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from deployer.text import visible

if TYPE_CHECKING:
    from rich.console import Console
    from rich.segment import Segment


def _safe_console_class() -> type[Console]:
    from rich.console import Console
    from rich.segment import Segment

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

    return SafeConsole


def make_console(stderr: bool = False) -> Console:
    # emoji off: rich would turn a ":fire:" in a commit subject into an emoji even with markup off.
    return _safe_console_class()(stderr=stderr, highlight=False, soft_wrap=True, emoji=False)


class Lines(Protocol):
    """What the run's live view and report print through: a rich console, or the plain one."""

    @property
    def is_terminal(self) -> bool: ...

    def print(self, *objects: Any, markup: bool | None = None, highlight: bool | None = None,
              style: str | None = None) -> None: ...


# The characters rich's Text drops before anything else sees them (rich.control.strip_control_codes).
_RICH_STRIPS = dict.fromkeys((7, 8, 11, 12, 13))


class PlainConsole:
    """make_console()'s output where rich would write no styles (not a terminal, no FORCE_COLOR): each line
    printed as SafeConsole prints it (rich's dropped controls gone, every other control made visible, a
    newline after), without importing rich. What is more than one plain string (a rich Text, markup with tags,
    a tab, which rich expands) goes to a SafeConsole, made then, on the same stream."""

    is_terminal = False

    def __init__(self, stderr: bool = False) -> None:
        self.stderr = stderr
        self._rich: Console | None = None

    @property
    def file(self) -> IO[str]:
        return sys.stderr if self.stderr else sys.stdout  # looked up on each write, as rich does

    def print(self, *objects: Any, markup: bool | None = None, highlight: bool | None = None,
              style: str | None = None) -> None:
        text = objects[0] if len(objects) == 1 else None
        if not isinstance(text, str) or "\t" in text or (markup is not False and "[" in text):
            self.rich().print(*objects, markup=markup, highlight=highlight, style=style)
            return
        try:
            try:
                self.file.write(visible(text.translate(_RICH_STRIPS)) + "\n")
            except UnicodeEncodeError as error:  # rich's hint, word for word
                error.reason = (f"{error.reason}\n*** You may need to add PYTHONIOENCODING=utf-8 to your "
                                "environment ***")
                raise
            self.file.flush()
        except BrokenPipeError:  # as rich does: stdout to /dev/null, and exit 1
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None

    def rich(self) -> Console:
        if self._rich is None:
            self._rich = make_console(self.stderr)
        return self._rich


def rich_is_plain(stream: object) -> bool:
    """Whether rich would see no terminal on stream, so that it would write our text with no styles and no cursor
    moves: not a tty, and nothing that makes rich decide otherwise (FORCE_COLOR, TTY_COMPATIBLE, a notebook).
    Where any of those is set, rich decides, as before."""
    if "IPython" in sys.modules or "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return isatty is None or not isatty()
    except ValueError:  # a closed stream: rich sees no terminal either
        return True


# The consoles a live view is redrawing on, while it is. A line printed through any other (a notice from a
# listener, say) would be written past the view, which then redraws a line too low and leaves its old header
# on screen: so while one draws, every line goes through it, printed above the view (on its stream, as rich's
# own redirect of stderr does).
_DRAWING: list[Console] = []


def drawing(console: Console) -> None:
    _DRAWING.append(console)


def drawn(console: Console) -> None:
    _DRAWING.remove(console)


def line_console(stderr: bool = False) -> Lines:
    """The console for plain lines: the live view's while one draws, rich's on a terminal (or with colour
    forced), the plain one otherwise."""
    if _DRAWING:
        return _DRAWING[-1]
    if rich_is_plain(sys.stderr if stderr else sys.stdout):
        return PlainConsole(stderr)
    return make_console(stderr)


def show_error(message: str) -> None:
    line_console(stderr=True).print(f"error: {message}", markup=False, highlight=False, style="red")


def say(text: str) -> None:
    """One plain line on stdout, through the same console as every other line (so escaped like them)."""
    line_console().print(text, markup=False, highlight=False)


def show_warning(message: str) -> None:
    """What a run that ended as its record says could not make sure of (on stderr, so --json stays clean)."""
    line_console(stderr=True).print(f"warning: {message}", markup=False, highlight=False, style="yellow")


def show_notice(message: str) -> None:
    """Something the operator should know that is not a failure (on stderr, so --json stays clean)."""
    line_console(stderr=True).print(f"notice: {message}", markup=False, highlight=False, style="yellow")


def columns(console: Console, header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Plain padded columns: ids stay whole and copyable, and grep and cut work on the output."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)] + [row[-1]]
        console.print("  ".join(cells).rstrip(), markup=False, highlight=False, soft_wrap=True)

