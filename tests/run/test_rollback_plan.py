"""`plan --rollback` shows the commands the rollback then runs: the revert's git commands in their order, then
the actions of the playbook's restart and checks, each as the rollback's run log records it."""

from __future__ import annotations

import json
from typing import Any

from fixtures_repo import tree_snapshot
from fixtures_services import GAUGE, Stack

from deployer.steps.action import Action

STEPS = [{"baseline": {"metric": GAUGE, "interval_s": 0.1, "within_s": 10}},
         "local_compile", "upload", "remote_compile", {"diff_bounds": {"files": 1}},
         {"commit": {"message": "pkg: answer is 42"}}, "co_restart",
         {"drain": {"metric": GAUGE, "to": 5, "interval_s": 0.2, "within_s": 10}}]


def bound_line(action: dict[str, Any], bound: dict[str, str]) -> str:
    """A planned command's line with the values only the run knew (its id, its log's sha256) filled in."""
    planned = Action.run(action["key"], action["what"], tuple(action["argv"]), action["cwd"],
                         env=tuple(action["env"].items()))
    return planned.bind(bound).line()


def test_plan_rollback_lists_the_commands_the_rollback_then_runs(stack: Stack) -> None:
    project = stack.project
    stack.start_services()  # the baseline reads them before the fix
    project.playbook(steps=STEPS)
    assert project.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    applied = sorted(project.runs.iterdir())[-1].name

    project.sealed()  # the apply's last write, which lands after it exited
    snapshot = tree_snapshot(project.repo)
    preview = project.deployer("plan", "--rollback", applied, "--json")
    assert preview.returncode == 0, preview.stderr
    assert tree_snapshot(project.repo) == snapshot
    planned = {step["name"]: step["actions"] for step in json.loads(preview.stdout)["steps"]}
    assert list(planned) == ["rollback", "rollback:co_restart", "rollback:drain"]
    assert all(a["kind"] == "run" and a["argv"][0] == "git" for a in planned["rollback"])
    assert [a["key"] for a in planned["rollback"]][-3:] == ["commit", "head", "files"]

    assert project.deployer("rollback", applied).returncode == 0
    log = project.events()
    # The revert: exactly the planned git commands, in order, each as planned once its placeholders are bound.
    reverted = [e for e in log if e["type"] == "command" and e.get("step") == "rollback" and e.get("action")]
    assert [e["action"] for e in reverted] == [a["key"] for a in planned["rollback"]]
    for action, event in zip(planned["rollback"], reverted, strict=True):
        assert event["command"] == bound_line(action, event.get("bound", {}))
    # Its only unplanned commands are reads: the restored files' owner and mode (to keep them), and the repo's
    # commit identity, which the planned commit's argv already shows the answer of (as the commit step's does).
    unplanned = [e["command"] for e in log if e["type"] == "command" and e.get("step") == "rollback"
                 and not e.get("action")]
    assert unplanned and all(command.split(" && ", 1)[1].startswith("stat --printf ") or
                             command.endswith(" config user.email") for command in unplanned), unplanned

    # The restart and the checks again: every action recorded is a planned one (a command exactly as planned),
    # and every action planned unconditionally was done.
    for step in ("rollback:co_restart", "rollback:drain"):
        by_key = {a["key"]: a for a in planned[step]}
        done = [e for e in log if e.get("step") == step and e.get("action")]
        assert done, step
        for event in done:
            action = by_key[event["action"]]
            if event["type"] == "command":
                assert event["command"] == bound_line(action, event.get("bound", {}))
        assert {key for key, a in by_key.items() if a["when"] is None} <= {e["action"] for e in done}
