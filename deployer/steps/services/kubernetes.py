"""A service that is its pod's container itself (`kubernetes: container`: its main process is the server), or the whole
pod (`kubernetes: pod`: deleted, and its controller makes a new one under the same name).

A container restart ends the main process (`kubectl exec POD -c C -- <python> -c 'os.kill(1, SIGTERM)'`); the
kubelet then starts a NEW container from the image, as Kubernetes does for any container that exits: its
restartCount goes up by one, its containerID and startedAt are new. A pod restart is `kubectl delete pod`; the
controller (a StatefulSet or a LeaderWorkerSet: those keep a pod's name) makes a new pod, proven by a new
metadata.uid. Both are read with `kubectl get pod` where kubectl runs (this machine or the bastion: the agent beside
the pod's exec, transport/container.py). No host pid is visible through kubectl, so the container's ID (its last 12
hex digits, as a number) stands where other managers put a pid: it is new exactly when a new container runs. The
agent ran in the old container and ended with it: a new one is started in the new container (Transport.reopen, which
resumes the lock's heartbeat) before health, Ready and the steps after the restart.

Deployer works with the pod's controller, never around it: the restart is refused while the owner (its
ownerReferences' controller) is mid-rollout, and nothing is scaled or edited; the pod is only annotated with the
run's id (deployer.dev/run) once it runs the fix, so `kubectl get pods` shows which run patched it.

A new container has the image's filesystem, and a new pod a new emptyDir: a dest the restart throws away (the
container's own layer; an emptyDir, for a pod restart) is refused before it changes anything (exit 2: the inventory
and the playbook ask for what cannot keep the fix), naming what would keep it.
"""

from __future__ import annotations

import json
import posixpath
import time
import weakref
from dataclasses import dataclass
from typing import Any

from deployer.config.models import KubernetesHost, Service
from deployer.errors import AgentLost, ConfigError
from deployer.steps.action import Action, Bound
from deployer.steps.context import NOTHING, Context
from deployer.steps.services.container import beside
from deployer.steps.services.manager import PROBE_TIMEOUT_S, Manager, Observed, runs
from deployer.transport.base import Transport
from deployer.transport.kubernetes import KEEPS, LAYER, identity, kubectl_argv, placements, pod_spec

ANNOTATION = "deployer.dev/run"
# The controllers that make a deleted pod's successor under its name (the host names the pod by it).
KEEPS_NAMES = ("StatefulSet", "LeaderWorkerSet")
# What each way of restarting keeps of the pod's volumes' kinds (the container's own layer: neither).
KEPT = {"container": ("emptyDir", "hostPath", "persistentVolumeClaim"), "pod": ("hostPath", "persistentVolumeClaim")}
STOP_SLACK_S = 30.0  # the kubelet's own work after the main process ended (the new container's creation)
# What keeps a file through this restart, said when a dest would be lost.
WAYS = ("put the dest on a volume (a hostPath or a PVC; an emptyDir too, for a container restart), run the server "
        "under a launcher inside the container and make it a `start:` service (restarted in place, the layer "
        "kept), or make the fix part of the image (`deployer bake RUN_ID` after a run)")


@dataclass(frozen=True)
class Status:
    """What `kubectl get pod -o json` says of the pod and its container."""

    uid: str
    running: bool
    ready: bool
    restarts: int
    container_id: str
    started_at: str
    owners: tuple[tuple[str, str, str], ...]  # (apiVersion, kind, name) of each controller reference
    node: str = ""  # the node it runs on (spec.nodeName): a hostPath is that node's

    @property
    def identity(self) -> int:
        """The container's ID as a number (its last 12 hex digits): new exactly when a new container runs."""
        try:
            return int(self.container_id.rpartition("/")[2][-12:], 16)
        except ValueError:
            return 0

    @classmethod
    def of(cls, result: object, container: str) -> Status | None:
        if not getattr(result, "ok", False):
            return None
        try:
            pod = json.loads(getattr(result, "out", ""))
            meta, statuses = pod["metadata"], pod.get("status", {}).get("containerStatuses", [])
            mine = next(s for s in statuses if s.get("name") == container)
            running = mine.get("state", {}).get("running")
            owners = tuple((o["apiVersion"], o["kind"], o["name"]) for o in meta.get("ownerReferences", [])
                           if o.get("controller"))
            return cls(str(meta["uid"]), running is not None, bool(mine.get("ready")), int(mine["restartCount"]),
                       str(mine.get("containerID", "")), str((running or {}).get("startedAt", "")), owners,
                       str(pod.get("spec", {}).get("nodeName", "")))
        except (ValueError, KeyError, TypeError, StopIteration):
            return None


