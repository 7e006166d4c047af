"""Steps as data: what `plan --json` shows is what `apply` does, action for action.

Each step kind produces its actions (commands, reads, writes, HTTP requests) from one place that both
the dry run and the run use. A value only the run knows (a PID, the run id) is a placeholder in the
plan; the run log records each action it did under the planned action's key, with the values it bound.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from fixtures_repo import FIXED_A, Project
from ports import demo_ports

from deployer.command import shell_line
from deployer.demo.run import PLAYBOOK, DemoStack, start_stacks
from deployer.steps.cancel import CancelToken

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]
# The run-log events that record an action done, and the kind of action each records.
RECORDS = {"command": "run", "get": "get", "uploaded": "put", "http": "http", "storm": "http", "procs": "procs",
           "signal": "signal", "local": "local"}

EXACT = ("remote_compile", "diff_bounds", "commit")


def without_message(line: str) -> str:
    words = shlex.split(line)
    return shlex.join(["<message>" if i and words[i - 1] == "-m" else w for i, w in enumerate(words)])


def logged_commands(run_dir: Any) -> dict[str, list[str]]:
    by_step: dict[str, list[str]] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "command" and event["step"] in EXACT:
            by_step.setdefault(event["step"], []).append(without_message(event["command"]))
    return by_step


def test_plan_shows_exactly_the_commands_apply_runs(target: Project) -> None:
    target.write("fix/b.py", "def b():\n    return 'b'\n")
    target.playbook(files=[{"src": "fix/a.py", "dest": "pkg/a.py"}, {"src": "fix/b.py", "dest": "pkg/b.py"}],
                    steps=["local_compile", "upload", "remote_compile",
                           {"diff_bounds": {"files": 2, "insertions": [1, 20], "deletions": [0, 5]}},
                           {"commit": {"message": "pkg: two files"}}])
    planned = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert planned.returncode == 0, planned.stderr
    steps = json.loads(planned.stdout)["steps"]
    plan = {step["name"]: [without_message(c) for c in step["commands"]] for step in steps}
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stderr
    [run_dir] = [p for p in target.runs.iterdir() if (p / "events.jsonl").is_file()]
    logged = logged_commands(run_dir)
    for step in EXACT:
        assert plan[step], f"the plan shows no command for {step}"
        assert logged[step] == plan[step], step
    # The upload is data too: one staged write per file in the plan (remote_compile installs them), one
    # `uploaded` event per file in the run.
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    uploads = [e["path"] for e in events if e["type"] == "uploaded"]
    writes = [a["line"] for s in steps if s["name"] == "upload" for a in s["actions"]]
    assert [(Path(p).parent, Path(p).name.split(".deployer-staged-")[0]) for p in uploads] == \
        [(target.repo / "pkg", ".a.py"), (target.repo / "pkg", ".b.py")]
    assert writes == [f"put {path}" for path in uploads]


def bind(text: str | None, values: dict[str, str]) -> str | None:
    for placeholder, value in values.items():
        text = None if text is None else text.replace(placeholder, value)
    return text


def realized(action: dict[str, Any], values: dict[str, str]) -> str:
    """The planned action's line with its placeholders bound, quoted as the run quotes it."""
    if action["kind"] == "run":
        return shell_line([str(bind(a, values)) for a in action["argv"]], cwd=bind(action["cwd"], values),
                          env={k: str(bind(v, values)) for k, v in action["env"].items()})
    return str(bind(action["line"], values))


def logged_line(event: dict[str, Any]) -> str:
    kind = RECORDS[event["type"]]
    if kind == "run":
        return str(event["command"])
    if kind == "http":
        return f"{event['method']} {event['url']}" + (f" {event['body']}" if "body" in event else "")
    if kind in ("procs", "signal"):
        return str(event["line"])
    return str(event["what"]) if kind == "local" else f"{kind} {event['path']}"


