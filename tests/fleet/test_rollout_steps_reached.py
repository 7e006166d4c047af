"""A rollout's steps are its progression (Argo Rollouts' canary steps): a pause the batches never reach, or a step
past the last batch, is refused when the run's hosts make its batches (plan and apply), before anything starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, init_repo

HOSTS = ("h1", "h2", "h3")


@pytest.fixture
def local_fleet(tmp_path: Path) -> Project:
    """Three `transport: local` hosts, group `all`: a new user's first fleet."""
    hosts: dict[str, Any] = {}
    for name in HOSTS:
        repo = tmp_path / name / "repo"
        init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
        hosts[name] = {"transport": "local", "repo": str(repo), "python": sys.executable}
    project = Project(root=tmp_path, repo=tmp_path / "h1" / "repo", host=hosts["h1"], host_name="h1")
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"all": list(HOSTS)}}, sort_keys=False))
    project.write("fix/a.py", FIXED_A)
    return project


def write(project: Project, rollout: str) -> None:
    project.write("fix.yaml", "name: fix\nfiles: [{src: fix/a.py, dest: pkg/a.py}]\n"
                              "steps: [upload, {commit: {message: m}}]\n" + rollout)


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_a_pause_after_the_only_batch_is_refused_at_the_pause_with_how_to_make_a_canary(
        local_fleet: Project, command: str) -> None:
    write(local_fleet, "rollout:\n  steps: [batch, {pause: {}}]\n")
    result = local_fleet.deployer(command, "fix.yaml", "--host", "all", "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    assert json.loads(result.stdout)["error"] == (
        "fix.yaml:5:18: rollout.steps.1: this pause comes after the last batch, so it is never reached: the 3 hosts "
        "of this run make 1 batch (batches: ['100%']); to pause after a canary, split the hosts: e.g. "
        "batches: [1, '100%'] (one host, then the rest)")
    for host in HOSTS:  # nothing deployed
        assert (local_fleet.root / host / "repo/pkg/a.py").read_text() == ORIGINAL_A


def test_steps_past_the_last_batch_are_refused_at_the_first_one_past_it(local_fleet: Project) -> None:
    write(local_fleet, "rollout:\n  batches: [1]\n  steps: [batch, {pause: {}}, batch, batch, batch, {pause: {}}]\n")
    result = local_fleet.deployer("plan", "fix.yaml", "--host", "all")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        "error: fix.yaml:6:45: rollout.steps.4: this step would start batch 4: the 3 hosts of this run make 3 "
        "batches (batches: [1]); drop the steps past batch 3, or give smaller batches")


def test_a_pause_after_the_last_of_several_batches_is_refused_and_one_before_it_is_planned(
        local_fleet: Project) -> None:
    write(local_fleet, "rollout:\n  batches: [1, '100%']\n  steps: [batch, {pause: {}}, batch, {pause: {}}]\n")
    refused = local_fleet.deployer("plan", "fix.yaml", "--host", "all")
    assert refused.returncode == 2 and "fix.yaml:6:38: rollout.steps.3: this pause comes after the last batch" \
        in refused.stderr, refused.stderr
    write(local_fleet, "rollout:\n  batches: [1, '100%']\n  steps: [batch, {pause: {}}]\n")
    planned = local_fleet.deployer("plan", "fix.yaml", "--host", "all", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["rollout"]["pauses"] == [{"before_batch": 1, "duration_s": None}]


def test_rolling_steps_past_its_batches_name_max_unavailable(local_fleet: Project) -> None:
    write(local_fleet, "rollout:\n  strategy: rolling\n  max_unavailable: 3\n  steps: [batch, {pause: {}}]\n")
    result = local_fleet.deployer("plan", "fix.yaml", "--host", "all")
    assert result.returncode == 2
    assert ("make 1 batch (max_unavailable: 3); take fewer units at a time (a smaller max_unavailable)"
            in result.stderr), result.stderr
