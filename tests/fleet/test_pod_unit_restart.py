"""`deployer restart` of a group of pod units (a LeaderWorkerSet's unit `dsv4` is the group of `dsv4.0`, `dsv4.1`...,
one unit per group index): each unit restarts as one (a gang's ranks stopped, then started together), and the
command lists each selector host's pods once, however many of its hosts it loads the inventory for."""

from __future__ import annotations

from pathlib import Path

from fixtures_kube import Kube
from fixtures_repo import deployer, deployer_env
from test_pod_unit import POD_REPO, in_pod, lws_gang

from deployer.demo.run import http_status


def counting_kubectl(kube: Kube, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """deployer's environment with a `kubectl` first on PATH that appends each call's arguments to a log, then runs
    the real kubectl; that log."""
    calls, wrapper = tmp_path / "kubectl-calls", tmp_path / "counting-bin"
    wrapper.mkdir()
    script = wrapper / "kubectl"
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {kube.kubectl_path} "$@"\n')
    script.chmod(0o755)
    env = deployer_env(PATH=f"{wrapper}:{kube.env['PATH']}", KUBECACHEDIR=kube.env["KUBECACHEDIR"])
    return env, calls


def test_restart_of_a_group_of_pod_units_restarts_each_unit_as_one_and_lists_each_selector_once(
        kube: Kube, tmp_path: Path) -> None:
    """`restart --host dsv4` (the group of the LWS's units) restarts dsv4.0 as a gang: both ranks restarted together,
    healthy from the leader (one rank alone would wait at the rendezvous for the other until its health timeout);
    the two selector hosts' pods are listed once each (`kubectl get pods --selector`), not again per host."""
    port = lws_gang(kube, tmp_path)
    env, calls = counting_kubectl(kube, tmp_path)
    first = deployer("restart", "--host", "dsv4.0", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    pids = {pod: in_pod(kube, pod, f"cat {POD_REPO}/.git/deployer/rank.pid") for pod in ("dsv4-0", "dsv4-0-1")}
    calls.write_text("")
    again = deployer("restart", "--host", "dsv4", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    for pod, old in pids.items():
        assert in_pod(kube, pod, f"cat {POD_REPO}/.git/deployer/rank.pid") != old, f"{pod}: rank not restarted"
    assert http_status(f"http://127.0.0.1:{port}/health") == 200
    listings = [call for call in calls.read_text().splitlines() if " get pods --selector " in call]
    assert len(listings) == 2, listings  # leader's and workers' selectors, once each
