"""A bad playbook or inventory is refused with every problem at once, in line order, each where it is written."""

from __future__ import annotations

import pytest
from fixtures_repo import Project

# What pydantic says, and what a YAML file's author should never have to read.
PYDANTIC_WORDS = ("Input should", "Field required", "Extra inputs", "valid tuple", "valid dictionary",
                  "instance of", "after validation", "[type=", "pydantic")


# Refused before any connection: one kind of target is enough.
local_only = pytest.mark.parametrize("target", ["local"], indirect=True)


def problems(stderr: str) -> list[str]:
    return [line.removeprefix("error: ") for line in stderr.splitlines()]


PLAYBOOK = """\
name: answer fix
fles:
  - src: fix/a.py
    dest: pkg/a.py
steps:
  - upload
  - diff_bounds: {files: 1, insertions: many}
  - commit: {message: m}
  - co_restart:
    services: [web]
  - drain:
      metric: m
      to: 0
      withn_s: 30
on_falure: rollback
"""


@pytest.mark.parametrize("command", ["plan", "check"])
@local_only
def test_a_playbook_with_several_mistakes_is_refused_with_every_one_in_line_order_each_at_its_key(
        target: Project, command: str) -> None:
    target.write("fix.yaml", PLAYBOOK)
    result = target.deployer(command, "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    assert problems(result.stderr) == [
        "fix.yaml:2:1: fles: unknown key (did you mean 'files'?)",
        "fix.yaml:7:41: steps.1.diff_bounds.insertions: must be a whole number or a list, got 'many'",
        "fix.yaml:10:5: steps.3.services: not a step's key ('co_restart' just above it has no value: to put "
        "'services' under 'co_restart', indent it deeper than 'co_restart')",
        "fix.yaml:14:7: steps.4.drain.withn_s: unknown key (did you mean 'within_s'?)",
        "fix.yaml:15:1: on_falure: unknown key (did you mean 'on_failure'?)",
    ]
    assert not target.runs.exists()


INVENTORY = """\
hosts:
  box:
    transport: local
    repo: /tmp/r
    pyhton: python3
    lock_ttl_s: soon
    services:
    web:
      start: ./serve
  other:
    adress: x
"""


@local_only
def test_an_inventory_with_several_mistakes_is_refused_with_every_one_in_line_order_each_at_its_key(
        target: Project) -> None:
    target.write("bad-hosts.yaml", INVENTORY)
    result = target.deployer("check", "--host", "box", "-i", "bad-hosts.yaml")
    assert result.returncode == 2, result.stderr
    assert problems(result.stderr) == [
        "bad-hosts.yaml:5:5: hosts.box.pyhton: unknown key (did you mean 'python'?)",
        "bad-hosts.yaml:6:17: hosts.box.lock_ttl_s: must be a number, got 'soon'",
        "bad-hosts.yaml:7:14: hosts.box.services: must be a mapping (key: value), got nothing (the lines meant to "
        "be under this key must be indented deeper than it)",
        "bad-hosts.yaml:8:5: hosts.box.web: unknown key ('services' just above it has no value: to put 'web' "
        "under 'services', indent it deeper than 'services')",
        "bad-hosts.yaml:10:3: hosts.other.repo: required key is missing",
        "bad-hosts.yaml:11:5: hosts.other.adress: unknown key (did you mean 'address'?)",
    ]


@local_only
def test_a_step_parameter_as_deep_as_its_step_kind_is_told_to_be_indented(target: Project) -> None:
    target.write("fix.yaml", "name: x\nfiles: [{src: fix/a.py, dest: pkg/a.py}]\nsteps:\n  - upload\n"
                             "  - drain:\n      metric: m\n    to: 0\n")
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert problems(result.stderr) == [
        "fix.yaml:7:5: steps.1.to: not a step's key (a parameter of drain: indent it as deep as drain's other "
        "parameters)"]


@local_only
def test_a_line_that_fits_no_block_is_an_invalid_yaml_with_an_indentation_hint(target: Project) -> None:
    target.write("fix.yaml", "name: x\nrollout:\n    strategy: rolling\n  pause_s: 1\nsteps: [upload]\n")
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2
    assert problems(result.stderr) == [
        "fix.yaml:4:3: invalid YAML: expected <block end>, but found '<block mapping start>' (check this line's "
        "indentation: a key lines up with the other keys of its mapping)"]


@local_only
def test_bad_values_are_said_in_plain_words_at_the_value_never_in_pydantic_s(target: Project) -> None:
    target.write("fix.yaml", """\
name: ''
files: {src: fix/a.py}
steps:
  - diff_bounds: {files: [1, 2, 3], deletions: x}
  - commit: {}
  - storm: {requests: 0, concurrency: 1.5}
rollout: {batches: [], strategy: fast, max_failures: -1, pause_s: [1]}
""")
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2
    assert not [word for word in PYDANTIC_WORDS if word in result.stderr], result.stderr
    assert problems(result.stderr) == [
        "fix.yaml:1:7: name: must not be empty, got ''",
        "fix.yaml:2:8: files: must be a list",
        "fix.yaml:4:26: steps.0.diff_bounds.files: must have at most 2 items, not 3",
        "fix.yaml:4:48: steps.0.diff_bounds.deletions: must be a whole number or a list, got 'x'",
        "fix.yaml:5:5: steps.1.commit.message: required key is missing",
        "fix.yaml:6:23: steps.2.storm.requests: must be 1 or more, got 0",
        "fix.yaml:6:39: steps.2.storm.concurrency: must be a whole number, got 1.5",
        "fix.yaml:7:20: rollout.batches: must not be empty",
        "fix.yaml:7:34: rollout.strategy: must be 'batches' or 'rolling', got 'fast'",
        "fix.yaml:7:54: rollout.max_failures: must be 0 or more, got -1",
        "fix.yaml:7:67: rollout.pause_s: must be a number",
    ]


@local_only
def test_a_value_that_fits_no_member_of_a_union_is_one_problem_said_by_the_member_it_came_closest_to(
        target: Project) -> None:
    target.write("bad-hosts.yaml", "hosts:\n  box:\n    repo: /r\n    transport: k8s\n  gpu:\n    repo: /r\n"
                                   "    env: {A: 3, B: {secret: true}}\n")
    result = target.deployer("check", "--host", "box", "-i", "bad-hosts.yaml")
    assert result.returncode == 2
    assert problems(result.stderr) == [
        "bad-hosts.yaml:4:16: hosts.box.transport: must be 'ssh', 'local' or 'kubernetes'",
        "bad-hosts.yaml:7:14: hosts.gpu.env.A: must be a string or a mapping (key: value)",
        "bad-hosts.yaml:7:20: hosts.gpu.env.B: give exactly one of 'value' or 'value_from_env'",
    ]


@local_only
def test_a_bad_environment_value_is_named_never_shown_for_it_may_be_a_secret(target: Project) -> None:
    target.write("bad-hosts.yaml", "hosts:\n  box:\n    repo: /r\n    env: {TOKEN: {secret: true, value: 90210}}\n"
                                   "    services:\n      web: {start: x, env: {PIN: [4711]}}\n")
    result = target.deployer("check", "--host", "box", "-i", "bad-hosts.yaml")
    assert result.returncode == 2
    assert problems(result.stderr) == [
        "bad-hosts.yaml:4:40: hosts.box.env.TOKEN.value: must be a string",
        "bad-hosts.yaml:6:34: hosts.box.services.web.env.PIN: must be a string or a mapping (key: value)",
    ]
    assert "90210" not in result.stderr and "4711" not in result.stderr
