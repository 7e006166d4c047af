"""Hostile or mistyped config files: refused at load time with exit 2 and file:line:column, quickly.

Names that could split a line-based answer or read as an option, YAML bombs, URLs a step can
never use, and the position of an unknown step kind. Everything here is found before any
connection, so the CLI cases run against a `local` target only.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from fixtures_repo import Project
from test_config import error_of, write

from deployer.config.models import load_inventory
from deployer.errors import ConfigError
from deployer.steps.playbook import load_playbook

# A hang guard, not the timing target (that belongs in a bench): today a bomb runs for minutes.
HANG_GUARD_S = 5.0
MAX_BYTES = 1024 * 1024  # the documented cap on a playbook or inventory file


def inventory_error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    return str(caught.value)


# -- names: control characters and a leading '-' ------------------------------------------------------

# NUL, CR, LF, TAB, ESC, DEL, NEL, LINE SEPARATOR, RIGHT-TO-LEFT OVERRIDE, as YAML double-quoted escapes
# (str.splitlines() splits on NEL and U+2028 too).
BAD_CHARS = {"\\0": "\0", "\\r": "\r", "\\n": "\n", "\\t": "\t", "\\e": "\x1b", "\\x7f": "\x7f",
             "\\x85": "\x85", "\\u2028": "\u2028", "\\u202e": "\u202e"}


@pytest.mark.parametrize("escape, char", BAD_CHARS.items())
def test_a_dest_with_a_control_character_is_refused_at_load_time(tmp_path: Path, escape: str,
                                                                  char: str) -> None:
    path = write(tmp_path, f'name: x\nfiles:\n  - src: a.py\n    dest: "a{escape}b.py"\nsteps: [upload]\n')
    message = error_of(path)
    assert message.startswith(f"{path}:4:11: files.0.dest: must not contain control characters")
    assert f"U+{ord(char):04X}" in message


@pytest.mark.parametrize("escape, char", BAD_CHARS.items())
def test_a_src_with_a_control_character_is_refused_at_load_time(tmp_path: Path, escape: str,
                                                                 char: str) -> None:
    if char != "\0":  # the file exists, so only its name can be the reason
        (tmp_path / f"a{char}b.py").write_text("x = 1\n")
    path = write(tmp_path, f'name: x\nfiles:\n  - src: "a{escape}b.py"\n    dest: a.py\nsteps: [upload]\n')
    message = error_of(path)
    assert message.startswith(f"{path}:3:10: files.0.src: must not contain control characters")
    assert f"U+{ord(char):04X}" in message


def test_a_patch_path_with_a_newline_is_refused_at_load_time(tmp_path: Path) -> None:
    (tmp_path / "fix\n.diff").write_text("")
    path = write(tmp_path, 'name: x\npatch: "fix\\n.diff"\nsteps: [upload]\n')
    assert error_of(path).startswith(f"{path}:2:8: patch: must not contain control characters (U+000A")


@pytest.mark.parametrize("field, line, column", [("src", 3, 10), ("dest", 4, 11)])
@pytest.mark.parametrize("name", ["-rf.py", "./-rf.py", "pkg/../-rf.py"])
def test_a_path_that_starts_with_a_dash_is_refused_at_load_time(tmp_path: Path, field: str, line: int,
                                                               column: int, name: str) -> None:
    (tmp_path / "-rf.py").write_text("x = 1\n")
    src, dest = (name, "a.py") if field == "src" else ("a.py", name)
    path = write(tmp_path, f"name: x\nfiles:\n  - src: {src}\n    dest: {dest}\nsteps: [upload]\n")
    message = error_of(path)
    assert message.startswith(f"{path}:{line}:{column}: files.0.{field}: ")
    assert "must not start with '-'" in message or "'..'" in message


def test_a_patch_path_that_starts_with_a_dash_is_refused_at_load_time(tmp_path: Path) -> None:
    (tmp_path / "-fix.diff").write_text("")
    path = write(tmp_path, "name: x\npatch: ./-fix.diff\nsteps: [upload]\n")
    assert error_of(path).startswith(f"{path}:2:8: patch: must not start with '-'")


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_dest_with_a_newline_exits_2_before_connecting(target: Project) -> None:
    target.write("fix.yaml", 'name: x\nfiles:\n  - {src: fix/a.py, dest: "pkg/a.py\\n/tmp/zzz"}\n'
                             "steps: [upload]\n")
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    assert "fix.yaml:3:27: files.0.dest: must not contain control characters (U+000A" in result.stderr
    assert not target.runs.exists()


# -- YAML bombs ---------------------------------------------------------------------------------------

def laughs(levels: int) -> str:
    """The classic billion-laughs shape: each level lists the previous one ten times."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        ref = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([ref] * 10)}]")
    return "\n".join(lines) + "\nname: x\nsteps: [upload]\n"


