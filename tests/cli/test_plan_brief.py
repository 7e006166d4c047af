"""`plan` is brief by default: a line per thing a step does (what runs where, what is sent, what is waited for),
every change to the target among them; `plan --verbose` (and `--json`) keeps every action exactly, as apply
does it and its run log records it. Both forms come from the same actions."""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from click.testing import CliRunner
from fixtures_repo import Project
from fixtures_services import Stack

from deployer.cli import main

SHELL_QUOTED_QUOTE = "'\"'\"'"  # how a shell line quotes a ' inside an inline program
CHAIN = ["local_compile", "upload", "remote_compile",
         {"diff_bounds": {"files": 1, "insertions": [1, 10], "deletions": [0, 2]}},
         {"commit": {"message": "pkg: answer is 42"}}, "co_restart"]
MOST_LINES_A_STEP = 9  # co_restart of two services: see each, stop each, nothing answers, start each, confirm, failure


def steps_shown(stdout: str) -> dict[str, list[str]]:
    """Each numbered step of a brief plan's text and its lines: one line each, never a command's line breaks."""
    shown: dict[str, list[str]] = {}
    body = stdout.split(" steps ", 1)[1].split("dry run: nothing was changed")[0].split("time to healthy")[0]
    current: list[str] | None = None
    for line in body.splitlines():
        if heading := re.fullmatch(r"\d+\. (\S+)(?: not run: .*)?", line):
            current = shown.setdefault(heading.group(1), [])
        elif current is not None and not line.startswith("──"):
            assert line.startswith("     "), f"not a line of its own: {line!r}"
            if not line.strip().startswith("warning:"):
                current.append(line[5:])
    return shown


def exact(action: dict[str, Any]) -> str:
    """An action's exact line, built from its --json fields: what it is, then its command line, path or request."""
    text = action["what"] if action["kind"] == "local" else f"{action['what']}: {action['line']}"
    text += " [repeated]" if action["repeats"] else ""
    return text if action["when"] is None else f"{text} [only if {action['when']}]"


def every_action_exactly(plan: dict[str, Any], stdout: str) -> None:
    """Each step of the plan's --json shows in stdout as its heading, then every action's exact line, in order."""
    for number, step in enumerate(plan["steps"], 1):
        block = f"\n{number}. {step['name']}\n" + "".join(f"     {exact(a)}\n" for a in step["actions"])
        assert block in stdout, block


def changes_the_target(action: dict[str, Any]) -> bool:
    return action["kind"] in ("run", "put", "signal") or (action["kind"] == "http" and
                                                           not action["line"].startswith("GET "))


def named_in(action: dict[str, Any], line: str) -> bool:
    """Does a brief line name this change: its program, the path it writes, the signal and what it goes to, or
    the request it sends?"""
    if action["kind"] == "run":
        return posixpath.basename(action["argv"][0]) in line
    if action["kind"] == "put":
        return action["line"].split(" ", 1)[1].split(".deployer-staged-")[0].rsplit("/", 1)[0] in line
    if action["kind"] == "signal":
        return action["line"].removeprefix("signal ") in line
    return action["line"].split(" {")[0] in line


