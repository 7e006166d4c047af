"""The package's shape: every module imports on its own, whatever was imported before it.

A cycle between two rooms (config <-> steps, agent <-> transport) only shows when the wrong module is the first
one imported: each module is imported first here, in a fresh interpreter (one, with deployer's modules cleared
between imports), as a command or a test would."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP = ("deployer/demo/stack/", "deployer/demo/playbook/", "deployer/__main__.py")

PROBE = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "deployer" or m.startswith("deployer.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\\n".join(failed))
"""


def modules() -> list[str]:
    found = []
    for path in sorted((REPO / "deployer").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith(SKIP) and rel not in SKIP:
            found.append(rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return found


def test_every_module_imports_first_without_an_import_cycle() -> None:
    names = modules()
    assert "deployer.run.engine" in names and "deployer.config.models" in names
    probe = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True, timeout=120,
                           cwd=REPO)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "", probe.stdout


def imported_modules(path: Path, names: set[str]) -> set[str]:
    """The deployer modules a file imports anywhere in it, inside functions too (where a circle hides)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                   else [f"{node.module}.{alias.name}" for alias in node.names]
                   if isinstance(node, ast.ImportFrom) and node.module else [])
        for target in targets:
            while target and target not in names:  # `from pkg.mod import name`: the module is pkg.mod
                target = target.rpartition(".")[0]
            if target and target != "deployer":
                found.add(target)
    return found


def test_no_module_reaches_back_to_a_module_that_imports_it_even_inside_a_function() -> None:
    names = set(modules())
    edges = {name: imported_modules(REPO / (name.replace(".", "/") + ".py"), names) - {name}
             for name in names if (REPO / (name.replace(".", "/") + ".py")).is_file()}
    circles = []
    for start in sorted(edges):
        # Every module reachable from start; start among them is a circle through it.
        seen, todo = set(), list(edges[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(edges.get(name, ()))
        if start in seen:
            circles.append(start)
    assert circles == [], f"modules on an import circle: {circles}"
