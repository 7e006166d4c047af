"""The package's shape: every module imports on its own, whatever was imported before it, and every arrow between
rooms goes down (FLOORS).

A cycle between two rooms only shows when the wrong module is the first one imported: each module is imported
first here, in a fresh interpreter (one, with deployer's modules cleared between imports), as a command or a test
would. Two rooms that import each other through different files make no cycle of modules, and still tie both rooms
together: the floors test refuses the arrow that runs back up."""

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


# The rooms (deployer's first-level packages and top-level modules), top floor first: a module imports from its
# own room or from a room below it. The order is what the code needs (see test_every_import_between_rooms_goes_down).
FLOORS = ("launch", "warm", "cli", "ui", "demo", "app", "build", "fleet", "run", "steps", "analysis", "transport",
          "agent", "config", "daemon", "runlog", "runstate", "runowner", "sources", "diffs", "errors", "command",
          "text", "waiting", "deployer", "lean", "codetable")


def imports(path: Path, names: set[str], *, by_name: bool = True) -> list[tuple[int, str]]:
    """(line, deployer module) for every import in a file, wherever it is: inside functions too (where a circle
    hides), under `if TYPE_CHECKING:`, and (by_name) a module a registry names as a string, for importlib."""
    module = path.relative_to(REPO).as_posix().removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # `from .x import y` is relative to the file's package (level 1), `from ..x` to its parent, and so on.
            within = package.split(".")[:package.count(".") + 2 - node.level] if node.level else []
            base = ".".join([*within, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        elif by_name and isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            targets = [node.value]
        for target in targets:
            while target and target not in names:  # `from pkg.mod import name`: the module is pkg.mod
                target = target.rpartition(".")[0]
            if target and target != "deployer":
                found.append((node.lineno, target))
    return sorted(set(found))  # `from m import a, b`: one arrow


def imported_modules(path: Path, names: set[str]) -> set[str]:
    """The deployer modules a file imports anywhere in it. Not those a registry names: it imports one only when
    asked for it (transport.kinds names transport.local, which takes its Emitter type from transport.kinds)."""
    return {target for _, target in imports(path, names, by_name=False)}


def room(module: str) -> str:
    """deployer.steps.git -> steps; deployer.errors -> errors; deployer (its __init__) -> deployer."""
    return module.split(".")[1] if "." in module else module


def source(name: str) -> Path:
    package = REPO / name.replace(".", "/") / "__init__.py"
    return package if package.is_file() else REPO / (name.replace(".", "/") + ".py")


def test_every_room_has_one_floor() -> None:
    rooms = {room(name) for name in modules()}
    assert sorted(rooms - set(FLOORS)) == [], "new rooms: give each its floor in FLOORS"
    assert sorted(set(FLOORS) - rooms) == [], "FLOORS names rooms the package no longer has"
    assert len(set(FLOORS)) == len(FLOORS)


def test_every_import_between_rooms_goes_down() -> None:
    """Data flows one way, and so do imports: each room imports only from the rooms below it (FLOORS, top first).

        cli > ui > demo > app > build > fleet > run > steps > analysis > transport > agent > config
            > runlog > runstate > runowner > diffs > errors > command > text > waiting > deployer (__init__) > lean

    cli parses and ui renders what app's use cases return; build makes the engines, transports and fleets from a
    config; fleet runs many per-host runs; run drives each host's steps; steps plan and send their actions through
    a transport; a Transport owns the agent client that speaks over its pipe (agent/pipe.py is the Pipe the client
    needs, implemented up in transport/pipes.py); config is the models every room above reads; the base modules
    (the run's log and write-ahead record, errors, argv quoting, text, waits) serve everyone.

    Every import counts, wherever it is written: inside a function (a lazy import is an arrow all the same, only
    later), under `if TYPE_CHECKING:` (a type named from a room above is knowledge of that room: mypy follows it,
    and the room cannot be understood, moved or tested without the one above), and a module a registry names as a
    string. A room that needs something from above it gets it moved down to where it belongs, or injected (a
    Protocol in the lower room, implemented above: agent.pipe.Pipe, steps.optional.RouterReach)."""
    names = set(modules())
    floor = {name: level for level, name in enumerate(FLOORS)}
    upward = []
    for name in sorted(names):
        path = source(name)
        for line, target in imports(path, names):
            if floor.get(room(target), -1) < floor.get(room(name), -1):
                upward.append(f"{path.relative_to(REPO)}:{line}: imports {target}: {room(target)} is above "
                              f"{room(name)}")
    assert upward == [], "imports that run back up the floors:\n" + "\n".join(upward)


# What the command line may reach: its own modules, the renderers, the use cases (and the demo, which runs as one),
# and the failures and text it shows. Everything else of the core is app's to call.
# codetable: the command line saves the process's code table as it exits, a program's concern no caller of app has.
# daemon: `deployer daemon` starts and stops the process that runs commands, a program's concern too.
FRONT = ("cli", "ui", "app", "demo", "errors", "text", "codetable", "daemon")


def test_the_command_line_reaches_the_core_only_through_app() -> None:
    """cli/ parses, calls app/ and maps outcomes to exit codes (DESIGN.md): a cli module that imports build,
    fleet, run, steps, config... decides something a Python caller of deployer.app would not get."""
    names = set(modules())
    reached = [f"{source(name).relative_to(REPO)}:{line}: imports {target}"
               for name in sorted(names) if room(name) == "cli"
               for line, target in imports(source(name), names) if room(target) not in FRONT]
    assert reached == [], "cli modules that reach past app:\n" + "\n".join(reached)


def test_no_module_reaches_back_to_a_module_that_imports_it_even_inside_a_function() -> None:
    names = set(modules())
    edges = {name: imported_modules(source(name), names) - {name} for name in names}
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
