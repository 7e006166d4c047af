"""`python -m deployer.warm`: writes what makes deployer start fast that pip does not write when it installs.

pip byte-compiles the package, but the code table (codetable.py) is written by the first command that compiles a
text, and only where .pyc files would be written: an image built with PYTHONDONTWRITEBYTECODE, or a package
installed by root and run by others, never gets one. This imports every deployer module, so the table holds all
their texts, and writes it whatever PYTHONDONTWRITEBYTECODE says (it was asked for by name)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import deployer
from deployer.codetable import installed


def import_every_module() -> None:
    """Every module a command may import, the lazy ones too (not `python -m deployer`'s, which runs one)."""
    for module in pkgutil.walk_packages(deployer.__path__, "deployer."):
        if module.name not in ("deployer.__main__", "deployer.warm"):
            importlib.import_module(module.name)


def build_deferred_models() -> int:
    """Build the validator of every deployer model that defers it to its first use (how many were built). A
    command pays for the ones it uses, about 70 ms of an apply; a daemon (deployer/daemon) pays once for all.
    A model that cannot be built alone (a mixin whose subclasses' validators are the ones used) is left as it is."""
    from pydantic import BaseModel
    from pydantic.errors import PydanticUserError

    built = 0
    stack: list[type[BaseModel]] = [BaseModel]
    while stack:
        model = stack.pop()
        stack.extend(model.__subclasses__())
        if model.__module__.startswith("deployer.") and not model.__pydantic_complete__:
            try:
                built += bool(model.model_rebuild())
            except PydanticUserError:
                continue
    return built


def preload() -> None:
    """All a command may load before it runs: what a process that forks commands loads once (deployer/daemon).
    The agent's bytes too (its source and bytecode, made once a process): they are deployer's files, which a
    daemon's stamp covers."""
    import_every_module()
    build_deferred_models()
    from deployer.agent.client import agent_payload
    agent_payload()


def write_table() -> tuple[str | None, int]:
    """The table's path (None: DEPLOYER_CODE_TABLE=off) and how many texts it holds."""
    table = installed()
    if table.path is None:  # nothing would keep what the imports compile
        return None, 0
    import_every_module()
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, False
    try:
        table.save()
    finally:
        sys.dont_write_bytecode = dont_write
    return table.path, sum(len(codes) for codes in table.groups.values())


if __name__ == "__main__":
    path, texts = write_table()
    print(f"{texts} texts in {path}" if path is not None else "no code table: DEPLOYER_CODE_TABLE=off")
