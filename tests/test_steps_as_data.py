"""Steps as data: what `plan --json` shows is what `apply` sends, command for command.

Each step kind produces its commands from one place that both the dry run and the run use. For the
steps whose commands do not depend on what the run finds on the way (remote_compile, diff_bounds,
commit), the plan's command lines and the run log's `command` events of that step are the same list,
in the same order, up to the commit message (it names the run id and the log's sha256).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from fixtures_repo import Project

pytest_plugins = ["fixtures_repo", "fixtures_ssh"]

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
    # The upload is data too: one atomic write per file in the plan, one `uploaded` event per file in the run.
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    uploads = [e["dest"] for e in events if e["type"] == "uploaded"]
    writes = [a for s in steps if s["name"] == "upload" for a in s["actions"]]
    assert sorted(uploads) == ["pkg/a.py", "pkg/b.py"] and len(writes) == len(uploads)