_specs: weakref.WeakKeyDictionary[Transport, dict[str, Any]] = weakref.WeakKeyDictionary()


class PodContainerManager(Manager):
    """The pod's container (its main process ended from inside: the kubelet's new container is proved by
    restartCount and containerID) or the pod (deleted: its controller's new pod is proved by its uid); then health
    through a new agent, then Ready."""

    def __init__(self, ctx: Context, name: str, service: Service, step: str, timeout: float) -> None:
        super().__init__(ctx, name, service, step, timeout)
        host = ctx.host
        assert isinstance(host, KubernetesHost) and host.pod.name is not None, "config.check_pod_container"
        self.pod = host.pod
        self.way = service.kubernetes or "container"
        self.host_side = beside(ctx)
        pod, box = host.pod.name, host.pod.container
        kubectl = kubectl_argv(host.pod)
        at = " (where kubectl runs)"
        got = (*kubectl, "get", "pod", pod, "-o", "json")
        self.status = Action.run(f"{name}.pod", f"read pod {pod}: container {box}'s restartCount, containerID, "
                                 f"startedAt, Ready and the pod's owner{at}", got)
        self.annotate = Action.run(f"{name}.annotate", f"annotate pod {pod} with the run's id{at}",
                                   (*kubectl, "annotate", "pod", pod, f"{ANNOTATION}={ctx.run_id}", "--overwrite"),
                                   failure=f"kubectl annotate pod {pod} failed")
        if self.way == "pod":
            grace = str(int(service.stop_grace_s))
            self.kill = Action.run(f"{name}.stop", f"delete pod {pod} (TERM, KILL after {grace}s): its controller "
                                   f"makes a new one{at}",
                                   (*kubectl, "delete", "pod", pod, f"--grace-period={grace}", "--wait=false"),
                                   failure=f"kubectl delete pod {pod} failed")
            self.up = Action.run(f"{name}.up", f"wait for a new pod {pod} (a new uid) whose container {box} runs{at}",
                                 got, repeats=True)
        else:
            self.kill = Action.run(
                f"{name}.stop", f"end container {box}'s main process (TERM to PID 1 in it): the kubelet starts a new "
                f"container from the image{at}",
                (*kubectl, "exec", pod, "-c", box, "--", host.python, "-c",
                 "import os,signal; os.kill(1, signal.SIGTERM)"))
            self.up = Action.run(f"{name}.up", f"wait for a new container {box} (restartCount +1, a new containerID)"
                                 f"{at}", got, repeats=True)
        self.reopen = Action(f"start a new agent in the new container {box} (kubectl exec -i {pod} -c {box} <python> "
                             "...; the old one ended with its container) and resume the deploy lock's heartbeat there",
                             key=f"{name}.reopen")
        self.main = Action.get(f"{name}.main", f"container {box}'s main process (PID 1 in it) runs", "/proc/1/stat",
                               repeats=True)
        self.ready = Action.run(f"{name}.ready", f"wait for container {box} to be Ready{at}",
                                got, repeats=True)
        self.still = Action.run(f"{name}.still", f"container {box} is still the one started{at}",
                                got)
        self._log = Action.run(f"{name}.log", f"the end of container {box}'s output, this container's and the one "
                               f"before{at}", ("sh", "-c", '"$@" 2>&1; "$@" --previous 2>&1', "deployer-logs",
                                              *kubectl, "logs", pod, "-c", box, "--tail", "40"),
                               when=f"{name} fails")
        self.seen: Status | None = None  # what observe() read last
        self.started: Status | None = None  # the new container start() brought up

    @classmethod
    def manages(cls, service: Service) -> bool:
        return service.kubernetes is not None

    # -- where the shipped files live, and whether this restart keeps them --------------------------------------

    def places(self) -> list[tuple[str, str, bool]]:
        """Each dest of the run: where it lives in the pod (the pod spec's volumes) and whether this restart (a new
        container from the image) keeps it. The spec is read once per connection."""
        dests = [change.dest for change in self.ctx.changes or []]
        if not dests:  # before preflight (a restart alone has no dest to lose)
            return []
        if self.ctx.transport not in _specs:
            _specs[self.ctx.transport] = pod_spec(self.ctx.transport, self.pod)
        paths = [posixpath.join(self.ctx.repo, dest) for dest in dests]
        placed = placements(_specs[self.ctx.transport], self.pod.container, paths)
        return [(dest, f"{KEEPS.get(kind, LAYER)}" + (f" (volume {volume!r})" if volume else ""),
                 volume is not None and kind in KEPT[self.way])
                for dest, (volume, kind) in zip(dests, placed, strict=True)]

    def placement_actions(self) -> list[Action]:
        """For the plan: one line per dest, where it lives and what this restart does to it."""
        return [Action(f"{dest}: {where}: {'kept' if kept else 'LOST'} by the restart of {self.name} ({self.anew()})",
                       key=f"{self.name}.keeps.{dest}") for dest, where, kept in self.places()]

    def anew(self) -> str:
        return "a new pod from its controller" if self.way == "pod" else "a new container from the image"

    def refusals(self) -> list[str]:
        lost = [f"{dest} ({where})" for dest, where, kept in self.places() if not kept]
        if lost:
            raise ConfigError(f"service {self.name} restarts {self.pod.where()} as {self.anew()}, which throws away "
                              f"{', '.join(lost)}; nothing was changed. To keep the fix: {WAYS}")
        status = self.read(self.host_side)
        if status is None:
            return []
        if self.way == "pod" and not any(kind in KEEPS_NAMES for _, kind, _ in status.owners):
            owned = ", ".join(f"{kind}/{name}" for _, kind, name in status.owners) or "no controller"
            return [f"pod {self.pod.name} has {owned}: deleting it would not bring it back under its name (only a "
                    f"{' or a '.join(KEEPS_NAMES)} does); restart its container instead (kubernetes: container)"]
        return [problem for problem in [self.rollout(status)] if problem]

    def rollout(self, status: Status) -> str | None:
        """The owner's own rollout in progress (its updated or ready replicas short of its replicas), or None."""
        for api_version, kind, name in status.owners:
            group = api_version.rpartition("/")[0]
            resource = f"{kind.lower()}.{group}" if group else kind.lower()
            done = self.host_side.transport.run([*kubectl_argv(self.pod), "get", resource, name, "-o", "json"],
                                                timeout=PROBE_TIMEOUT_S * 6)
            if done.exit_code != 0:
                return f"the pod's owner {kind}/{name} could not be read: {done.stderr.decode(errors='replace')[-300:]}"
            owner = json.loads(done.stdout)
            want, status_of = owner.get("spec", {}).get("replicas", 1), owner.get("status", {})
            updated, ready = status_of.get("updatedReplicas", 0), status_of.get("readyReplicas", 0)
            if updated < want or ready < want:
                return (f"the pod's owner {kind}/{name} is mid-rollout ({updated} updated, {ready} ready of {want} "
                        "replicas): deployer does not restart a pod under a rollout; wait for it to finish")
        return None

    # -- the actions, in the order the step does them ----------------------------------------------------------

    def observe_actions(self) -> list[Action]:
        return [self.status, *self.placement_actions(), *([] if self.health is None else [self.health])]

    def stop_actions(self) -> list[Action]:
        return [self.kill]

    def free_actions(self) -> list[Action]:
        return []  # its health URL is asked from inside: nothing there to ask while it is gone

    def start_actions(self) -> list[Action]:
        return [self.up, self.reopen, self.main, *([] if self.up_health is None else [self.up_health]), self.ready,
                self.annotate]

    def tail_label(self) -> str:
        return f"{self.name}'s container output (kubectl logs, then --previous), its last 40 lines each"

    def read_log(self, cursor: str, *, whole: bool, lines: int | None, most: int) -> Action:
        return self._log

    def log_source(self, whole: bool) -> str:
        return f"container {self.pod.container}'s output (kubectl logs)"

    def log_tool(self) -> str:
        return "kubectl"

    # -- doing them ------------------------------------------------------------------------------------------

    def read(self, side: Context, action: Action | None = None) -> Status | None:
        return Status.of(side.act(action or self.status, timeout=PROBE_TIMEOUT_S * 6), self.pod.container)

    def observe(self, health: bool = True) -> Observed:
        self.seen = self.read(self.host_side)
        answer = None
        if health and self.health is not None:
            answer = getattr(self.ctx.act(self.health, timeout=PROBE_TIMEOUT_S), "status", None) == 200
        if self.seen is None or not self.seen.running:
            return Observed(None, answer)
        return Observed(self.seen.identity, answer)

    def stop(self, pid: int | None) -> str:
        seen = self.seen
        if pid is None or seen is None:
            return "the container is not running: nothing to stop"
        if problem := self.rollout(seen):  # again, right before the restart: a rollout may have begun since
            raise self.not_started(problem)
        self.host_side.act(self.kill, timeout=PROBE_TIMEOUT_S * 6)  # its exec may end with the container: judged below
        self.ctx.emit("agent_ended", why=f"{self.kill.what} ended the agent in it")
        self.started = self.new_container(seen, self.service.stop_grace_s + STOP_SLACK_S)
        if self.way == "pod":
            return f"pod {self.pod.name} recreated by its controller: uid {seen.uid} -> {self.started.uid}"
        return (f"container {self.pod.container} restarted by the kubelet: restartCount {seen.restarts} -> "
                f"{self.started.restarts}, containerID {seen.container_id[-12:]} -> {self.started.container_id[-12:]}")

    def new_container(self, old: Status, budget: float) -> Status:
        """The kubelet's new container, running: restartCount up and a new containerID, within budget seconds."""
        began = time.monotonic()
        with self.host_side.poll(PROBE_TIMEOUT_S * 6) as poll:
            while True:
                now = Status.of(poll.round([(self.up, NOTHING)])[0], self.pod.container)
                if now is not None and self.way == "container" and now.uid != old.uid:
                    raise self.fail(f"pod {self.pod.name} was recreated (uid {old.uid} -> {now.uid}), not restarted")
                if now is not None and now.running and now.container_id != old.container_id and (
                        now.uid != old.uid if self.way == "pod" else now.restarts > old.restarts):
                    return now
                if self.start_waited_out(began, budget):
                    if self.way == "pod":
                        raise self.fail(f"no new pod {self.pod.name} ran within {budget:g}s of its delete")
                    raise self.fail(f"container {self.pod.container} was not restarted within {budget:g}s of TERM "
                                    "to its main process (PID 1 ignores TERM without a handler of its own: run the "
                                    "server under an init such as tini, or as a `start:` service under a launcher)")

    def answers_after_stop(self) -> bool:
        return False

    def start(self) -> int:
        assert self.started is not None, "stop() waited for the new container"
        self.ctx.transport.reopen()  # raises what the new exec met (the container ended again at once)
        self.ctx.log_action(self.reopen, NOTHING, None)
        try:
            self.wait_up(self.main, NOTHING)  # from inside: its main process and health; shows the phases
        except AgentLost as lost:
            raise self.fail(f"container {self.pod.container} stopped during start-up ({lost})") from None
        self.wait_ready()
        self.host_side.act(self.annotate, timeout=PROBE_TIMEOUT_S * 6)
        new = self.started
        # What the run leaves now is this container (or pod): `check` and `runs show` compare with it (run/pods.py).
        self.ctx.emit("pod", **identity(self.pod, new.uid, new.container_id, new.restarts, new.node))
        return new.identity

    def wait_ready(self) -> None:
        """The kubelet's own word: the new container is Ready (its readiness probe, if it has one, passed)."""
        budget = self.service.health_timeout_s
        began = time.monotonic()
        with self.host_side.poll(PROBE_TIMEOUT_S * 6) as poll:
            while (now := Status.of(poll.round([(self.ready, NOTHING)])[0], self.pod.container)) is None \
                    or not now.ready:
                if self.start_waited_out(began, budget):
                    raise self.fail(f"container {self.pod.container} was not Ready within {budget:g}s")

    def probed_pid(self, probed: object, bound: Bound) -> int | None:
        return None if self.started is None else self.started.identity

    def alive(self, probed: object, started: str | None) -> bool:
        return isinstance(probed, bytes) and runs(probed)

    def still_runs(self, pid: int) -> bool:
        now = self.read(self.host_side, self.still)
        return now is not None and self.started is not None and now.running and \
            (now.uid, now.container_id) == (self.started.uid, self.started.container_id)