def run_timed(target: Project, *args: str) -> tuple[float, str, int]:
    start = time.monotonic()
    result = target.deployer(*args, timeout=60)
    return time.monotonic() - start, result.stderr, result.returncode


POSITION = r"fix\.yaml:\d+:\d+: "


@pytest.mark.parametrize("target", ["local"], indirect=True)
@pytest.mark.parametrize("levels", [9, 6])
def test_a_billion_laughs_playbook_exits_2_quickly(target: Project, levels: int) -> None:
    text = laughs(levels)
    assert len(text) < 1024  # a few hundred bytes, like the 680-byte one in the report
    target.write("fix.yaml", text)
    elapsed, stderr, code = run_timed(target, "plan", "fix.yaml", "--host", "box")
    assert code == 2, stderr
    assert re.search(POSITION + r"YAML aliases expand to more than [\d,]+ values", stderr), stderr
    assert "Traceback" not in stderr
    assert elapsed < HANG_GUARD_S


@pytest.mark.parametrize("target", ["local"], indirect=True)
@pytest.mark.parametrize("shape", ["[", "{a: "])
def test_a_playbook_nested_1000_deep_exits_2_quickly(target: Project, shape: str) -> None:
    closing = "]" if shape == "[" else "}"
    target.write("fix.yaml", "name: x\nsteps: [upload]\nextra: " + shape * 1000 + "1" + closing * 1000 + "\n")
    elapsed, stderr, code = run_timed(target, "plan", "fix.yaml", "--host", "box")
    assert code == 2, stderr
    assert re.search(POSITION + "nested deeper than 64 levels", stderr), stderr
    assert "RecursionError" not in stderr and "Traceback" not in stderr
    assert elapsed < HANG_GUARD_S


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_an_oversize_playbook_exits_2_quickly(target: Project) -> None:
    body = "name: x\nfiles: [{src: fix/a.py, dest: pkg/a.py}]\nsteps: [upload]\n"
    target.write("fix.yaml", body + "#" * (MAX_BYTES - len(body)) + "\n")  # valid YAML, one byte too many
    elapsed, stderr, code = run_timed(target, "plan", "fix.yaml", "--host", "box")
    assert code == 2, stderr
    assert re.search(POSITION + r"the file is larger than 1 MiB", stderr), stderr
    assert elapsed < HANG_GUARD_S


def test_a_playbook_at_the_size_cap_still_loads(tmp_path: Path) -> None:
    body = "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps: [upload]\n"
    path = write(tmp_path, body + "#" * (MAX_BYTES - len(body) - 1) + "\n")
    assert path.stat().st_size == MAX_BYTES
    model, _ = load_playbook(path)
    assert model.model.name == "x"


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nsteps: [upload]\nextra: &loop [1, *loop]\n")
    assert error_of(path).startswith(f"{path}:3:18: a YAML alias refers to a node that contains it")


def test_an_inventory_bomb_is_refused_too(tmp_path: Path) -> None:
    path = write(tmp_path, laughs(9).replace("name: x\nsteps: [upload]\n", "hosts: {}\n"), "hosts.yaml")
    start = time.monotonic()
    assert re.match(re.escape(str(path)) + r":\d+:\d+: YAML aliases expand", inventory_error_of(path))
    assert time.monotonic() - start < HANG_GUARD_S


def test_a_few_aliases_for_shared_params_still_work(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps:\n"
                           "  - baseline: &poll {metric: m, url: 'http://127.0.0.1:1/metrics', interval_s: 0.5}\n"
                           "  - baseline: *poll\n  - baseline: *poll\n")
    _, steps = load_playbook(path)
    assert [s.name for s in steps] == ["baseline", "baseline#2", "baseline#3"]


# -- URLs a step can never use: config errors, not "internal error" -----------------------------------

