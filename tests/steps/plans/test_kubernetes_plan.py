"""co_restart's plan for a service that is its pod's container (`kubernetes: container`), as data: the pod read
where kubectl runs, the annotation and the TERM to PID 1 in it, the wait for the kubelet's new container, a new
agent in it, health, then Ready, then the pod annotated with the run; for `kubernetes: pod`, the pod's delete and
a new uid."""

from __future__ import annotations

from planning import RUN_ID, context, does, step

from deployer.config.models import KubernetesHost
from deployer.steps.action import Action

HEALTH = "http://127.0.0.1:30000/health"
KUBECTL = ("kubectl", "--context", "prod", "--namespace", "serving")
GOT = (*KUBECTL, "get", "pod", "sglang-0", "-o", "json")
AT = " (where kubectl runs)"


def test_co_restart_podcontainer_ends_pid_1_and_proves_the_new_container_then_health_and_ready() -> None:
    target = KubernetesHost.model_validate({
        "transport": "kubernetes", "repo": "/sgl-workspace",
        "pod": {"name": "sglang-0", "container": "server", "namespace": "serving", "context": "prod"},
        "services": {"server": {"kubernetes": "container", "health": HEALTH}}})
    plan = step("co_restart").plan(context(target))  # type: ignore[arg-type]
    assert does(plan) == does([
        Action.run("server.pod", "read pod sglang-0: container server's restartCount, containerID, startedAt, "
                   f"Ready and the pod's owner{AT}", GOT),
        Action.http("server.health", "is server answering", HEALTH),
        Action.run("server.stop", "end container server's main process (TERM to PID 1 in it): the kubelet starts a "
                   f"new container from the image{AT}",
                   (*KUBECTL, "exec", "sglang-0", "-c", "server", "--", "python3", "-c",
                    "import os,signal; os.kill(1, signal.SIGTERM)")),
        Action.run("server.up", f"wait for a new container server (restartCount +1, a new containerID){AT}", GOT,
                   repeats=True),
        Action("start a new agent in the new container server (kubectl exec -i sglang-0 -c server <python> ...; "
               "the old one ended with its container) and resume the deploy lock's heartbeat there",
               key="server.reopen"),
        Action.get("server.main", "container server's main process (PID 1 in it) runs", "/proc/1/stat",
                   repeats=True),
        Action.http("server.up_health", "wait up to 60s for server to answer 200", HEALTH, repeats=True),
        Action.run("server.ready", f"wait for container server to be Ready{AT}", GOT, repeats=True),
        Action.run("server.annotate", f"annotate pod sglang-0 with the run's id{AT}",
                   (*KUBECTL, "annotate", "pod", "sglang-0", f"deployer.dev/run={RUN_ID}",
                    "--overwrite"), failure="kubectl annotate pod sglang-0 failed"),
        Action.run("server.still", f"container server is still the one started{AT}", GOT),
        Action.get("server.memory", "how much memory <new pid of server> holds", "/proc/<new pid of server>/status",
                   when="server runs but does not answer in time"),
        Action.run("server.log", f"the end of container server's output, this container's and the one before{AT}",
                   ("sh", "-c", '"$@" 2>&1; "$@" --previous 2>&1', "deployer-logs", *KUBECTL, "logs", "sglang-0",
                    "-c", "server", "--tail", "40"), when="server fails")])


def test_co_restart_podcontainer_of_a_pod_deletes_it_with_the_grace_and_waits_for_a_new_uid() -> None:
    target = KubernetesHost.model_validate({
        "transport": "kubernetes", "repo": "/sgl-workspace",
        "pod": {"name": "sglang-0", "container": "server", "namespace": "serving", "context": "prod"},
        "services": {"server": {"kubernetes": "pod", "stop_grace_s": 45}}})
    plan = {a.key: a for a in step("co_restart").plan(context(target))}  # type: ignore[arg-type]
    assert does([plan["server.stop"], plan["server.up"]]) == does([
        Action.run("server.stop", f"delete pod sglang-0 (TERM, KILL after 45s): its controller makes a new one{AT}",
                   (*KUBECTL, "delete", "pod", "sglang-0", "--grace-period=45", "--wait=false"),
                   failure="kubectl delete pod sglang-0 failed"),
        Action.run("server.up", f"wait for a new pod sglang-0 (a new uid) whose container server runs{AT}", GOT,
                   repeats=True)])
