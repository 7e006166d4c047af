"""The CLI's contract with scripts: exit codes, one JSON object per --json call, notices that are not errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from fixtures_repo import Project, deployer, deployer_env, hold_lock
from fixtures_services import GAUGE, Stack
from fixtures_ssh import SSHD

from deployer.cli import main

# One invocation per command that fails before it can do anything (no inventory, no run, bad args).
FAILING = {
    "plan": ["plan", "fix.yaml", "--host", "nowhere"],
    "apply": ["apply", "fix.yaml", "--host", "nowhere"],
    "rollback": ["rollback", "no-such-run"],
    "runs list": ["runs", "list", "--runs-dir", "a-file"],
    "runs show": ["runs", "show", "no-such-run"],
    "runs verify": ["runs", "verify", "no-such-run"],
    "lock status": ["lock", "status", "--host", "nowhere"],
    "lock release": ["lock", "release", "--host", "nowhere", "--force"],
    "demo": ["demo", "--stop", "--workdir", "not-a-demo"],
    "init": ["init", "--from", "not-a-repo"],
    "check": ["check", "--host", "nowhere"],
    "schema": ["schema", "no-such-kind"],
    "recover": ["recover", "no-such-run"],
    "restart": ["restart", "--host", "nowhere"],
    "canary": ["canary", "--host", "nowhere", "--record", "golden.json"],
    "logs": ["logs", "--host", "nowhere"],
    "bake": ["bake", "no-such-run"],
    "rollout resume": ["rollout", "resume", "no-such-run"],
    "rollout abort": ["rollout", "abort", "no-such-run"],
    "daemon start": ["daemon", "start", "--dir", "a-file"],
    "daemon status": ["daemon", "status", "--dir", "a-file"],
    "daemon stop": ["daemon", "stop", "--dir", "a-file"],
}


def leaf_commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(leaf_commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


def test_every_command_takes_json_and_the_failure_table_covers_them_all() -> None:
    commands = leaf_commands(main)
    assert set(commands) == set(FAILING)
    for name, command in commands.items():
        assert "--json" in [opt for p in command.params for opt in p.opts], name


@pytest.mark.parametrize("name", sorted(FAILING))
def test_a_failing_command_given_json_prints_exactly_one_json_object(name: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    result = deployer(*FAILING[name], "--json", cwd=tmp_path, timeout=60)
    assert result.returncode != 0, result.stdout
    report = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert isinstance(report, dict)
    assert report["exit_code"] == result.returncode
    assert report["error"]


def test_a_click_usage_error_given_json_is_a_json_object_with_exit_2(tmp_path: Path) -> None:
    result = deployer("plan", "--no-such-option", "--json", cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert report["exit_code"] == 2 and "--no-such-option" in report["error"]


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_plan_exits_1_when_it_prints_bounds_fail(target: Project) -> None:
    target.playbook(steps=["local_compile", "upload", {"diff_bounds": {"files": 1, "insertions": [100, 200]}}])
    before = target.head()
    shown = target.deployer("plan", "fix.yaml", "--host", "box")
    assert "bounds: FAIL" in shown.stdout
    assert shown.returncode == 1, shown.stdout + shown.stderr
    as_json = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["exit_code"] == 1 and "insertions 5 outside [100, 200]" in report["error"]
    assert report["bounds"] == ["insertions 5 outside [100, 200]"]
    assert target.head() == before


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_plan_within_bounds_exits_0_with_exit_code_0_in_its_json(target: Project) -> None:
    target.playbook()
    result = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["exit_code"] == 0


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_successful_host_key_pin_prints_a_notice_not_an_error(target: Project, sshd: SSHD,
                                                                 tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    target.write_inventory(known_hosts=str(empty))
    result = target.deployer("lock", "status", "--host", "box", "--accept-new-host-key", "--json")
    assert result.returncode == 0, result.stderr
    assert "notice: pinned a new host key" in result.stderr
    assert "error" not in result.stderr
    assert json.loads(result.stdout)["locked"] is False


def test_help_does_not_import_the_core(tmp_path: Path) -> None:
    probe = ("import sys; from deployer.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('pydantic', 'rich', 'paramiko', 'deployer.run.engine') if m in sys.modules))")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout + result.stderr
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_an_apply_off_a_terminal_does_not_import_rich(target: Project) -> None:
    """Its live view and report are plain lines on a pipe: rich, a tenth of an apply's start-up, stays unloaded."""
    target.playbook()
    probe = ("import sys; from deployer.cli import main\n"
             "try:\n    main(['apply', 'fix.yaml', '--host', 'box'])\nexcept SystemExit as exc:\n    code = exc.code\n"
             "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            cwd=target.root, env=target.env())
    assert result.stdout.strip().splitlines()[-1] == "0 []", result.stdout + result.stderr
    assert "run log: " in result.stdout


# Each sort of character that rich's Text drops, that SafeConsole shows escaped, or that rich lays out itself.
TRICKY = ["", "plain", "trailing space ", "two\nlines", "ends in a newline\n", "\n\n", "cr\rhere", "bell\x07",
          "bs\x08vt\x0bff\x0c", "esc \x1b]0;title\x07", "nul\x00del\x7f", "c1\x85\x9b", "ls\u2028ps\u2029",
          "rlo\u202eeman", "zwsp\u200b", "wide 中文 é", "[bold]markup[/bold]", "a [link]", "\\[escaped]",
          "tab\there", ":fire: emoji", "x" * 200 + " "]


@pytest.mark.parametrize("stderr", [False, True])
def test_the_plain_console_prints_what_rich_prints_off_a_terminal(stderr: bool,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from deployer.ui.console import PlainConsole, make_console

    options: list[dict[str, object]] = [{"markup": False, "highlight": False}, {"markup": False, "style": "red"}, {}]
    for text in TRICKY:
        for kwargs in options:
            make_console(stderr).print(text, **kwargs)  # type: ignore[arg-type]
            ours = capsys.readouterr()
            PlainConsole(stderr).print(text, **kwargs)  # type: ignore[arg-type]
            plain = capsys.readouterr()
            assert (plain.out, plain.err) == (ours.out, ours.err), (text, kwargs)


def test_forced_colour_or_a_terminal_setting_leaves_the_lines_to_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from deployer.ui.console import PlainConsole, line_console

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert isinstance(line_console(), PlainConsole)
    for name, value in (("FORCE_COLOR", "1"), ("TTY_COMPATIBLE", "1")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            assert not isinstance(line_console(), PlainConsole), name


# -- schema and completion --------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def schema(kind: str) -> dict[str, object]:
    result = deployer("schema", kind, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert isinstance(loaded, dict)
    return loaded


def test_the_schemas_validate_the_example_playbooks_and_inventory() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    playbook, inventory = schema("playbook"), schema("inventory")
    for path in sorted((REPO / "playbooks").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(path.read_text()), playbook)
    jsonschema.validate(yaml.safe_load((REPO / "hosts.yaml").read_text()), inventory)


def test_the_playbook_schema_rejects_an_unknown_step_and_an_unknown_key() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    playbook = schema("playbook")
    good = {"name": "x", "patch": "fix.diff", "steps": ["upload", {"diff_bounds": {"files": 1}}, {"commit": None}]}
    jsonschema.validate(good, playbook)
    for bad in ({**good, "steps": ["uplaod"]},
                {**good, "steps": [{"diff_bounds": {"file": 1}}]},
                {**good, "on_failure": "pray"},
                {"name": "x", "steps": ["upload"]}):  # neither files nor patch
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, playbook)


def complete(cwd: Path, words: str, env: dict[str, str] | None = None) -> list[str]:
    full = deployer_env(**{**(env or {}), "_DEPLOYER_COMPLETE": "bash_complete", "COMP_WORDS": words,
                           "COMP_CWORD": str(len(words.split(" ")) - 1)})
    result = deployer(cwd=cwd, env=full, timeout=60)
    assert result.returncode == 0, result.stderr
    return [line.split(",", 1)[1] for line in result.stdout.splitlines()]


def test_completion_offers_commands_host_names_and_run_ids(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  gpu-a: {repo: /r}\n  gpu-b: {repo: /r}\n  cpu: {repo: /r}\n")
    (tmp_path / "other.yaml").write_text("hosts:\n  elsewhere: {repo: /r}\n")
    for run_id in ("20260101T000000.000Z-aaaaaa", "20260102T000000.000Z-bbbbbb"):
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / "events.jsonl").write_text("")
    assert complete(tmp_path, "deployer r") == ["recover", "restart", "rollback", "rollout", "runs"]
    assert complete(tmp_path, "deployer plan --host gpu") == ["gpu-a", "gpu-b"]
    assert complete(tmp_path, "deployer check -i other.yaml --host ") == ["elsewhere"]
    assert complete(tmp_path, "deployer apply fix.yaml --host ", {"DEPLOYER_INVENTORY": "other.yaml"}) == [
        "elsewhere"]
    assert complete(tmp_path, "deployer runs show --runs-dir runs 202601") == [
        "20260101T000000.000Z-aaaaaa", "20260102T000000.000Z-bbbbbb"]
    assert complete(tmp_path, "deployer apply --al") == ["--allow-dirty", "--allow-downtime"]


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_apply_ends_with_a_plain_chart_of_the_samples_with_the_bound_marked(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=[{"co_restart": {}}, {"baseline": {"metric": GAUGE, "interval_s": 0.1}},
                            {"drain": {"metric": GAUGE, "to": 5, "interval_s": 0.1, "within_s": 10}}])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("  samples (one bar per poll, full bar = 3):")
    baseline, drain, marks = lines[start + 1].split(), lines[start + 2].split(), lines[start + 3].split()
    assert baseline == ["baseline", "███", f"{GAUGE}:", "3", "3", "3"]
    assert drain == ["drain", "███", f"{GAUGE}:", "3", "3", "3"]
    assert marks == ["✓✓✓", "✓", "=", "<=", "5"]
    assert "\x1b[" not in result.stdout  # not a terminal: no colours


def test_rollback_list_json_is_one_object_with_exit_code_and_the_deploys_under_a_key(target: Project) -> None:
    run_id = target.applied()
    listed = target.deployer("rollback", "--host", "box", "--list", "--json")
    assert listed.returncode == 0, listed.stderr
    body = json.loads(listed.stdout)
    assert (body["exit_code"], body["error"], body["host"]) == (0, None, "box")
    assert [d["run_id"] for d in body["deploys"]] == [run_id]


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_lock_release_json_has_exit_code_0_when_it_removed_a_lock_and_when_there_was_none(target: Project) -> None:
    lock = hold_lock(target)
    released = target.deployer("lock", "release", "--host", "box", "--force", "--json")
    assert released.returncode == 0, released.stdout + released.stderr
    report = json.loads(released.stdout)
    assert (report["exit_code"], report["error"]) == (0, None) and report["released"] and not lock.exists()
    again = target.deployer("lock", "release", "--host", "box", "--force", "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == {"host": "box", "released": None, "exit_code": 0,
                                                                   "error": None}