STORM_CASES = [
    ("storm: {requests: 5, url: 'http://10.0.0.1:8000/generate'}", "steps.0.storm.url", "not loopback"),
    ("storm: {requests: 5, url: /generate}", "steps.0.storm.url", "absolute"),
    ("storm: {requests: 5, url: 'http://127.0.0.1:8000/generate', abort_url: 'http://192.0.2.1/abort'}",
     "steps.0.storm.abort_url", "not loopback"),
    ("storm: {requests: 5, url: 'https://127.0.0.1:8000/generate'}", "steps.0.storm.url", "http://"),
    ("baseline: {metric: m, url: 'http://127.0.0.1:1/metrics', storm: {url: 'http://10.0.0.1/generate'}}",
     "steps.0.baseline.storm.url", "not loopback"),
    ("drain: {metric: m, to: 0, url: /metrics}", "steps.0.drain.url", "absolute"),
    ("baseline: {metric: m, url: 'http://127.0.0.1:99999/metrics'}", "steps.0.baseline.url", "port"),
]


@pytest.mark.parametrize("target", ["local"], indirect=True)
@pytest.mark.parametrize("step, field, why", STORM_CASES)
def test_a_step_url_that_cannot_be_used_is_a_config_error(target: Project, step: str, field: str,
                                                          why: str) -> None:
    target.write("fix.yaml", f"name: x\nfiles: [{{src: fix/a.py, dest: pkg/a.py}}]\nsteps:\n  - {step}\n")
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.removeprefix("error: ").splitlines()
    assert len(lines) == 1, result.stderr  # only the field at fault, no noise from other union branches
    assert re.match(rf"\S*fix\.yaml:4:\d+: {re.escape(field)}: ", lines[0]), result.stderr
    assert why in lines[0] and "internal error" not in result.stderr
    assert not target.runs.exists()  # found before a run (and a connection) started


@pytest.mark.parametrize("host, field, where, why", [
    ("endpoint: 'http://10.0.0.1:8000'", "hosts.h.endpoint", "4:15", "not loopback"),
    ("endpoint: router:8000", "hosts.h.endpoint", "4:15", "absolute"),
    ("metrics: /metrics", "hosts.h.metrics", "4:14", "absolute"),
    ("services: {web: {start: run, health: /health}}", "hosts.h.services.web.health", "4:42", "absolute"),
])
def test_an_inventory_url_that_cannot_be_used_is_a_config_error(tmp_path: Path, host: str, field: str,
                                                                where: str, why: str) -> None:
    path = write(tmp_path, f"hosts:\n  h:\n    repo: /r\n    {host}\n", "hosts.yaml")
    message = inventory_error_of(path)
    assert message.startswith(f"{path}:{where}: {field}: ") and why in message, message


def test_loopback_and_absolute_urls_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  h:\n    repo: /r\n    endpoint: 'http://[::1]:8000'\n"
                           "    metrics: 'http://gpu-node-1.example.internal:30000/metrics'\n"
                           "    services: {web: {start: run, health: 'http://localhost:30000/health'}}\n",
                 "hosts.yaml")
    host = load_inventory(path).hosts["h"]
    assert host.endpoint == "http://[::1]:8000"


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_non_loopback_endpoint_fails_before_connecting(target: Project) -> None:
    target.write_inventory(endpoint="http://10.0.0.1:8000")
    target.playbook(steps=[{"storm": {"requests": 5}}])
    result = target.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    assert re.search(r"hosts\.yaml:\d+:\d+: hosts\.box\.endpoint: .*not loopback", result.stderr), result.stderr
    assert not target.runs.exists()


# -- positions --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["  - diff_bound: {files: 1}\n", "  - diff_bound:\n      files: 1\n",
                                  "  - diff_bound:\n"])
def test_an_unknown_step_kind_points_at_its_key(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, f"name: x\nfiles: [{{src: a.py, dest: a.py}}]\nsteps:\n{text}")
    assert error_of(path).startswith(f"{path}:4:5: steps.0: unknown step kind 'diff_bound'")


# -- create: true ------------------------------------------------------------------------------------

def test_a_file_entry_takes_create_and_it_defaults_to_false(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfiles:\n  - {src: a.py, dest: new.py, create: true}\n"
                           "  - {src: a.py, dest: a.py}\nsteps: [upload]\n")
    loaded, _ = load_playbook(path)
    assert [f.create for f in loaded.model.files] == [True, False]
