"""deployer's own source files as a stamp: what an edit or an upgrade of deployer changes."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_held: list[tuple[str, int, int]] | None = None


def code_stamp(root: Path = PACKAGE) -> list[tuple[str, int, int]]:
    """Each source file under root (deployer's by default) by path, size and mtime, in order."""
    if root == PACKAGE and _held is not None:
        return _held
    stamp: list[tuple[str, int, int]] = []
    pending = [root]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                    pending.append(Path(entry.path))
                elif entry.name.endswith(".py"):
                    st = entry.stat()
                    stamp.append((os.path.relpath(entry.path, root), st.st_size, st.st_mtime_ns))
    return sorted(stamp)


def hold() -> None:
    """Read deployer's stamp once, for good: for a process whose code cannot change under it (deployer's daemon
    serves only callers whose stamp is its own), so that each command it runs does not walk the files again."""
    global _held
    _held = None
    _held = code_stamp()
