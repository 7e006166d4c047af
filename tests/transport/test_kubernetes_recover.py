"""A run into a pod cut by a SIGKILL of the deployer, over each way a pod's service restarts (a `start:` process in
the container, `kubernetes: container`, `kubernetes: pod`), is ended by `deployer recover`: cut in its restart, the
restart is finished on the fix (served by the new process, container or pod); cut before its commit, the files are
restored; a rollback cut in its restart is finished; from a machine without the run dir, `recover --host --rollback`
reverts it into a new pod. Then the run's record is settled, the lock and the intent record are gone and its log
verifies. The repo is on a hostPath volume (what keeps the fix through the two restarts that make a new container or
pod), so the test reads it, its lock and its intent record here, as the kubelet's node would.

One stand-in cluster serves the whole module (each test its own pod, owner and port): starting one per test would
cost more than the tests."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures_kube import Container, Kube, Volume
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, act_when, age_lock, git, init_repo
from kube.standin import running_standin
from polling import wait_for
from ports import free_port
from test_kubernetes_restart import FILES, POD_REPO, SERVER, answers, serving

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

WAYS = ["start", "container", "pod"]
GATE = "deployer-test-gate"  # the pre-commit hook's pid in its container (in the repo's .git, on the volume)
NUMBERS = itertools.count()


@pytest.fixture(scope="module")
def cluster(podman_env: dict[str, str], kubectl_binary: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """The module's stand-in cluster (fixtures_kube's `kube`, started once for all of these tests)."""
    with running_standin(tmp_path_factory.mktemp("kube"), podman_env, kubectl_binary) as standin:
        yield Kube(standin.cluster, standin.url, standin.kubeconfig, kubectl_binary, standin.env)


@dataclass
class Pod:
    """A pod whose service `server` (restarted one way) serves pkg/a.py as its process read it at its start."""

    kube: Kube
    name: str
    way: str
    port: int
    project: Project

    @property
    def checkout(self) -> Path:
        return self.project.repo

    def identity(self) -> tuple[str, int, str]:
        """The pod's uid, its container's restartCount and containerID (the stand-in's live state)."""
        with self.kube.cluster.lock:
            pod = self.kube.cluster.pod(self.name, self.kube.namespace)
            state = pod.containers["server"]
            return pod.uid, state.restart_count, state.container_id

    def end(self, pid: int) -> None:
        """SIGKILL pid in the container (if it still runs: the end of the cut run's exec may have taken it), and
        wait until it runs no more (gone, or a zombie of the server as PID 1, which reaps none)."""
        self.kube.kubectl("exec", self.name, "-c", "server", "--", "kill", "-9", str(pid))

        def ended() -> bool:
            stat = self.kube.kubectl("exec", self.name, "-c", "server", "--", "cat", f"/proc/{pid}/stat")
            return stat.returncode != 0 or stat.stdout.decode().rpartition(")")[2].split()[0] == "Z"

        wait_for(ended, f"the end of pid {pid} in pod {self.name}", 30)

    def annotation(self) -> str | None:
        meta = self.kube.kubectl_json("get", "pod", self.name)["metadata"]
        return (meta.get("annotations") or {}).get("deployer.dev/run")


def make_pod(kube: Kube, tmp_path: Path, way: str, *, hooks: bool = False) -> Pod:
    """A pod named after the test's way, its repo a hostPath volume; a `start:` server is started by `deployer
    restart` first, so every way begins with a server on the original code."""
    name = f"{way}{next(NUMBERS)}-0"  # the pods of one cluster need names of their own
    checkout = tmp_path / "checkout"
    init_repo(checkout, FILES)
    port = free_port()
    server = ("python3", "-c", SERVER.format(repo=POD_REPO, port=port))
    health = {"health": f"http://127.0.0.1:{port}/", "health_timeout_s": 60}
    owner = None
    if way == "pod":
        owner = f"StatefulSet/{name.removesuffix('-0')}"
        kube.owner("StatefulSet", name.removesuffix("-0"))
    container = Container("server", ("sleep", "infinity") if way == "start" else server, mounts={"repo": POD_REPO})
    kube.pod(name, container, volumes=(Volume("repo", "hostPath", str(checkout)),), owner=owner)
    service: dict[str, Any] = ({"start": list(server), "stop_grace_s": 2, **health} if way == "start"
                               else {"kubernetes": way, **health})
    pod = {"name": name, "container": "server", "namespace": kube.namespace, "context": kube.context,
           "kubeconfig": str(kube.kubeconfig)}
    (tmp_path / "project").mkdir()
    project = Project(root=tmp_path / "project", repo=checkout,
                      host={"transport": "kubernetes", "repo": POD_REPO, "python": "python3", "pod": pod,
                            "services": {"server": service}},
                      extra_env={"PATH": kube.env["PATH"], "KUBECACHEDIR": kube.env["KUBECACHEDIR"]})
    project.write_inventory()
    project.write("fix/a.py", FIXED_A)
    project.playbook(steps=["upload", {"commit": {"message": "pkg: answer is 42", "hooks": hooks}}, "co_restart"])
    if way == "start":
        started = project.deployer("restart", "--host", "box")
        assert started.returncode == 0, started.stdout + started.stderr
    wait_for(lambda: answers(port), f"the server of pod {name} on port {port}", 30)
    assert serving(port) == ORIGINAL_A
    return Pod(kube, name, way, port, project)


def state_of(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "state.json").read_text()))


