"""`deployer demo --fleet`'s playbook: the demo fix (playbooks/kvpoll-fix.yaml) judged on its latency too, as issue
37 asks of a rollout. Each unit's prefill server is read in windows while the unit still serves the old build
(`analysis_baseline`, before the baseline's storm: the storm's aborted requests would be no traffic of a user's),
and again once it is back in the router on the new build (`analysis`), both under the demo's steady load; the
time to first token's p99 may be at most 10% worse and no request may be aborted.

With `regression`, the fix also ships the build's own slowdown (the stack's demo_build.py, SLOWDOWN raised): every
simulated wait before a first token is six times as long, the analysis fails it, and on_failure rolls the unit back.
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
# The regression's: every simulated wait six times as long. The build slows only that wait (a median of 0.2 s), not
# the rest of a prefill's time to first token (the decode's bootstrap, the ~0.4 s KV transfer, the 0.3 s inflight
# poll), and the before and after windows lie half a minute apart, so CPU starvation on a loaded machine stretches
# one side and not the other: on 2 cores at load 20-25 the unchanged build's p99 read from 1.4 s to 2.8 s from one
# read to the next, where the 3x build's read 1.9 s to 2.8 s (the pooled p99 of 50 requests is their slowest few),
# so a 3x build could pass. Six times puts the new build's p99 near 4 s and its p10 above the old build's median.
SLOWDOWN = 5.0
# Few windows, each side 15 s: enough observations a side (20: the rank test's least) under the demo's clients, the
# regression's slower side too, on 2 busy cores (6 windows under 6 clients once counted 17 there; 4 under 10
# counted 27: its first window is all but empty, the new build's first requests still on their way).
WINDOWS: dict[str, Any] = {"interval_s": 3.0, "windows": 5}
# The baseline's gauge after its storm, read until 3 polls agree (at most within_s): under the demo's steady load it
# counts the clients' requests in flight too and rarely agrees, so it read most of its 20 s each unit; 4 s reads the
# stuck rooms as well (the storm's requests end within its 0.2 s timeout).
BASELINE_WITHIN_S = 4.0
# A confidence of 0.999, not the default 0.98: half a minute apart on a shared machine, the unchanged build's whole
# distribution moves with the load (rank-biserial effects of -0.20 to +0.17, p from 0.04 to 0.08, in 8 units read
# beside a CPU hog; once p=0.0096 in a full CI run, +71.6% at p99: a fail at 0.98). The regression reads an effect
# of +0.8 and p <= 1e-11: far past 0.999 still.
CONFIDENCE = 0.999
# And an effect of at least 0.5 (a new build's time above an old one's three times in four): the drift is a small
# effect the test can still find significant (a CI run found the unchanged build worse at p=0.0005, +29.8% at p99,
# a fail at 0.999: at the 70-80 observations a side the demo counts, an effect near +0.3), the regression a large
# one (+0.8).
MIN_EFFECT = 0.5
CHECKS: list[dict[str, Any]] = [
    {"kind": "histogram", "name": "p99 TTFT", "metric": "sglang:time_to_first_token_seconds", "min_samples": 20,
     "confidence": CONFIDENCE, "min_effect": MIN_EFFECT},
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
    for step in steps:
        if isinstance(step, dict) and "baseline" in step:
            step["baseline"]["within_s"] = BASELINE_WITHIN_S
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