def demo_on(target: Project) -> DemoStack:
    """The demo's stack (its repo, its running services) as the target's host, over the target's transport."""
    stack = DemoStack(target.root / "demo", demo_ports()[0])
    stack.create()
    shape = stack.host().model_dump(mode="json", exclude_defaults=True)
    connection = {k: v for k, v in target.host.items() if k not in ("repo", "python")}
    target.write_inventory(**{**shape, **connection})
    start_stacks([stack], CancelToken())
    return stack


def upload_actions(target: Project) -> list[dict[str, str]]:
    planned = target.deployer("plan", "fix.yaml", "--host", "box", "--json")
    assert planned.returncode == 0, planned.stderr
    [upload] = [step for step in json.loads(planned.stdout)["steps"] if step["name"] == "upload"]
    return [{k: a[k] for k in ("key", "kind", "what")} for a in upload["actions"]]


def test_the_upload_plan_names_and_says_each_write_or_each_git_apply_it_will_do(target: Project) -> None:
    target.playbook(steps=["upload"])
    fixed = FIXED_A.encode()
    assert upload_actions(target) == [
        {"key": "write:pkg/a.py", "kind": "put", "what": f"write pkg/a.py ({len(fixed)} bytes, sha256 "
                                                         f"{hashlib.sha256(fixed).hexdigest()[:12]}) via temp file "
                                                         "+ sha256 check + rename"}]
    target.write("fix/b.diff", "--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n")
    target.playbook(patch="fix/b.diff", steps=["upload"])
    assert upload_actions(target) == [
        {"key": "apply_check", "kind": "run", "what": "check the patch applies (patch on stdin)"},
        {"key": "apply", "kind": "run",
         "what": "apply the patch (patch on stdin), then give the files back their owner and mode"},
        {"key": "verify:pkg/b.py", "kind": "get", "what": "read pkg/b.py back"}]
    applied = target.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stderr
    events = [json.loads(line) for line in (target.runs / target.newest_run() / "events.jsonl").read_text()
              .splitlines()]
    assert [e["action"] for e in events if e.get("step") == "upload" and "action" in e] == \
        ["apply_check", "apply", "verify:pkg/b.py"]


def test_every_action_the_demo_plan_lists_is_done_and_everything_done_was_planned(target: Project) -> None:
    stack = demo_on(target)
    try:
        planned = target.deployer("plan", str(PLAYBOOK), "--host", "box", "--json")
        assert planned.returncode == 0, planned.stderr
        plan = {step["name"]: step["actions"] for step in json.loads(planned.stdout)["steps"]}
        applied = target.deployer("apply", str(PLAYBOOK), "--host", "box", timeout=240)
        assert applied.returncode == 0, applied.stderr
    finally:
        stack.stop()
    [run_dir] = [p for p in target.runs.iterdir() if (p / "events.jsonl").is_file()]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert list(plan) == ["local_compile", "baseline", "upload", "remote_compile", "diff_bounds", "commit",
                          "co_restart", "storm", "drain"]
    done_kinds = set()
    for step, actions in plan.items():
        order = {a["key"]: i for i, a in enumerate(actions)}
        assert len(order) == len(actions), f"{step}: two planned actions share a key"
        records = [e for e in events if e.get("step") == step and e["type"] in RECORDS]
        done = []
        for event in records:
            assert "action" in event, f"{step} did something it never planned: {event}"
            action = actions[order[event["action"]]]
            values = event.get("bound", {})
            assert RECORDS[event["type"]] == action["kind"] and set(values) == set(action["placeholders"]), event
            assert logged_line(event) == realized(action, values), event
            assert "count" not in event or action["repeats"], f"{step}: {action['key']} ran again, unplanned"
            done.append(order[event["action"]])
            done_kinds.add(action["kind"])
        # One record per planned action (a poll's rounds are one, with their count), in the planned order.
        assert done == sorted(set(done)), f"{step}: out of order or twice: {[actions[i]['key'] for i in done]}"
        always = [a["key"] for a in actions if a["when"] is None]
        assert {actions[i]["key"] for i in done} >= set(always), f"{step}: planned, never done"
    assert done_kinds == set(RECORDS.values())
