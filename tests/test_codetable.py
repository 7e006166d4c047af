"""deployer/codetable.py: dataclass methods and annotations compiled once per install, and nothing else changed by it.

In-process tests point dataclasses' exec and typing's compile at a CodeTable of their own (monkeypatched back
after); the cross-process ones run fresh interpreters with DEPLOYER_CODE_TABLE naming a file in tmp_path, so the
suite never writes the table beside the package it tests."""

from __future__ import annotations

import dataclasses
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest

from deployer import codetable
from deployer.codetable import CodeTable, _header

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def writes_bytecode(monkeypatch: pytest.MonkeyPatch) -> None:
    """As where .pyc files are written (a shell with PYTHONDONTWRITEBYTECODE runs the suite in some sandboxes)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


def made_with(table: CodeTable, monkeypatch: pytest.MonkeyPatch) -> type:
    """A frozen dataclass made while table answers dataclasses' exec (as installed() makes it answer)."""
    with monkeypatch.context() as patched:
        patched.setattr(dataclasses, "exec", table.exec, raising=False)
        return dataclasses.make_dataclass("Point", [("x", int), ("y", int, dataclasses.field(default=2))],
                                          frozen=True)


def behaves_as_a_frozen_point(cls: type) -> None:
    point = cls(1)
    assert (point.x, point.y) == (1, 2)
    assert point == cls(1, 2) and point != cls(1, 3)
    assert hash(point) == hash(cls(1, 2))
    assert repr(point) == "Point(x=1, y=2)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 5


def test_a_second_table_on_the_same_file_compiles_nothing_and_makes_the_same_class(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "table.bin"
    first = CodeTable(str(path))
    behaves_as_a_frozen_point(made_with(first, monkeypatch))
    assert first.grown
    first.save()
    assert path.read_bytes().startswith(_header()) and not first.grown

    second = CodeTable(str(path))
    behaves_as_a_frozen_point(made_with(second, monkeypatch))
    assert not second.grown, "every method's code came from the table"
    assert second.used and all(second.used[group] <= set(second.groups[group]) for group in second.used)
    written = path.stat().st_ino
    second.save()  # nothing compiled: nothing written (a save replaces the file)
    assert path.stat().st_ino == written


def test_annotations_come_from_the_table_and_a_text_that_is_no_expression_still_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "table.bin"
    first = CodeTable(str(path))
    monkeypatch.setattr(typing, "compile", first.compile, raising=False)
    assert eval(typing.ForwardRef("dict[str, int]").__forward_code__) == dict[str, int]
    with pytest.raises(SyntaxError, match="Forward reference must be an expression"):
        typing.ForwardRef("1 +")
    assert first.grown == {""}
    first.save()

    second = CodeTable(str(path))
    monkeypatch.setattr(typing, "compile", second.compile, raising=False)
    assert eval(typing.ForwardRef("dict[str, int]").__forward_code__) == dict[str, int]
    assert not second.grown
    # Any other compile (a file's, or with flags) is the builtin's, and the table keeps nothing of it.
    assert second.compile("x = 1", "a_file.py", "exec").co_filename == "a_file.py"
    assert second.compile("x = 1", "<string>", "exec", dont_inherit=True) and not second.grown


def test_methods_from_the_table_are_those_plain_exec_makes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled as dataclasses' own exec compiles them: not under codetable.py's `annotations` future, which made
    every __init__'s annotations strings (get_type_hints then failed on '_type_x')."""
    def make() -> type:
        @dataclasses.dataclass(kw_only=True)
        class Made:
            x: int
            y: list[int] = dataclasses.field(default_factory=list)
        return Made

    plain = make()
    for table in (CodeTable(str(tmp_path / "table.bin")), CodeTable(str(tmp_path / "table.bin"))):
        with monkeypatch.context() as patched:
            patched.setattr(dataclasses, "exec", table.exec, raising=False)
            tabled = make()
        table.save()  # the second table reads what the first wrote
        assert inspect.signature(tabled.__init__) == inspect.signature(plain.__init__)
        assert typing.get_type_hints(tabled.__init__) == {"x": int, "y": list[int], "return": type(None)}
        assert tabled.__init__.__code__.co_flags == plain.__init__.__code__.co_flags
    assert not table.grown


def test_a_text_that_fails_to_compile_keeps_nothing_and_the_save_still_trims(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "table.bin"
    table = CodeTable(str(path))
    monkeypatch.setattr(typing, "compile", table.compile, raising=False)
    monkeypatch.setattr(codetable, "MAX_TEXTS", 1)
    typing.ForwardRef("int")
    typing.ForwardRef("str")
    with pytest.raises(SyntaxError):
        typing.ForwardRef("a b")
    table.save()  # a group past MAX_TEXTS keeps what its process used: never the text that did not compile
    assert sorted(CodeTable(str(path))._group("")) == ["eval\nint", "eval\nstr"]


def test_a_fifo_at_the_path_is_no_table_and_holds_nothing_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "table.bin"
    os.mkfifo(path)
    table = CodeTable(str(path))
    behaves_as_a_frozen_point(made_with(table, monkeypatch))  # would block in open() without O_NONBLOCK
    assert table.grown


def test_a_link_planted_at_the_partial_name_is_neither_followed_nor_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, victim = tmp_path / "table.bin", tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, f"{path}.{os.getpid()}.tmp")
    table = CodeTable(str(path))
    made_with(table, monkeypatch)
    table.save()
    assert victim.read_text() == "keep me" and not path.exists()


def test_the_table_goes_where_the_pyc_files_go_one_per_optimization_level(tmp_path: Path) -> None:
    code = "from deployer.codetable import table_path; print(table_path())"
    env = {k: v for k, v in os.environ.items() if k != "DEPLOYER_CODE_TABLE"}
    prefix = str(tmp_path / "prefix")
    said = [subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=60, check=True).stdout.strip()
            for flags in ([], ["-O"], ["-X", f"pycache_prefix={prefix}"])]
    tag = sys.implementation.cache_tag
    assert said[0] == str(ROOT / "deployer" / "__pycache__" / f"code-table.{tag}.bin")
    assert said[1] == str(ROOT / "deployer" / "__pycache__" / f"code-table.{tag}.opt-1.bin")
    assert said[2] == os.path.join(prefix, str(ROOT / "deployer").lstrip(os.sep), f"code-table.{tag}.bin")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another_python", "group_writable", "world_writable"])