def runs(project: Project) -> set[Path]:
    return set(project.runs.iterdir()) if project.runs.is_dir() else set()


def new_runs(project: Project, before: set[Path]) -> list[Path]:
    return [p for p in runs(project) - before if (p / "events.jsonl").is_file()]


def cut(project: Project, args: list[str], reached: str, what: str) -> Path:
    """`deployer ARGS` SIGKILLed once its new run's log has an event of type `reached`; that run's dir."""
    before = runs(project)

    def seen() -> bool:
        return any(f'"type": "{reached}"' in (p / "events.jsonl").read_text() for p in new_runs(project, before))

    done = act_when(project, args, seen, lambda proc: proc.send_signal(signal.SIGKILL), what)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    [run] = new_runs(project, before)
    return run


def recovered(pod: Pod, run: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """`deployer recover RUN` exits 0 and leaves the run settled: no lock, no intent record, its log verifies. What
    it said, and its run's id."""
    age_lock(pod.checkout)  # the cut run's heartbeat, as if its TTL had passed
    done = pod.project.deployer("recover", run.name)
    assert done.returncode == 0, done.stdout + done.stderr
    recover_id = pod.project.newest_run()
    assert not (pod.checkout / ".git" / "deployer.run.lock").exists(), "the lock is still there"
    assert not (pod.checkout / ".git" / "deployer" / "inflight.json").exists(), "the intent record is still there"
    verified = pod.project.deployer("runs", "verify", run.name)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    return done, recover_id


@pytest.mark.parametrize(("way", "moment"), [*((way, "service_stopped") for way in WAYS),
                                             ("container", "service_started"), ("pod", "service_started")])
def test_a_run_cut_in_its_restart_into_a_pod_is_finished_by_recover_on_the_fix(
        way: str, moment: str, cluster: Kube, tmp_path: Path) -> None:
    """Cut once its restart stopped the old server (the new container or pod, if any, runs; the run had not proved
    it yet), recover restarts it again; cut once the restart proved the new one, recover keeps it (no second
    outage): either way the server runs the fix."""
    pod = make_pod(cluster, tmp_path, way)
    head = pod.project.head()
    first = pod.identity()
    run = cut(pod.project, ["apply", "fix.yaml", "--host", "box"], moment, f"co_restart's {moment}")
    assert state_of(run)["phase"] == "restarting"
    cut_left = pod.identity()

    done, recover_id = recovered(pod, run)
    assert state_of(run)["phase"] == "succeeded", state_of(run)
    assert git(pod.checkout, "rev-parse", "HEAD~1").strip() == head
    assert f"Deployer-Run: {run.name}" in git(pod.checkout, "log", "-1", "--format=%B")
    assert (pod.checkout / "pkg" / "a.py").read_text() == FIXED_A
    assert serving(pod.port) == FIXED_A, "the server runs the fix"
    assert f"run {run.name} -> succeeded" in done.stdout, done.stdout
    events = pod.project.events(recover_id)
    said = {e["type"] for e in events if e.get("service") == "server"}
    now = pod.identity()
    if moment == "service_started":
        assert "kept server (already serving its commit)" in done.stdout, done.stdout
        assert "service_kept" in said and "service_stopped" not in said
        assert now == cut_left, "no second restart"
        assert pod.annotation() == run.name
        return
    assert {"service_stopped", "service_started"} <= said and "service_kept" not in said
    assert [e["step"] for e in events if e["type"] == "step_end" and e["status"] == "ok"] == ["co_restart"]
    if way == "container":
        assert now[0] == first[0] and now[1] == cut_left[1] + 1 == first[1] + 2 and now[2] != cut_left[2], \
            (first, cut_left, now)
    if way == "pod":
        assert len({first[0], cut_left[0], now[0]}) == 3, "the cut run's new pod, then recover's"
    if way != "start":
        assert pod.annotation() == recover_id, "the restart that made this container or pod annotates it"
    verified = pod.project.deployer("runs", "verify", recover_id, "--target")
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("way", WAYS)
def test_a_run_into_a_pod_cut_before_its_commit_is_restored_by_recover(
        way: str, cluster: Kube, tmp_path: Path) -> None:
    pod = make_pod(cluster, tmp_path, way, hooks=True)
    head = pod.project.head()
    first = pod.identity()
    gate = pod.checkout / ".git" / GATE
    # Blocks the commit (inside the pod) for good, once it wrote its pid (the container's) where the test reads it.
    pod.project.hook("pre-commit", f"#!/bin/sh\necho $$ > .git/{GATE}\nwhile :; do sleep 0.05; done\n")
    before = runs(pod.project)
    done = act_when(pod.project, ["apply", "fix.yaml", "--host", "box"], gate.exists,
                    lambda proc: proc.send_signal(signal.SIGKILL), "the pre-commit hook")
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    [run] = new_runs(pod.project, before)
    assert state_of(run)["phase"] in ("changing", "changed", "committing"), state_of(run)
    assert (pod.checkout / "pkg" / "a.py").read_text() == FIXED_A, "cut with the fix shipped, not committed"
    pod.end(int(gate.read_text()))
    blocked = pod.project.deployer("apply", "fix.yaml", "--host", "box")
    assert blocked.returncode == 3 and f"deployer recover {run.name}" in blocked.stderr, \
        blocked.stdout + blocked.stderr

    recovered(pod, run)
    assert state_of(run)["phase"] == "failed_restored", state_of(run)
    assert pod.project.head() == head
    assert (pod.checkout / "pkg" / "a.py").read_text() == ORIGINAL_A
    assert git(pod.checkout, "status", "--porcelain") == ""
    assert not (pod.checkout / ".git" / "index.lock").exists(), "git's lock, left by the git the cut took with it"
    assert pod.identity() == first, "nothing was restarted"
    assert serving(pod.port) == ORIGINAL_A


def test_a_rollback_of_a_pods_run_cut_in_its_container_restart_is_finished_by_recover(
        cluster: Kube, tmp_path: Path) -> None:
    pod = make_pod(cluster, tmp_path, "container")
    head = pod.project.head()
    applied = pod.project.deployer("apply", "fix.yaml", "--host", "box")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    original = pod.project.newest_run()
    assert serving(pod.port) == FIXED_A
    rollback = cut(pod.project, ["rollback", original], "service_stopped", "the rollback's container restart")
    assert state_of(rollback)["phase"] == "rolling_back"
    assert (pod.checkout / "pkg" / "a.py").read_text() == ORIGINAL_A, "its revert went in before the restart"
    revert = pod.project.head()
    cut_left = pod.identity()

    recovered(pod, rollback)
    assert state_of(rollback)["phase"] == "rolled_back", state_of(rollback)
    assert state_of(pod.project.runs / original)["phase"] == "succeeded"
    assert pod.project.head() == revert and git(pod.checkout, "rev-parse", "HEAD~2").strip() == head
    assert pod.identity()[1] == cut_left[1] + 1, "recover restarted the container once more"
    assert serving(pod.port) == ORIGINAL_A, "the new container runs the reverted code"
    again = pod.project.deployer("rollback", original)
    assert again.returncode == 2 and "already rolled back" in again.stderr, again.stdout + again.stderr


def test_recover_by_host_with_rollback_of_a_pods_cut_restart_from_another_machine_reverts_in_a_new_pod(
        cluster: Kube, tmp_path: Path) -> None:
    """From a machine without the run dir (`recover --host`, read from the intent record on the volume) the cut
    run's commit is reverted and the pod restarted as its playbook would have: its StatefulSet's new pod serves the
    reverted code."""
    pod = make_pod(cluster, tmp_path, "pod")
    head = pod.project.head()
    run = cut(pod.project, ["apply", "fix.yaml", "--host", "box"], "service_stopped", "co_restart's stop")
    cut_left = pod.identity()
    age_lock(pod.checkout)
    elsewhere = tmp_path / "other-runs"
    done = pod.project.deployer("recover", "--host", "box", "--rollback", "--runs-dir", str(elsewhere))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run {run.name} -> rolled_back" in done.stdout, done.stdout
    assert git(pod.checkout, "rev-parse", "HEAD~2").strip() == head
    assert (pod.checkout / "pkg" / "a.py").read_text() == ORIGINAL_A
    assert pod.identity()[0] != cut_left[0], "the revert is served by a new pod"
    assert serving(pod.port) == ORIGINAL_A
    assert not (pod.checkout / ".git" / "deployer.run.lock").exists()
    assert not (pod.checkout / ".git" / "deployer" / "inflight.json").exists()
