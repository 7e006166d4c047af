"""`deployer logs` on a screen or in a pipe: each log's text as it is (escaped already), under a `==> host service
<==` heading whenever more than one log is shown and the text that follows is another's (as `tail` does)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deployer.app.logs import LogText


class LogPrinter:
    """Writes each read as it comes, flushed: a follow's reader sees each line when it is read."""

    def __init__(self, headings: bool) -> None:
        self.headings = headings
        self.last: tuple[str, str] | None = None  # whose text was written last

    def show(self, read: LogText) -> None:
        out = sys.stdout
        if self.headings and (read.host, read.service) != self.last:
            out.write(f"{'' if self.last is None else chr(10)}==> {read.host} {read.service}: {read.source} <==\n")
        self.last = (read.host, read.service)
        if read.missing:
            out.write("(no log on the host yet: never started there)\n")
        if read.skipped:
            out.write(f"({read.skipped} bytes before this not shown: more than one read brings back)\n")
        out.write(read.text)
        if read.text and not read.text.endswith("\n") and self.headings:
            out.write("\n")  # the next heading starts a line of its own
        out.flush()