def test_a_damaged_or_writable_table_is_ignored_and_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    path = tmp_path / "table.bin"
    first = CodeTable(str(path))
    made_with(first, monkeypatch)
    first_grown = set(first.grown)
    first.save()
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(data[:len(_header()) + 30] + b"\xff" * 64)
    elif damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "another_python":
        path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    else:
        os.chmod(path, 0o664 if damage == "group_writable" else 0o646)

    again = CodeTable(str(path))
    behaves_as_a_frozen_point(made_with(again, monkeypatch))
    assert again.grown == first_grown, "nothing was taken from the damaged table"
    os.chmod(path, 0o644)
    damaged = path.stat().st_ino
    again.save()
    assert path.stat().st_ino != damaged, "written again"
    assert not made_with_fresh(path, monkeypatch).grown


def made_with_fresh(path: Path, monkeypatch: pytest.MonkeyPatch) -> CodeTable:
    table = CodeTable(str(path))
    made_with(table, monkeypatch)
    return table


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (CI runs as root)")
def test_a_table_another_user_wrote_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "table.bin"
    first = CodeTable(str(path))
    made_with(first, monkeypatch)
    first.save()
    os.chown(path, 65534, 65534)  # nobody: neither this user nor the owner of the directory it is in
    assert made_with_fresh(path, monkeypatch).grown
    os.chown(path, 0, 0)
    assert not made_with_fresh(path, monkeypatch).grown


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's view needs root to take it (CI runs as root)")
def test_a_table_the_directory_s_owner_wrote_is_read_by_another_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """A package installed by root and run by someone else: root's table, in root's directory, is read."""
    shared = Path(tempfile.mkdtemp(prefix="codetable-"))  # not pytest's tmp_path: that is root's alone (0700)
    try:
        shared.chmod(0o755)
        first = CodeTable(str(shared / "table.bin"))
        made_with(first, monkeypatch)
        first.save()
        code = ("import os, dataclasses\nfrom deployer.codetable import CodeTable\nos.seteuid(65534)\n"
                f"table = CodeTable({str(shared / 'table.bin')!r})\ndataclasses.exec = table.exec\n"
                "dataclasses.make_dataclass('Point', [('x', int), ('y', int, dataclasses.field(default=2))], "
                "frozen=True)\nprint(sorted(table.grown))")
        assert run_python(code, "off") == "[]"
    finally:
        shutil.rmtree(shared)


def test_nothing_is_written_under_dont_write_bytecode_nor_where_it_cannot_be(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "table.bin"
    table = CodeTable(str(path))
    made_with(table, monkeypatch)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    table.save()
    assert not path.exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    (tmp_path / "a_file").write_text("")
    nowhere = CodeTable(str(tmp_path / "a_file" / "table.bin"))  # its directory is a file
    made_with(nowhere, monkeypatch)
    nowhere.save()  # no error: a table is never worth failing a command for
    assert nowhere.grown and sorted(entry.name for entry in tmp_path.iterdir()) == ["a_file"]


def run_python(code: str, table: str, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run([sys.executable, *extra, "-c", code] if code else [sys.executable, *extra],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**env, "DEPLOYER_CODE_TABLE": table, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""


# What an apply imports first; the table must leave them nothing to compile.
APPLY_PATH = ("import deployer.app.applies, deployer.run.engine, deployer.config.targets, deployer.transport.factory\n"
              "from deployer.codetable import installed\n"
              "table = installed()\n"
              "print(sorted(table.grown), sum(len(keys) for keys in table.used.values()))")


def test_warm_writes_every_module_s_texts_and_a_later_process_compiles_none(tmp_path: Path) -> None:
    table = str(tmp_path / "table.bin")
    said = run_python("", table, "-m", "deployer.warm")
    texts = int(said.split()[0])
    assert said == f"{texts} texts in {table}" and texts > 500
    grown, used = run_python(APPLY_PATH, table).split("] ")
    assert grown == "[" and int(used) > 300


def test_a_command_that_compiled_texts_writes_the_table_and_off_means_none(tmp_path: Path) -> None:
    table = tmp_path / "table.bin"
    run_python("", str(table), "-m", "deployer", "schema", "inventory")
    assert table.read_bytes().startswith(_header())
    assert run_python("", "off", "-m", "deployer.warm") == "no code table: DEPLOYER_CODE_TABLE=off"
    assert run_python("import dataclasses, typing\nfrom deployer.codetable import installed\n"
                      "print(installed().path, 'exec' in vars(dataclasses), 'compile' in vars(typing))", "off") == \
        "None False False"