def test_a_brief_plan_names_every_change_in_a_few_lines_a_step_without_shell_quoting(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=CHAIN)
    brief = project.deployer("plan", "fix.yaml", "--host", "box")
    assert brief.returncode == 0, brief.stdout + brief.stderr
    as_json = json.loads(project.deployer("plan", "fix.yaml", "--host", "box", "--json").stdout)
    assert SHELL_QUOTED_QUOTE not in brief.stdout and "import os, sys" not in brief.stdout
    assert SHELL_QUOTED_QUOTE in "".join(c for s in as_json["steps"] for c in s["commands"])  # --json: exact
    shown = steps_shown(brief.stdout)
    assert list(shown) == [s["name"] for s in as_json["steps"]]
    for step in as_json["steps"]:
        lines, actions = shown[step["name"]], step["actions"]
        assert 0 < len(lines) <= MOST_LINES_A_STEP, (step["name"], lines)
        assert lines == [b["line"] for b in step["brief"]], step["name"]
        # The brief lines stand for every action, each once, in order.
        assert [i for b in step["brief"] for i in b["actions"]] == list(range(len(actions))), step["name"]
        for b in step["brief"]:
            for i in b["actions"]:
                if changes_the_target(actions[i]):
                    assert named_in(actions[i], b["line"]), (actions[i]["line"], b["line"])
    restart = shown["co_restart"]
    assert len(restart) < len(as_json["steps"][-1]["actions"]) / 3, restart
    for said in ("stop decode: TERM <tree of decode>", "stop prefill: TERM <tree of prefill>",
                 "start prefill: mkdir -p", "wait up to 20s for prefill to answer 200", "start decode:"):
        assert any(said in line for line in restart), (said, restart)
    started = next(line for line in restart if line.startswith("start prefill:"))
    python = posixpath.basename(stack.service("prefill")["start"][0])
    assert f"sh -c <launch> … {python} -m http.server" in started  # what runs: the service's own command
    [sent] = shown["upload"]
    assert re.search(rf"send \d+ bytes -> {re.escape(str(project.repo / 'pkg' / 'a.py'))}$", sent), sent
    assert shown["remote_compile"][0].endswith("-c <program> …")
    assert "--verbose shows every action exactly" in brief.stdout


def test_plan_verbose_shows_every_action_exactly_and_each_command_apply_then_runs(stack: Stack) -> None:
    project = stack.project
    project.playbook(steps=CHAIN)
    verbose = project.deployer("plan", "fix.yaml", "--host", "box", "--verbose")
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    as_json = json.loads(project.deployer("plan", "fix.yaml", "--host", "box", "--json").stdout)
    every_action_exactly(as_json, verbose.stdout)
    assert project.deployer("apply", "--dry-run", "-v", "fix.yaml", "--host", "box").stdout == verbose.stdout
    assert "--verbose shows" not in verbose.stdout
    applied = project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    commands = [e for e in project.events() if e["type"] == "command" and "action" in e]
    assert {e["step"] for e in commands} >= {"remote_compile", "diff_bounds", "commit", "co_restart"}
    for event in commands:  # bound placeholders aside, each command the run did is a line of the exact plan
        if not event.get("bound"):
            assert event["command"] in verbose.stdout, event["command"]


def test_apply_dry_run_and_plan_rollback_are_brief_unless_verbose(target: Project) -> None:
    target.playbook()
    planned = target.deployer("plan", "fix.yaml", "--host", "box")
    assert target.deployer("apply", "--dry-run", "fix.yaml", "--host", "box").stdout == planned.stdout
    assert "git diff …" in planned.stdout and "--numstat" not in planned.stdout
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    brief = target.deployer("plan", "--rollback", "last", "--host", "box")
    verbose = target.deployer("plan", "--rollback", "last", "--host", "box", "-v")
    assert brief.returncode == 0 and verbose.returncode == 0, brief.stderr + verbose.stderr
    shown = steps_shown(brief.stdout)["rollback"]
    assert "commit exactly those files: git commit …" in shown and SHELL_QUOTED_QUOTE not in brief.stdout
    as_json = json.loads(target.deployer("plan", "--rollback", "last", "--host", "box", "--json").stdout)
    every_action_exactly(as_json, verbose.stdout)
    assert "--literal-pathspecs checkout " in verbose.stdout and "\nDeployer-Rollback-Of: " in verbose.stdout


def test_plan_and_apply_say_what_verbose_does() -> None:
    for command in ("plan", "apply"):
        said = " ".join(CliRunner().invoke(main, [command, "--help"]).output.split())
        assert "-v, --verbose With a dry run: every action exactly" in said, said
    assert "--verbose shows every action exactly" in " ".join(CliRunner().invoke(main, ["plan", "--help"])
                                                              .output.split())
