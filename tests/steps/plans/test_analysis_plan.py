"""The plans of the analysis steps: analysis_baseline (this host's metrics read in windows before the restart) and
analysis (this host's metrics read in windows after it, beside a sibling's at the same instants when the baseline
is one, then every check's metric, statistic, allowed change, minimum samples and confidence said)."""

from __future__ import annotations

from pathlib import Path

import pytest
from planning import context, does, host, step

from deployer.diffs import DiffStat
from deployer.errors import ConfigError, StepFailed
from deployer.steps.action import Action
from deployer.steps.playbook import load_playbook

METRICS = "http://127.0.0.1:30000/metrics"
SIBLING = "http://10.0.0.3:30000/metrics"
SERVING = host(metrics=METRICS)
SGLANG_JUDGED = (
    "p99 TTFT: p99 of sglang:time_to_first_token_seconds at most +10%, 50 observations a side, confidence 0.98; "
    "p99 inter-token latency: p99 of sglang:inter_token_latency_seconds at most +10%, 50 observations a side, "
    "confidence 0.98; "
    "p99 end-to-end latency: p99 of sglang:e2e_request_latency_seconds at most +10%, 50 observations a side, "
    "confidence 0.98; "
    "aborted requests: any increase of sglang:num_aborted_requests_total fails; "
    "KV transfer failures: any increase of sglang:num_transfer_failed_reqs_total fails; "
    "KV bootstrap failures: any increase of sglang:num_bootstrap_failed_reqs_total fails")


def read(key: str, what: str, url: str = METRICS) -> Action:
    return Action.http(key, what, url, repeats=True)


def test_analysis_baseline_reads_the_hosts_metrics_six_times_a_minute_apart() -> None:
    plan = step("analysis_baseline").plan(context(SERVING))
    assert does(plan) == does([read("before", "read the metrics before the restart 6 times, every 60s")])


def test_analysis_baseline_reads_its_own_url_in_its_own_windows() -> None:
    plan = step("analysis_baseline", {"url": SIBLING, "windows": 3, "interval_s": 0.5}).plan(context(SERVING))
    assert does(plan) == does([read("before", "read the metrics before the restart 4 times, every 0.5s", SIBLING)])


def test_analysis_before_after_reads_this_host_then_judges_sglangs_metrics_by_default() -> None:
    plan = step("analysis").plan(context(SERVING))
    assert does(plan) == does([
        read("canary", "read this host's metrics 6 times, every 60s"),
        Action("judge this host after its restart against before it (analysis_baseline's reads) on 5 windows: "
               + SGLANG_JUDGED)])


def test_analysis_against_a_sibling_reads_both_at_the_same_instants_after_the_warm_up() -> None:
    plan = step("analysis", {"baseline": {"metrics": SIBLING}, "windows": 2, "interval_s": 0.5,
                             "initial_delay_s": 30,
                             "checks": [{"kind": "histogram", "name": "mean ITL", "quantile": None,
                                         "metric": "sglang:inter_token_latency_seconds", "allowed_change": 0.05,
                                         "min_samples": 10, "confidence": 0.95, "labels": {"model": "m"},
                                         "min_effect": 0.5},
                                        {"kind": "histogram", "name": "p50 throughput", "quantile": 0.5,
                                         "better": "higher", "metric": "tokens_per_request"},
                                        {"kind": "critical", "name": "KV transfer failures",
                                         "metric": "sglang:num_transfer_failed_reqs_total"}]}).plan(context(SERVING))
    assert does(plan) == does([
        Action("wait 30s for the new build to warm up"),
        read("canary", "read this host's metrics 3 times, every 0.5s"),
        read("baseline", "read the sibling's metrics at the same instants 3 times, every 0.5s", SIBLING),
        Action("judge this host against its sibling on 2 windows: "
               'mean ITL: mean of sglang:inter_token_latency_seconds{model="m"} at most +5%, 10 observations a '
               "side, confidence 0.95, an effect of at least 0.5 toward worse to fail; "
               "p50 throughput: p50 of tokens_per_request at most -10%, 50 observations a side, confidence 0.98; "
               "KV transfer failures: any increase of sglang:num_transfer_failed_reqs_total fails")])


@pytest.mark.parametrize("kind", ["analysis", "analysis_baseline"])
def test_analysis_steps_cannot_plan_without_a_metrics_url(kind: str) -> None:
    with pytest.raises(StepFailed, match="no metrics URL: set `metrics` on host gpu-1 or `url` on the step"):
        step(kind).plan(context(host()))


def test_analysis_against_before_without_an_analysis_baseline_is_refused_when_the_playbook_is_loaded(
        tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    playbook = tmp_path / "fix.yaml"
    playbook.write_text("name: unread\nfiles: [{src: a.py, dest: a.py}]\nsteps: [upload, {commit: {message: m}}, "
                        "co_restart, analysis]\n")
    with pytest.raises(ConfigError, match="analysis needs an earlier analysis_baseline step: `baseline: before` "
                                          "judges against its reads before the restart"):
        load_playbook(playbook)
    # A restart-only playbook too (its order rules for an upload do not apply): never found after a restart.
    playbook.write_text("name: unread\nsteps: [co_restart, analysis]\n")
    with pytest.raises(ConfigError, match="needs an earlier analysis_baseline"):
        load_playbook(playbook)
    playbook.write_text("name: read\nfiles: [{src: a.py, dest: a.py}]\nsteps: [{analysis_baseline: {windows: 2}}, "
                        "upload, {commit: {message: m}}, co_restart, analysis]\n")
    load_playbook(playbook)
    playbook.write_text("name: sibling\nsteps: [co_restart, {analysis: {baseline: {metrics: "
                        "'http://127.0.0.1:9/metrics'}}}]\n")
    load_playbook(playbook)


def test_analysis_baseline_after_the_restart_is_refused_when_the_playbook_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "fix.yaml").write_text("name: late\nfiles: [{src: a.py, dest: a.py}]\nsteps: [upload, "
                                       "{commit: {message: m}}, co_restart, analysis_baseline, analysis]\n")
    with pytest.raises(ConfigError, match="analysis_baseline must come before co_restart"):
        load_playbook(tmp_path / "fix.yaml")


def no_diff() -> DiffStat:
    raise AssertionError("the analysis needs no diff to judge its playbook")
