"""A playbook's `rollout:` refused as its author can fix it: each problem at the step or key it is about, in its
own words (how a pause is written, the close name meant, the durations taken), with no union's noise beside it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_repo import Project
from test_every_config_error import PYDANTIC_WORDS, local_only, problems

from deployer.steps.playbook import parse_playbook

HEAD = "name: fix\nfiles: [{src: fix/a.py, dest: pkg/a.py}]\nsteps: [upload, {commit: {message: m}}]\n"


@pytest.mark.parametrize(("steps", "problem"), [
    ("[batch, pause, batch]",
     "fix.yaml:5:18: rollout.steps.1: a pause is a mapping: write `pause: {}` (until resumed) or "
     "`pause: {duration: 10m}`"),
    ("[btach, {pause: {}}, batch]",
     "fix.yaml:5:11: rollout.steps.0: unknown step 'btach' (did you mean 'batch'?): a step is `batch` or "
     "`pause: {}` (until resumed) or `pause: {duration: 10m}`"),
    ("[batch, {paus: {}}, batch]",
     "fix.yaml:5:18: rollout.steps.1: 'paus' (did you mean 'pause'?): a step is `batch` or `pause: {}` (until "
     "resumed) or `pause: {duration: 10m}`"),
    ("[batch, {pause: {duration: 10 minutes}}, batch]",
     "fix.yaml:5:37: rollout.steps.1.pause.duration: '10 minutes': a duration is a number of seconds, or a number "
     "and s, m or h: 30s, 10m, 1h"),
    ("[batch, {pause: {durtion: 3}}, batch]",
     "fix.yaml:5:27: rollout.steps.1.pause.durtion: unknown key (did you mean 'duration'?)"),
    ("[batch, {pause: {duration: 0}}, batch]",
     "fix.yaml:5:37: rollout.steps.1.pause.duration: must be greater than 0, got 0"),
    ("[batch, {pause: {}}, {pause: {}}, batch]",
     "fix.yaml:5:31: rollout.steps.2: a pause goes after a batch, one between two batches: put a `batch` before "
     "this pause"),
    ("[{pause: {}}, batch]",
     "fix.yaml:5:11: rollout.steps.0: a pause goes after a batch (nothing has changed yet): start with `batch`"),
])
@local_only
def test_a_bad_rollout_step_is_refused_at_the_step_with_one_problem_in_its_own_words(
        target: Project, steps: str, problem: str) -> None:
    target.write("fix.yaml", HEAD + f"rollout:\n  steps: {steps}\n")
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    assert problems(result.stderr) == [problem]
    assert not any(word in result.stderr for word in PYDANTIC_WORDS)


@local_only
def test_a_rollout_key_written_at_the_top_level_is_said_to_belong_under_rollout(target: Project) -> None:
    target.write("fix.yaml", HEAD + "on_inconclusive: pause\n")
    result = target.deployer("plan", "fix.yaml", "--host", "box")
    assert result.returncode == 2, result.stderr
    assert problems(result.stderr) == [
        "fix.yaml:4:1: on_inconclusive: unknown key ('on_inconclusive' belongs under 'rollout': indent it there)"]


def test_durations_in_seconds_minutes_and_hours_are_taken(tmp_path: Path) -> None:
    path = tmp_path / "fix.yaml"
    path.write_text(HEAD + "rollout:\n  steps: [batch, {pause: {duration: 90}}, batch, {pause: {duration: 10m}}, "
                           "batch, {pause: {duration: 1.5h}}, batch]\n")
    model, _, _ = parse_playbook(path)
    assert {n: pause.duration for n, pause in model.rollout.pauses().items()} == {1: 90, 2: 600, 3: 5400}
