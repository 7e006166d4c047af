"""The package's shape: every module imports on its own, whatever was imported before it.

A cycle between two rooms (config <-> steps, agent <-> transport) only shows when the wrong module is the first
one imported: each module is imported first here, in a fresh interpreter (one, with deployer's modules cleared
between imports), as a command or a test would."""

from __future__ import annotations

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
