"""A PD unit of pods behind the demo router: a prefill pod and a decode pod (real podman containers of the stand-in
cluster, reached by the real kubectl's exec), selected by their role labels and paired by LeaderWorkerSet's group
index, roll behind the router beside a unit of plain hosts while a steady client load runs through it: each unit
is taken out, drained, restarted through the agent in its pods (or on its hosts) and put back, no request fails.

The pods use the host's network (the stand-in's pods are hostNetwork), so the demo router on this machine's
127.0.0.1 reaches the servers in them by their health URLs' origins."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_kube import Container, Kube, Volume
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, deployer, deployer_env, init_repo
from polling import wait_for
from ports import free_port
from test_gang import rank
from test_rolling_router import PdFleet, listed_healthy, load_through, make_fleet, running

from deployer.demo.run import STACK, DemoStack, http_status

pytestmark = pytest.mark.long  # tests/conftest.py: scheduled first

GROUP = "leaderworkerset.sigs.k8s.io/group-index"
WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
POD_REPO = "/sgl-workspace"
PODS = {"prefill": ("gpu-c", "sglang-prefill-0"), "decode": ("gpu-d", "sglang-decode-0")}  # role: its stack, pod
NOTE = "python/sglang/srt/demo_note.py"
# Started in the pod as co_restart starts a service: its own session, its pid file where deployer reads it.
LAUNCH = """\
import json, os, subprocess, sys
start, name, repo = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
state = os.path.join(repo, ".git", "deployer")
os.makedirs(state, exist_ok=True)
with open(os.path.join(state, name + ".log"), "ab") as log:
    proc = subprocess.Popen(start, cwd=os.path.join(repo, "python"), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
with open(os.path.join(state, name + ".pid"), "w") as pid:
    pid.write(f"{proc.pid}\\n")
"""


def pod_host(kube: Kube, stack: DemoStack, role: str) -> dict[str, Any]:
    """The selector host of one role: its pods' container `server`, its service as the stack's, at POD_REPO."""
    host = stack.host().model_dump(exclude_defaults=True)
    del host["transport"]
    return {"transport": "kubernetes", **host, "repo": POD_REPO,
            "pod": {"selector": f"app=sglang,role={role}", "container": "server", "namespace": kube.namespace,
                    "context": kube.context, "kubeconfig": str(kube.kubeconfig)}}


def in_pod(kube: Kube, pod: str, command: str) -> str:
    done = kube.kubectl("exec", pod, "-c", "server", "--", "sh", "-c", command)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


@pytest.fixture
def way(request: pytest.FixtureRequest) -> str:
    """How a pod's server runs: `start` (a process the agent starts in the container, the image's checkout) unless a
    test parametrizes it (indirect) with `container` (the container's main process, the checkout on a hostPath)."""
    return str(getattr(request, "param", "start"))


@pytest.fixture
def pod_fleet(kube: Kube, tmp_path: Path, way: str) -> Iterator[PdFleet]:
    """Unit pd-1 on the plain hosts gpu-a (prefill and the router) and gpu-b (decode); unit pd-2 the pods
    sglang-prefill-0 and sglang-decode-0 (group 0 of a LeaderWorkerSet), their servers running in them first."""
    fleet = make_fleet(tmp_path)
    for role, (stack_name, pod) in PODS.items():
        stack = fleet.stacks.pop(stack_name)
        labels = {"app": "sglang", "role": role, GROUP: "0", "leaderworkerset.sigs.k8s.io/worker-index": "0"}
        start = stack.host().services[role].start
        assert start is not None
        fleet.inventory["hosts"].pop(stack_name)
        fleet.inventory["hosts"][role] = host = pod_host(kube, stack, role)
        if way == "container":  # python is PID 1: the demo server ends on TERM
            main = ("sh", "-c", f"cd {POD_REPO}/python && exec {shlex.join(start)}")
            kube.pod(pod, Container("server", main, mounts={"repo": POD_REPO}, env={"PYTHONDONTWRITEBYTECODE": "1"}),
                     labels=labels, volumes=(Volume("repo", "hostPath", str(stack.repo)),))
            health = host["services"][role]["health"]
            host["services"][role] = {"kubernetes": "container", "health": health, "health_timeout_s": 60,
                                      "stop_grace_s": 5}
        else:
            kube.pod(pod, Container("server", image_files={POD_REPO: stack.repo}), labels=labels)
            launched = kube.kubectl("exec", "-i", pod, "-c", "server", "--", sys.executable, "-", json.dumps(start),
                                    role, POD_REPO, stdin=LAUNCH)
            assert launched.returncode == 0, launched.stderr.decode()
        wait_for(lambda stack=stack, role=role: http_status(stack.url(role, "/health")) == 200,
                 f"the {role} server in pod {pod}", 30)
    bootstrap = fleet.inventory["units"]["pd-2"]["workers"][0]["bootstrap_port"]
    fleet.inventory["units"]["pd-2"] = {
        "services": ["prefill:prefill", "decode:decode"], "group_label": GROUP, "router": "pd-router",
        "workers": [{"service": "prefill:prefill", "worker_type": "prefill", "bootstrap_port": bootstrap},
                    {"service": "decode:decode", "worker_type": "decode"}]}
    fleet.write()
    with running(fleet):  # gpu-a's prefill and router, gpu-b's decode, on this machine
        yield fleet


def apply(kube: Kube, fleet: PdFleet, *args: str) -> tuple[int, dict[str, Any], str]:
    env = deployer_env(PATH=kube.env["PATH"], KUBECACHEDIR=kube.env["KUBECACHEDIR"])
    result = deployer("apply", "note.yaml", "--host", *args, "--json", cwd=fleet.root, env=env)
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        report = {}
    return result.returncode, report, result.stdout + result.stderr


def server_of(kube: Kube, way: str, role: str, pod: str) -> str:
    """Which server runs now: the pid deployer recorded (a process in the container), or the containerID."""
    if way == "container":
        with kube.cluster.lock:
            return kube.cluster.pod(pod, kube.namespace).containers["server"].container_id
    return in_pod(kube, pod, f"cat {POD_REPO}/.git/deployer/{role}.pid")


@pytest.mark.parametrize("way", ["start", "container"], indirect=True)
def test_a_unit_of_a_prefill_pod_and_a_decode_pod_rolls_behind_the_router_and_no_request_fails(
        kube: Kube, pod_fleet: PdFleet, way: str) -> None:
    prefill, decode = "prefill.sglang-prefill-0", "decode.sglang-decode-0"
    servers = {pod: server_of(kube, way, role, pod) for role, (_, pod) in PODS.items()}
    with load_through(pod_fleet, "the apply") as load:
        code, report, output = apply(kube, pod_fleet, "pd-1,pd-2")
        served_during = load.ok
    assert code == 0, output
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    assert served_during > 5
    assert report["batches"] == [["gpu-a", "gpu-b"], [prefill, decode]]  # the pods' unit pd-2.0 alone
    for role, (_, pod) in PODS.items():
        assert in_pod(kube, pod, f"cat {POD_REPO}/{NOTE}") == "NOTE = 'rolled'\n", pod
        assert server_of(kube, way, role, pod) not in ("", servers[pod]), f"{pod}: not restarted"
    leader = min(report["units"]["pd-2.0"])  # the unit's first host in sorted order logs its router's steps
    kinds = [e["type"] for e in pod_fleet.events(report, leader) if e.get("unit") == "pd-2.0"
             and e["type"].startswith(("router_", "worker_"))]
    assert kinds[:2] == ["router_remove", "router_remove"] and "worker_inflight" in kinds, kinds
    assert kinds[-3:] == ["router_add", "router_add", "router_listed"], kinds
    connected = next(e for e in pod_fleet.events(report, prefill) if e["type"] == "connected")["transport"]
    assert (connected["kind"], connected["extra"]["pod"]) == ("kubernetes", "sglang-prefill-0")
    every = {pod_fleet.worker_url(host, role) for host, role in (("gpu-a", "prefill"), ("gpu-b", "decode"))} | \
        {f"http://127.0.0.1:{stack_port}" for stack_port in pod_ports(pod_fleet)}
    wait_for(lambda: listed_healthy(pod_fleet) == every, "every worker listed and healthy again", 10)


def pod_ports(fleet: PdFleet) -> list[int]:
    """The pods' servers' ports (pd-2's, in its prefill and decode health URLs)."""
    hosts = fleet.inventory["hosts"]
    return [int(hosts[role]["services"][role]["health"].rsplit(":", 1)[1].split("/")[0]) for role in PODS]


LWS = """\
hosts:
  router:
    transport: kubernetes
    pod: {name: sglang-router-0, container: router, %(pod)s}
    repo: /unused
  prefill:
    transport: kubernetes
    pod: {selector: "app=sglang,role=prefill", container: server, %(pod)s}
    repo: /sgl-workspace
    python: python3
    services:
      server: {kubernetes: container, health: "http://127.0.0.1:30000/health", stop_grace_s: 30}
  decode:
    transport: kubernetes
    pod: {selector: "app=sglang,role=decode", container: server, %(pod)s}
    repo: /sgl-workspace
    python: python3
    services:
      server: {kubernetes: container, health: "http://127.0.0.1:30001/health", stop_grace_s: 30}
routers:
  pd-router: {host: router, url: "http://127.0.0.1:8000"}
units:
  pd:
    services: [prefill:server, decode:server]
    group_label: leaderworkerset.sigs.k8s.io/group-index
    router: pd-router
    workers:
      - {service: prefill:server, worker_type: prefill, bootstrap_port: 8998,
         url: "http://{pod}.sglang-prefill.serving.svc:30000"}
      - {service: decode:server, worker_type: decode, url: "http://{pod}.sglang-decode.serving.svc:30001"}
"""


def test_plan_of_a_leaderworkerset_pd_deployment_rolls_one_group_at_a_time_with_the_kubectl_it_runs(
        kube: Kube, tmp_path: Path) -> None:
    """Two LeaderWorkerSets (prefill, decode) of two groups each, the server each container's main process, the
    repo on a hostPath volume: the units pd.0 and pd.1, one batch each, and the kubectl of each container restart
    (the how-to, docs/how-to/pd-pods.md, quotes this plan)."""
    for kind in ("prefill", "decode"):
        kube.owner("LeaderWorkerSet", f"sglang-{kind}", replicas=2)
        for group in ("0", "1"):
            checkout = tmp_path / f"{kind}-{group}"
            DemoStack(checkout).create()
            labels = {"app": "sglang", "role": kind, GROUP: group, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
            kube.pod(f"sglang-{kind}-{group}", Container("server", mounts={"repo": POD_REPO}), labels=labels,
                     volumes=(Volume("repo", "hostPath", str(checkout / "repo")),),
                     owner=f"LeaderWorkerSet/sglang-{kind}")
    kube.pod("sglang-router-0", Container("router"), labels={"app": "sglang", "role": "router"})
    pod = f"namespace: {kube.namespace}, context: {kube.context}, kubeconfig: {kube.kubeconfig}"
    (tmp_path / "hosts.yaml").write_text(LWS % {"pod": pod})
    (tmp_path / "note.py").write_text("NOTE = 'rolled'\n")
    (tmp_path / "note.yaml").write_text(yaml.safe_dump(
        {"name": "note", "files": [{"src": "note.py", "dest": NOTE, "create": True}],
         "steps": ["upload", {"commit": {"message": "demo: a note"}}, "co_restart"],
         "rollout": {"strategy": "rolling"}}, sort_keys=False))
    env = deployer_env(PATH=kube.env["PATH"], KUBECACHEDIR=kube.env["KUBECACHEDIR"])
    shown = deployer("plan", "note.yaml", "--host", "pd", "--verbose", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    out = shown.stdout
    for group in ("0", "1"):
        assert f"plan for host prefill.sglang-prefill-{group}: /sgl-workspace" in out, out
        assert f"plan for host decode.sglang-decode-{group}: /sgl-workspace" in out, out
    assert "batch 1: pd.0 — router pd-router keeps prefill 1/2, decode 1/2" in out, out
    assert "batch 2: pd.1 — router pd-router keeps prefill 1/2, decode 1/2" in out, out
    assert "annotate pod sglang-prefill-1 'deployer.dev/run=<dry-run>' --overwrite" in out, out
    assert "exec sglang-decode-1 -c server -- python3 -c 'import os,signal; os.kill(1, signal.SIGTERM)'" in out, out
    print(out)  # the how-to quotes it (docs/how-to/pd-pods.md)


def test_a_fleet_of_pods_runs_in_batches_in_parallel_as_a_fleet_of_hosts(kube: Kube, tmp_path: Path) -> None:
    """A selector host's three pods, `rollout: {batches: [1, 2]}` and --parallel 2: the first pod alone (the
    canary batch), then the other two at once, each its own run through its own kubectl exec; and one pod's run
    rolled back by its id alone."""
    image = tmp_path / "image-checkout"
    init_repo(image, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
    pods = ("decode-0", "decode-1", "decode-2")
    for pod in pods:
        kube.pod(pod, Container("server", image_files={POD_REPO: image}), labels={"role": "decode"})
    pod = {"selector": "role=decode", "container": "server", "namespace": kube.namespace, "context": kube.context,
           "kubeconfig": str(kube.kubeconfig)}
    project = Project(root=tmp_path, repo=Path(POD_REPO), host={
        "transport": "kubernetes", "repo": POD_REPO, "python": "python3", "pod": pod},
        extra_env={"PATH": kube.env["PATH"], "KUBECACHEDIR": kube.env["KUBECACHEDIR"]})
    project.write_inventory()
    project.write("fix/a.py", FIXED_A)
    project.playbook(rollout={"batches": [1, 2]})
    done = project.deployer("apply", "fix.yaml", "--host", "box", "--parallel", "2", "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["status"] == "successful", done.stdout + done.stderr
    hosts = [f"box.{pod}" for pod in pods]
    assert report["batches"] == [hosts[:1], hosts[1:]]
    for host, pod in zip(hosts, pods, strict=True):
        assert in_pod(kube, pod, f"cat {POD_REPO}/pkg/a.py") == FIXED_A, pod
        connected = next(e for e in project.events(report["hosts"][host]["run_id"]) if e["type"] == "connected")
        assert connected["transport"]["extra"]["pod"] == pod
    spans = [[e["time"] for e in project.events(report["hosts"][host]["run_id"])
              if e["type"] in ("run_start", "run_end")] for host in hosts[1:]]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], f"the second batch ran one by one: {spans}"
    # One pod's run rolls back alone: its host, box.decode-1, is found again by listing the selector's pods.
    rolled = project.deployer("rollback", report["hosts"][hosts[1]]["run_id"])
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert [in_pod(kube, pod, f"cat {POD_REPO}/pkg/a.py") for pod in pods] == [FIXED_A, ORIGINAL_A, FIXED_A]


def test_a_canary_proves_the_pods_unit_directly_through_the_agent_in_the_pod_and_through_the_router(
        kube: Kube, pod_fleet: PdFleet) -> None:
    """The canary step of test_canary_router on the pods' unit: its direct request is sent from the agent in the
    prefill pod to the server beside it, its request through the router once the unit's workers are back."""
    canary = {"canary": {"service": "prefill", "via": "pd-router", "max_new_tokens": 4}}
    playbook = yaml.safe_load((pod_fleet.root / "note.yaml").read_text())
    (pod_fleet.root / "note.yaml").write_text(yaml.safe_dump({**playbook, "steps": [*playbook["steps"], canary]},
                                                             sort_keys=False))
    with load_through(pod_fleet, "the apply") as load:
        code, report, output = apply(kube, pod_fleet, "pd-1,pd-2")
    assert code == 0, output
    assert load.report.failed == 0, f"{load.report.failed} of {load.report.sent} failed: {load.report.failures}"
    seen = [e for e in pod_fleet.events(report, "prefill.sglang-prefill-0") if e["type"] == "canary"]
    assert [("router" in e, e["ok"]) for e in seen] == [(False, True), (True, True)], seen


def lws_gang(kube: Kube, tmp_path: Path) -> int:
    """One LeaderWorkerSet group of a leader pod and a worker pod, a selector host each, and the gang unit `dsv4`
    paired by the group index (test_gang's ranks, in pods); the leader's HTTP port."""
    stack = tmp_path / "stack"
    shutil.copytree(STACK, stack, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    port, rendezvous = free_port(), free_port()
    hosts: dict[str, Any] = {}
    for index, role in ((0, "leader"), (1, "workers")):
        image = tmp_path / f"image-{role}"
        init_repo(image, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
        labels = {"leaderworkerset.sigs.k8s.io/name": "dsv4", GROUP: "0", WORKER: str(index)}
        kube.pod("dsv4-0" if index == 0 else f"dsv4-0-{index}",
                 Container("server", image_files={POD_REPO: image, "/stack": stack}), labels=labels)
        place = f"{WORKER}=0" if index == 0 else f"{WORKER}!=0"
        hosts[role] = {"transport": "kubernetes", "repo": POD_REPO, "python": sys.executable,
                       "services": {"rank": rank(Path("/stack/python"), index, port, rendezvous)},
                       "pod": {"selector": f"leaderworkerset.sigs.k8s.io/name=dsv4,{place}", "container": "server",
                               "namespace": kube.namespace, "context": kube.context,
                               "kubeconfig": str(kube.kubeconfig)}}
    inventory = {"hosts": hosts, "units": {"dsv4": {"services": ["leader:rank", "workers:rank"], "gang": True,
                                                    "leader": "leader:rank", "group_label": GROUP}}}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    return port


def test_a_leaderworkerset_groups_leader_and_worker_pods_restart_as_one_gang(kube: Kube, tmp_path: Path) -> None:
    """One LeaderWorkerSet group of two pods (worker index 0 the leader, 1 the worker), a selector host each (the
    worker's by `worker-index!=0`), and a gang unit paired by the group index: `deployer restart --host dsv4.0`
    restarts both ranks of group 0 together, healthy from the leader pod alone (test_gang's ranks, in pods)."""
    port = lws_gang(kube, tmp_path)
    env = deployer_env(PATH=kube.env["PATH"], KUBECACHEDIR=kube.env["KUBECACHEDIR"])
    # started together: one after the other, rank 0 would wait at the rendezvous for rank 1 until its health timeout
    first = deployer("restart", "--host", "dsv4.0", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert http_status(f"http://127.0.0.1:{port}/health") == 200
    pids = {pod: in_pod(kube, pod, f"cat {POD_REPO}/.git/deployer/rank.pid") for pod in ("dsv4-0", "dsv4-0-1")}
    again = deployer("restart", "--host", "dsv4.0", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    for pod, old in pids.items():
        assert in_pod(kube, pod, f"cat {POD_REPO}/.git/deployer/rank.pid") != old, f"{pod}: rank not restarted"
        assert in_pod(kube, pod, f"kill -0 $(cat {POD_REPO}/.git/deployer/rank.pid) && echo alive") == "alive\n"
    assert http_status(f"http://127.0.0.1:{port}/health") == 200
    for host in ("leader.dsv4-0", "workers.dsv4-0-1"):
        assert re.search(rf"{re.escape(host)}:\nrun \S+: succeeded \(exit 0\)\n  pids: rank \d+ -> \d+", again.stdout)
