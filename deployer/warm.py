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


def write_table() -> tuple[str | None, int]:
    """The table's path (None: DEPLOYER_CODE_TABLE=off) and how many texts it holds."""
    table = installed()
    if table.path is None:  # nothing would keep what the imports compile
        return None, 0
    for module in pkgutil.walk_packages(deployer.__path__, "deployer."):
        if module.name not in ("deployer.__main__", "deployer.warm"):
            importlib.import_module(module.name)
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, False
    try:
        table.save()
    finally:
        sys.dont_write_bytecode = dont_write
    return table.path, sum(len(codes) for codes in table.groups.values())


if __name__ == "__main__":
    path, texts = write_table()
    print(f"{texts} texts in {path}" if path is not None else "no code table: DEPLOYER_CODE_TABLE=off")
