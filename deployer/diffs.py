"""Diffs computed here, before anything changes: unified text, and numstat exactly as git counts it."""

from __future__ import annotations

import difflib
import posixpath
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from deployer.errors import DeployerError

# Both sides (here and on the target) count with one named algorithm, so a projected
# stat equals what the commit shows whatever diff.algorithm either side configures.
DIFF_ALGORITHM = "--diff-algorithm=myers"


@dataclass(frozen=True)
class FileStat:
    """One file's line counts as `git diff --numstat` gives them."""
    path: str
    insertions: int
    deletions: int
    binary: bool = False


@dataclass(frozen=True)
class DiffStat:
    """A whole diff's counts, file by file, as `git diff --stat` prints them."""
    files: tuple[FileStat, ...]

    @property
    def insertions(self) -> int:
        return sum(f.insertions for f in self.files)

    @property
    def deletions(self) -> int:
        return sum(f.deletions for f in self.files)

    def summary(self) -> str:
        """The closing line of `git diff --stat`, word for word."""
        n = len(self.files)
        parts = [f"{n} file{'s' if n != 1 else ''} changed"]
        if self.insertions or not self.deletions:
            parts.append(f"{self.insertions} insertion{'s' if self.insertions != 1 else ''}(+)")
        if self.deletions or not self.insertions:
            parts.append(f"{self.deletions} deletion{'s' if self.deletions != 1 else ''}(-)")
        return ", ".join(parts)

    def lines(self) -> list[str]:
        width = max((len(f.path) for f in self.files), default=0)
        rows = []
        for f in self.files:
            if f.binary:
                rows.append(f" {f.path.ljust(width)} | Bin")
            else:
                total = f.insertions + f.deletions
                rows.append(f" {f.path.ljust(width)} | {total:>4} {'+' * min(f.insertions, 40)}"
                            f"{'-' * min(f.deletions, 40)}")
        return [*rows, " " + self.summary()]


def parse_numstat(text: str, names: Iterable[str] | None = None) -> list[FileStat]:
    """Parse `git diff --numstat -z`; names replaces the printed paths (for --no-index temp paths).

    NUL-delimited, so a path with a newline or a tab is one record, printed as it is, never quoted.
    A pair of paths (a rename, or --no-index on two names) comes as an empty path and then both."""
    stats: list[FileStat] = []
    tokens = iter(text.split("\0"))
    given = list(names) if names is not None else None
    for record in tokens:
        if not record.strip():
            continue
        ins, dels, path = record.split("\t", 2)
        if not path:
            next(tokens, "")
            path = next(tokens, "")
        name = given[len(stats)] if given is not None else path
        if ins == "-":
            stats.append(FileStat(name, 0, 0, binary=True))
        else:
            stats.append(FileStat(name, int(ins), int(dels)))
    return stats


def numstat(path: str, old: bytes | None, new: bytes) -> FileStat:
    """git's count of insertions and deletions from old to new (old None: a new file)."""
    return numstats([(path, old, new)])[0]


def numstats(changes: Sequence[tuple[str, bytes | None, bytes]]) -> list[FileStat]:
    """numstat of each (path, old, new), in order, from ONE local git: a git process costs tens of ms, and a
    run counts every shipped file before it sends the changes. Each pair is a file in two temp dirs named by
    its index (a new file has none on the left), so no path of the target reaches this machine's disk."""
    if not changes:
        return []
    with tempfile.TemporaryDirectory(prefix="deployer-diff-") as tmp:
        left, right = Path(tmp, "a"), Path(tmp, "b")
        left.mkdir()
        right.mkdir()
        for index, (_, old, new) in enumerate(changes):
            if old is not None:
                (left / str(index)).write_bytes(old)
            (right / str(index)).write_bytes(new)
        proc = subprocess.run(["git", "diff", "--no-index", "--no-renames", "--numstat", "-z", DIFF_ALGORITHM, "--",
                               str(left), str(right)], capture_output=True, timeout=60, check=False)
    if proc.returncode not in (0, 1):
        raise DeployerError(f"git diff --no-index failed here: {proc.stderr.decode(errors='replace')}")
    # Each record names its right side, .../b/INDEX; a file whose bytes are unchanged has none.
    found = {int(posixpath.basename(stat.path)): stat for stat in parse_numstat(proc.stdout.decode(errors="replace"))}
    return [replace(found[i], path=path) if i in found else FileStat(path, 0, 0)
            for i, (path, _, _) in enumerate(changes)]


def unified(path: str, old: bytes | None, new: bytes) -> str:
    """A unified diff for people to read (target's current file -> the new file)."""
    try:
        old_lines = (old or b"").decode("utf-8").splitlines(keepends=True)
        new_lines = new.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return f"Binary file {path} differs\n"
    fromfile = "/dev/null" if old is None else f"a/{path}"
    text = "".join(difflib.unified_diff(old_lines, new_lines, fromfile, f"b/{path}"))
    return text if text.endswith("\n") or not text else text + "\n\\ No newline at end of file\n"
