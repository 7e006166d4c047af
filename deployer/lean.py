"""Libraries imported without the packages they load at import time only to use a sliver of them.

paramiko's `__init__` imports importlib.metadata (and with it email, csv and zipfile) and scans every sys.path
entry for its own distribution, only to set `__version__`: about 20 ms of every SSH command's start-up, before
its first byte. pydantic and pydantic_core mark some functions `@deprecated`, and on Pythons before 3.13
typing_extensions' decorator imports the whole asyncio package (about 27 ms of an apply's start-up) to ask
whether each is a coroutine function; pydantic's plugin loader imports importlib.metadata (or its
entry_points), which deployer's models never call. While such a module loads, each gets a stand-in in
sys.modules that answers just that sliver. Anything else asked of a stand-in, then or later, imports the real
module and answers from it: another release of these libraries that asks for more pays the cost, and loses
nothing. A module already loaded is never stood in for: its cost is paid and its answer is the true one.
deployer never imports asyncio, nor does paramiko, whose connection thread may run while pydantic loads.

PyYAML's reader compiles, as it loads, the characters it refuses as "all but the printable ones"; the printable
ranges past U+00FF make `re` fill its charset one code point at a time (about 55M instructions, 4% of an apply's
start-up), for one search of each document read. While yaml.reader loads, re's cache answers that pattern with
the same set listed (about 2,000 code points), which compiles at once; the entry leaves the cache with the import.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import Any


@contextmanager
def standing_in(stand_ins: Mapping[str, ModuleType | None]) -> Iterator[None]:
    """stand_ins in sys.modules (None: importing that name raises ImportError), those not loaded already."""
    placed = [name for name in stand_ins if name not in sys.modules]
    for name in placed:
        sys.modules[name] = stand_ins[name]  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in placed:  # unless the real module replaced it meanwhile (_real)
            if name in sys.modules and sys.modules[name] is stand_ins[name]:
                del sys.modules[name]


def _module(name: str, kind: type[ModuleType] = ModuleType, **attrs: Any) -> ModuleType:
    module = kind(name)
    module.__dict__.update(attrs)
    return module


def distribution_version(package: str) -> str | None:
    """The Version of package's `*.dist-info` beside it (where pip puts it), or None unless exactly one such
    directory is there with that field: what importlib.metadata.version finds, without its sys.path scan."""
    spec = PathFinder.find_spec(package)
    if spec is None or not spec.origin:
        return None
    site = os.path.dirname(os.path.dirname(spec.origin))
    try:
        found = [entry for entry in os.listdir(site)
                 if entry.endswith(".dist-info") and entry.split("-")[0].lower() == package]
        if len(found) != 1:
            return None
        with open(os.path.join(site, found[0], "METADATA"), encoding="utf-8") as metadata:
            for line in metadata:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():  # the headers end here
                    return None
    except OSError:
        return None
    return None


def metadata_knowing(package: str) -> dict[str, ModuleType]:
    """An importlib.metadata stand-in that knows package's version alone (nothing when it cannot be found)."""
    version = distribution_version(package)
    if version is None:
        return {}

    def known(name: str) -> str:
        return version if name == package else str(_real("importlib.metadata").version(name))

    return {"importlib.metadata": _module("importlib.metadata", _Later, version=known)}


def _real(name: str) -> Any:
    """name's real module, imported now if it is not loaded: its package's stand-ins leave sys.modules first."""
    top = name.split(".", 1)[0]
    for stood, module in list(sys.modules.items()):  # a copy: another thread may be importing meanwhile
        if isinstance(module, _Later) and stood.split(".", 1)[0] == top:
            sys.modules.pop(stood, None)
    return importlib.import_module(name)


class _Later(ModuleType):
    """A stand-in whose every attribute it was not given comes from the real module, imported then."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # the import system's probes (`from m import x`
            raise AttributeError(name)  # asks for m.__path__), not the module's contents
        return getattr(_real(self.__name__), name)


def _not_a_coroutine_function(function: Callable[..., object]) -> bool:
    """asyncio.coroutines.iscoroutinefunction, answered without asyncio for what is plainly no coroutine."""
    import inspect

    if inspect.iscoroutinefunction(function) or hasattr(function, "_is_coroutine"):
        return bool(_real("asyncio.coroutines").iscoroutinefunction(function))
    return False


def _pydantic_stand_ins() -> dict[str, ModuleType | None]:
    """asyncio, for typing_extensions' @deprecated; importlib.metadata, which pydantic's plugin loader imports
    at once but reads only to look for plugins (never, for deployer's models: config/validation.py)."""
    def entry_points(**select: Any) -> Any:
        return _real("importlib.metadata").entry_points(**select)

    coroutines = _module("asyncio.coroutines", _Later, iscoroutinefunction=_not_a_coroutine_function)
    return {"asyncio": _module("asyncio", _Later, coroutines=coroutines), "asyncio.coroutines": coroutines,
            "importlib.metadata": _module("importlib.metadata", _Later, entry_points=entry_points)}


class _Within:
    """A module's loader, run within around() (a context its module loads in)."""

    def __init__(self, loader: Any, around: Callable[[], AbstractContextManager[None]]) -> None:
        self.loader = loader
        self.around = around

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self.loader.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # nothing after the import sees this wrapper
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with self.around():
            self.loader.exec_module(module)


class _PydanticWithoutAsyncio:
    """On sys.meta_path: each module of pydantic and pydantic_core imported while asyncio is not loaded yet
    runs with it stood in for (pydantic decorates its deprecated methods as its modules load, lazily)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name.split(".", 1)[0] not in ("pydantic", "pydantic_core") or "asyncio" in sys.modules:
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Within(spec.loader, lambda: standing_in(_pydantic_stand_ins()))  # type: ignore[assignment]
        return spec


def pydantic_without_asyncio() -> None:
    """pydantic and pydantic_core, whoever imports them first from now on, do not load asyncio."""
    if sys.version_info < (3, 13) and not any(isinstance(f, _PydanticWithoutAsyncio) for f in sys.meta_path):
        sys.meta_path.insert(0, _PydanticWithoutAsyncio())


YAML_NON_PRINTABLE = "[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010ffff]"  # yaml.reader's
NON_PRINTABLE_LISTED = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x84\x86-\x9F\uD800-\uDFFF\uFFFE\uFFFF]"  # the same, listed


@contextmanager
def non_printable_at_once() -> Iterator[None]:
    """re.compile(YAML_NON_PRINTABLE) answers NON_PRINTABLE_LISTED's pattern meanwhile (a `re` without that cache,
    or with the entry there already, compiles it as it would)."""
    key, caches = (str, YAML_NON_PRINTABLE, 0), [getattr(re, name, None) for name in ("_cache", "_cache2")]
    cache = caches[0]
    if not isinstance(cache, dict) or any(isinstance(c, dict) and key in c for c in caches):
        yield
        return
    cache[key] = re.compile(NON_PRINTABLE_LISTED)
    try:
        yield
    finally:
        for c in caches:
            if isinstance(c, dict):
                c.pop(key, None)


class _YamlReaderAtOnce:
    """On sys.meta_path: yaml.reader, whoever imports yaml first, loads within non_printable_at_once."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != "yaml.reader":
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Within(spec.loader, non_printable_at_once)  # type: ignore[assignment]
        return spec


def yaml_reader_at_once() -> None:
    """yaml, whoever imports it first from now on, compiles its reader's printable pattern at once."""
    if "yaml.reader" not in sys.modules and not any(isinstance(f, _YamlReaderAtOnce) for f in sys.meta_path):
        sys.meta_path.insert(0, _YamlReaderAtOnce())
