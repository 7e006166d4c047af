"""Code compiled from generated text once per install, not once per process.

Two parts of Python compile text at every start-up, the same text each time. CPython's dataclasses (3.10 to 3.13
at least) build a class's __init__, __repr__, __eq__, __hash__ (and a frozen one's __setattr__ and __delattr__)
with `exec(text, ...)`: about 1 ms a class on these machines, 90 ms of an apply's start-up for the 79 classes it
loads, 40% of deployer's own import time. And typing's ForwardRef compiles each string annotation as pydantic
reads the models' (900 of them). A text's code object is a pure function of the text, its mode and the
interpreter. `installed()` answers those two with the code compiled from exactly that text (as they compile it:
without this module's own __future__ flags), kept in a table beside the package's bytecode (its __pycache__, or
where PYTHONPYCACHEPREFIX puts it; one per optimization level), written only where .pyc files would be (not
under PYTHONDONTWRITEBYTECODE; never through a link planted at its name), and read only when it is a plain file
whose owner is this user or the directory's and no one else can write it: code run at import either way, it is
trusted as the .pyc files beside it are. A text the table lacks is compiled as before and kept; `save()` writes
the table when a command ends having compiled one, and `python -m deployer.warm` writes it whole (pip writes no
table when it installs, as it writes .pyc files). A table of another Python or format, or damaged, is ignored.
DEPLOYER_CODE_TABLE names another file for it, or `off`: none, and nothing answered.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import marshal
import os
import stat
import sys
import typing
from types import CodeType
from typing import Any, TypeVar

T = TypeVar("T")

# The file's format, after the interpreter's magic: 2 since texts are compiled without inherited flags.
_FORMAT = b"deployer code table 2\n"
# A group past MAX_TEXTS texts (each deployer release adds its own) is written again with only those its process
# used, and a table past MAX_BYTES with only the groups it used. A file past READ_LIMIT is not read.
MAX_TEXTS = 2000
MAX_BYTES = 4 << 20
READ_LIMIT = 16 << 20


def _header() -> bytes:
    """What a table starts with: the interpreter's bytecode magic (marshal's format and what compile() makes both
    change with it), then the file's format."""
    from importlib.util import MAGIC_NUMBER

    return MAGIC_NUMBER + _FORMAT


def table_path() -> str | None:
    """Where the table is (None: nowhere): in the directory this package's .pyc files go to."""
    chosen = os.environ.get("DEPLOYER_CODE_TABLE")
    if chosen == "off" or not sys.implementation.cache_tag:  # an interpreter without bytecode caching
        return None
    if chosen:
        return chosen
    from importlib.util import cache_from_source

    level = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""
    return os.path.join(os.path.dirname(cache_from_source(os.path.abspath(__file__))),
                        f"code-table.{sys.implementation.cache_tag}{level}.bin")


class CodeTable:
    """exec and compile of a text as before, with the code of each text compiled before taken from a table.

    The table holds a group of texts for each module whose dataclasses were made (and one for annotations), each
    marshalled on its own: a command reads the file whole but unmarshals only the groups of the modules it loads,
    and a command that compiles nothing writes nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.blobs: dict[str, bytes] | None = None  # read at the first text: a command with none reads nothing
        self.groups: dict[str, dict[str, CodeType]] = {}
        self.used: dict[str, set[str]] = {}
        self.grown: set[str] = set()

    def exec(self, source: Any, globals: dict[str, Any] | None = None,
             locals: Any = None) -> None:
        if isinstance(source, str):
            source = self.code(str((globals or {}).get("__name__", "")), source, "exec")
        builtins.exec(source, globals, locals)

    def compile(self, source: Any, filename: Any, mode: str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(source, str) and filename == "<string>" and not args and not kwargs:
            return self.code("", source, mode)
        return builtins.compile(source, filename, mode, *args, **kwargs)

    def code(self, group: str, text: str, mode: str) -> CodeType:
        codes = self.groups.get(group)
        if codes is None:
            codes = self.groups[group] = self._group(group)
        key = f"{mode}\n{text}"
        code = codes.get(key)
        if code is None:
            # dont_inherit: compiled as the exec or compile it stands for compiles it, not under this module's
            # `annotations` future (every __init__'s annotations would be strings). A SyntaxError keeps nothing.
            code = builtins.compile(text, "<string>", mode, dont_inherit=True)
            codes[key] = code
            self.grown.add(group)
        self.used.setdefault(group, set()).add(key)
        return code

    def _group(self, group: str) -> dict[str, CodeType]:
        if self.blobs is None:
            self.blobs = self._read()
        blob = self.blobs.get(group)
        return _unmarshalled(blob, CodeType) if blob is not None else {}

    def _read(self) -> dict[str, bytes]:
        if self.path is None:
            return {}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO at the path must not hold the start
        except OSError:
            return {}
        with open(fd, "rb") as table:
            try:
                seen = os.fstat(fd)
                if not stat.S_ISREG(seen.st_mode) or seen.st_size > READ_LIMIT or not _trusted(seen, self.path):
                    return {}
                data = table.read()
            except OSError:
                return {}
        head = _header()
        return _unmarshalled(memoryview(data)[len(head):], bytes) if data.startswith(head) else {}

    def save(self) -> None:
        """Writes the table if this process compiled a text, whole or not at all; never fails the command."""
        if not self.grown or self.blobs is None or self.path is None or sys.dont_write_bytecode:
            return
        blobs = dict(self.blobs)
        for group in list(self.grown):  # a copy: a thread may still be making a class
            codes = self.groups[group]
            if len(codes) > MAX_TEXTS:
                codes = {key: codes[key] for key in self.used.get(group, ())}
            blobs[group] = marshal.dumps(codes)
        if sum(map(len, blobs.values())) > MAX_BYTES:
            blobs = {group: blob for group, blob in blobs.items() if group in self.used}
        partial = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            # O_EXCL and O_NOFOLLOW, as a .pyc is written: nothing planted at the name is followed or truncated.
            # 0o644 at most: a table anyone else can write is never read (_trusted).
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError:
            return
        try:
            with open(fd, "wb") as table:
                table.write(_header() + marshal.dumps(blobs))
            os.replace(partial, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            return
        self.blobs = blobs
        self.grown.clear()


def _unmarshalled(data: bytes | memoryview, value: type[T]) -> dict[str, T]:
    """The dict of str to value that data marshals, or an empty one where data is anything else."""
    try:
        loaded = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(loaded, dict) or not all(
            isinstance(key, str) and isinstance(item, value) for key, item in loaded.items()):
        return {}
    return loaded


def _trusted(table: os.stat_result, path: str) -> bool:
    """Written by this user or by the owner of the directory it is in, and writable by no one else."""
    if table.st_mode & 0o022:
        return False
    if table.st_uid == os.geteuid():
        return True
    try:
        return table.st_uid == os.stat(os.path.dirname(path) or ".").st_uid
    except OSError:
        return False


_installed: CodeTable | None = None


def installed() -> CodeTable:
    """The process's CodeTable, made once; it answers dataclasses' exec and typing's compile from then on, unless
    DEPLOYER_CODE_TABLE is `off` (then nothing is answered, and nothing kept)."""
    global _installed
    if _installed is None:
        _installed = CodeTable(table_path())
        if _installed.path is not None:
            # Both call these by their global names; a module global shadows the builtin for that module alone.
            dataclasses.exec = _installed.exec  # type: ignore[attr-defined]
            typing.compile = _installed.compile  # type: ignore[attr-defined]
    return _installed
