"""`deployer demo --fleet`'s playbook: the demo fix (playbooks/kvpoll-fix.yaml) judged on its latency too, as issue
37 asks of a rollout. Each unit's prefill server is read in windows while the unit still serves the old build
(`analysis_baseline`, before the baseline's storm: the storm's aborted requests would be no traffic of a user's),
and again once it is back in the router on the new build (`analysis`), both under the demo's steady load; the
time to first token's p99 may be at most 10% worse and no request may be aborted.

With `regression`, the fix also ships the build's own slowdown (the stack's demo_build.py, SLOWDOWN raised): every
wait before a first token is three times as long, the analysis fails it, and on_failure rolls the unit back.
Written into the demo's workdir with a copy of the fix's files, so the package's playbook stays the single-host
demo's, unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from deployer.errors import DeployerError

BUILD = "python/sglang/srt/demo_build.py"  # the stack's file that says how much slower the build is
SLOWDOWN = 2.0  # the regression's: every wait three times as long
# Short windows, as many as the demo's load fills with enough observations a side (20: the rank test's least), the
# regression's slower side too: 5 windows left it 17 once on a busy CI machine (inconclusive, not the fail it shows).
WINDOWS: dict[str, Any] = {"interval_s": 3.0, "windows": 6}
CHECKS: list[dict[str, Any]] = [
    {"kind": "histogram", "name": "p99 TTFT", "metric": "sglang:time_to_first_token_seconds", "min_samples": 20},
    {"kind": "critical", "name": "aborted requests", "metric": "sglang:num_aborted_requests_total"}]


def judged_playbook(directory: Path, playbook: Path, stack: Path, *, regression: bool) -> Path:
    """The fleet demo's playbook made from the demo's `playbook`, written in directory beside a copy of the fix's
    files (and the regression's build file, made from `stack`'s); its path."""
    raw = yaml.safe_load(playbook.read_text())
    for entry in raw["files"]:  # the fix's files (kvpoll-fix/...), relative to the playbook as its src says
        target = directory / entry["src"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(playbook.parent / entry["src"], target)
    steps: list[Any] = raw["steps"]
    steps.insert(1, {"analysis_baseline": WINDOWS})  # after local_compile, before the baseline's storm
    steps.append({"analysis": {**WINDOWS, "checks": CHECKS}})
    name = "judged"
    if regression:
        name = "judged-regression"
        original = (stack / BUILD).read_text()
        slowed = original.replace("SLOWDOWN = 0.0", f"SLOWDOWN = {SLOWDOWN}")
        if slowed == original:
            raise DeployerError(f"{stack / BUILD} no longer says SLOWDOWN = 0.0: the regression has nothing to raise")
        (directory / "demo_build.py").write_text(slowed)
        raw["files"].append({"src": "demo_build.py", "dest": BUILD})
        for step in steps:
            if isinstance(step, dict) and "diff_bounds" in step:
                step["diff_bounds"]["files"] += 1
    path = directory / f"kvpoll-fix-{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
