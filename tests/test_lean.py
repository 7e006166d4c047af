"""deployer/lean.py: paramiko and pydantic imported without importlib.metadata and asyncio, and nothing lost by it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_repo import Project

from deployer.lean import (
    NON_PRINTABLE_LISTED,
    YAML_NON_PRINTABLE,
    _pydantic_stand_ins,
    distribution_version,
    metadata_knowing,
    standing_in,
)

ROOT = Path(__file__).resolve().parents[1]


def probe(code: str, *, cwd: Path, env: dict[str, str] | None = None) -> str:
    """The last line code prints in a fresh python (the suite's own process has asyncio loaded by pytest)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd,
                            env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_an_ssh_apply_loads_neither_asyncio_nor_importlib_metadata_and_paramiko_knows_its_version(
        target: Project) -> None:
    target.playbook()
    code = ("import sys; from deployer.cli import main\n"
            "try:\n    main(['apply', 'fix.yaml', '--host', 'box'])\nexcept SystemExit as exc:\n    code = exc.code\n"
            "loaded = sorted(m for m in ('asyncio', 'importlib.metadata', 'invoke') if m in sys.modules)\n"
            "import paramiko, importlib.metadata, asyncio\n"
            "print(code, loaded, paramiko.__version__ == importlib.metadata.version('paramiko'),"
            " asyncio.run(asyncio.sleep(0, 'real asyncio')))")
    assert probe(code, cwd=target.root, env=target.env()) == "0 [] True real asyncio"


# What a plain single-host apply never needs: a drain's metrics step and its load generator (http.client, email),
# the service managers (and what they bring), rich (its
# output is no terminal), the fleet's runner and the analysis. Each costs start-up CPU in every apply.
NOT_FOR_A_PLAIN_APPLY = ("rich", "http.client", "email.parser", "deployer.steps.metrics",
                         "deployer.steps.loadgen", "deployer.steps.services", "deployer.fleet.runner",
                         "deployer.analysis")
NOT_FOR_HELP = ("pydantic", "yaml", "paramiko", "rich", "json", "deployer.config", "deployer.app")


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_plain_ssh_apply_loads_only_what_its_steps_and_its_plain_output_need(target: Project) -> None:
    target.playbook()
    code = ("import sys; from deployer.cli import main\n"
            "try:\n    main(['apply', 'fix.yaml', '--host', 'box'])\nexcept SystemExit as exc:\n    code = exc.code\n"
            f"print(code, sorted(m for m in {NOT_FOR_A_PLAIN_APPLY!r} if m in sys.modules))")
    assert probe(code, cwd=target.root, env=target.env()) == "0 []"


def test_the_command_line_loads_click_alone_until_a_command_runs(tmp_path: Path) -> None:
    # `deployer --help` and shell completion import deployer.cli and nothing of the core.
    code = f"import sys, deployer.cli\nprint(sorted(m for m in {NOT_FOR_HELP!r} if m in sys.modules))"
    assert probe(code, cwd=tmp_path) == "[]"


def test_the_listed_non_printable_set_is_yamls_own_at_every_code_point() -> None:
    every = "".join(map(chr, range(0x110000)))
    yamls = re.compile(YAML_NON_PRINTABLE, re.UNICODE)  # its flag: never the cache's entry (str patterns are unicode)
    assert [m.start() for m in re.compile(NON_PRINTABLE_LISTED).finditer(every)] == [
        m.start() for m in yamls.finditer(every)]


def test_yaml_loaded_after_deployer_refuses_the_same_characters_in_the_same_words_and_leaves_res_cache_as_it_was(
        tmp_path: Path) -> None:
    load = ("import yaml\nfor text in ('a: \\x07', 'a: \\ud800', 'a: \\ufffe', 'a: \\U0010ffff\\xa0\\x85'):\n"
            "    try:\n        print(repr(yaml.safe_load(text)), end=' | ')\n"
            "    except yaml.YAMLError as exc:\n        print(str(exc).replace(chr(10), ' '), end=' | ')\n"
            "print()\n")
    alone = probe(load, cwd=tmp_path)
    code = (f"import re, deployer\n{load}"
            "import yaml.reader\nfrom deployer.lean import NON_PRINTABLE_LISTED, YAML_NON_PRINTABLE\n"
            "print(yaml.reader.Reader.NON_PRINTABLE.pattern == NON_PRINTABLE_LISTED,"
            " re.compile(YAML_NON_PRINTABLE).pattern == YAML_NON_PRINTABLE)")
    with_deployer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                   cwd=tmp_path, check=True).stdout.splitlines()
    assert [line.strip() for line in with_deployer] == [alone, "True True"]
    assert "unacceptable character #xd800" in alone and "{'a': '\\U0010ffff\\xa0'}" in alone  # U+0085: a line break


def test_pydantic_still_warns_of_its_deprecated_methods_and_its_plugin_loader_gets_importlib_metadata(
        tmp_path: Path) -> None:
    # Its @deprecated wrappers were made with asyncio stood in for: they must still be the warning wrappers. Its
    # plugin loader took a stand-in for importlib.metadata (the module, or its entry_points, by release): when
    # it looks for plugins after all, that is the real one.
    code = ("import sys, warnings, deployer.config.validation, pydantic\n"
            "from pydantic.plugin import _loader\n"
            "class M(pydantic.BaseModel):\n    x: int = 1\n"
            "with warnings.catch_warnings(record=True) as seen:\n    warnings.simplefilter('always')\n"
            "    M().dict()\n"
            "loaded = sorted(m for m in ('asyncio', 'importlib.metadata') if m in sys.modules)\n"
            "_loader._plugins = None\n"
            "print(loaded, [w.category.__name__ for w in seen], list(_loader.get_plugins()),"
            " 'importlib.metadata' in sys.modules)")
    assert probe(code, cwd=tmp_path) == "[] ['PydanticDeprecatedSince20'] [] True"


def test_a_module_that_asks_a_stand_in_for_more_gets_the_real_modules(tmp_path: Path) -> None:
    # Another release of a library may import more of asyncio or importlib.metadata while it loads: it must get
    # the real thing (at the real cost), and the stand-ins must leave the real modules in place behind them.
    (tmp_path / "asks_more.py").write_text(
        "import asyncio.coroutines\nfrom asyncio import sleep\nfrom importlib.metadata import entry_points, version\n")
    (tmp_path / "asks_the_sliver.py").write_text(
        "import asyncio.coroutines\nfrom importlib.metadata import entry_points\n")
    code = ("import sys\nfrom deployer.lean import _pydantic_stand_ins, standing_in\n"
            "with standing_in(_pydantic_stand_ins()):\n    import asks_the_sliver\n"
            "    sliver = sorted(m for m in ('asyncio', 'importlib.metadata')\n"
            "                    if type(sys.modules[m]).__name__ == 'module')\n"
            "    import asks_more\n"
            "import asyncio, importlib.metadata\n"
            "print(sliver, type(sys.modules['asyncio']).__name__, asks_more.sleep is asyncio.sleep,"
            " asks_more.version is importlib.metadata.version,"
            " asks_more.asyncio.coroutines.iscoroutinefunction(asyncio.sleep))")
    assert probe(code, cwd=tmp_path) == "[] module True True True"


def test_the_asyncio_stand_in_answers_the_decorator_itself_and_the_rest_from_the_real_asyncio() -> None:
    import asyncio as real

    stand_ins = _pydantic_stand_ins()
    asyncio, coroutines = stand_ins["asyncio"], stand_ins["asyncio.coroutines"]
    assert asyncio is not None and coroutines is not None and asyncio.coroutines is coroutines
    assert coroutines.iscoroutinefunction(len) is False

    async def waits() -> None:
        pass

    assert coroutines.iscoroutinefunction(waits) is True  # asked by the real asyncio
    # A module that kept the stand-in (imported while it stood in) gets the real asyncio's attributes after;
    # while it stands in, see test_a_module_that_asks_a_stand_in_for_more_gets_the_real_modules.
    assert asyncio.get_event_loop is real.get_event_loop


def test_a_stand_in_never_replaces_a_loaded_module_and_leaves_with_its_import() -> None:
    real = sys.modules["json"]
    with standing_in({"json": None, "deployer_no_such_module": None}):
        assert sys.modules["json"] is real
        with pytest.raises(ImportError):
            import deployer_no_such_module  # noqa: F401
    assert "deployer_no_such_module" not in sys.modules and sys.modules["json"] is real


def put_package(site: Path, name: str, *dist_infos: tuple[str, str]) -> None:
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    for directory, metadata in dist_infos:
        (site / directory).mkdir()
        (site / directory / "METADATA").write_text(metadata)


@pytest.mark.parametrize(("dist_infos", "expected"), [
    ([("fakepkg-1.2.3.dist-info", "Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.2.3\n\nVersion: 9\n")],
     "1.2.3"),
    ([], None),  # not installed by pip: importlib.metadata is left to find it
    ([("fakepkg-1.0.dist-info", "Version: 1.0\n"), ("fakepkg-2.0.dist-info", "Version: 2.0\n")], None),
    ([("fakepkg-1.0.dist-info", "Name: fakepkg\n\nVersion: 1.0\n")], None),  # only in the body: no version
])
def test_a_version_is_read_only_from_exactly_one_dist_info_beside_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dist_infos: list[tuple[str, str]],
        expected: str | None) -> None:
    put_package(tmp_path, "fakepkg", *dist_infos)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert distribution_version("fakepkg") == expected
    stand_in = metadata_knowing("fakepkg").get("importlib.metadata")
    if expected is None:
        assert stand_in is None
        return
    assert stand_in is not None and stand_in.version("fakepkg") == expected
    import importlib.metadata

    assert stand_in.version("pydantic") == importlib.metadata.version("pydantic")  # any other: the real lookup
