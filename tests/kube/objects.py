"""The stand-in cluster's objects: what a test asks for (specs) and what the API server serves (live records).

A pod's JSON is built from its live record on every read, so `status` is always what the kubelet
(kubelet.py) last saw: Kubernetes' field names and shapes, only the fields kubectl and deployer read.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# The "image" every container runs: this machine's root as a copy-on-write overlay (podman --rootfs /:O), plus
# the ContainerSpec's image_files. Its name is only shown; its content is the same for every container.
IMAGE = "standin.local/host-rootfs:latest"
IMAGE_ID = "standin.local/host-rootfs@sha256:" + "0" * 64

Json = dict[str, Any]


def timestamp() -> str:
    """RFC 3339 to the second, as Kubernetes writes times: two restarts within a second look the same here too."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class Probe:
    """An httpGet readiness probe on the host's loopback (the pods share the host's network)."""

    port: int
    path: str = "/"

    def passes(self) -> bool:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with direct.open(f"http://127.0.0.1:{self.port}{self.path}", timeout=1) as reply:
                return bool(200 <= reply.status < 400)
        except OSError:
            return False


@dataclass(frozen=True)
class Volume:
    """A pod volume: an emptyDir lives as long as the pod (a fresh empty dir for a new pod), a hostPath is the
    host dir `source`, a persistentVolumeClaim is the claim `source`'s dir, kept by the server across pods."""

    name: str
    kind: Literal["emptyDir", "hostPath", "persistentVolumeClaim"] = "emptyDir"
    source: str = ""

    def to_json(self) -> Json:
        if self.kind == "emptyDir":
            return {"name": self.name, "emptyDir": {}}
        if self.kind == "hostPath":
            return {"name": self.name, "hostPath": {"path": self.source, "type": "Directory"}}
        return {"name": self.name, "persistentVolumeClaim": {"claimName": self.source}}


@dataclass(frozen=True)
class Container:
    """One container of a pod. `mounts`: volume name -> mountPath. `image_files`: a path in the container ->
    a host dir the image holds there (the image's own files, e.g. an editable checkout: writable, and the writes
    go to the container's layer like any other, so a new container starts from the dir's content again)."""

    name: str
    command: tuple[str, ...] = ("sleep", "infinity")
    mounts: Mapping[str, str] = field(default_factory=dict)
    image_files: Mapping[str, Path] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    readiness: Probe | None = None

    def to_json(self) -> Json:
        spec: Json = {"name": self.name, "image": IMAGE, "command": list(self.command),
                      "volumeMounts": [{"name": name, "mountPath": path} for name, path in self.mounts.items()],
                      "env": [{"name": key, "value": value} for key, value in self.env.items()],
                      "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"}
        if self.readiness is not None:
            spec["readinessProbe"] = {"httpGet": {"port": self.readiness.port, "path": self.readiness.path},
                                      "periodSeconds": 1}
        return spec


@dataclass(frozen=True)
class PodSpec:
    """What a test asks for; an owner's template too (its replacement pods are made from it)."""

    name: str
    containers: tuple[Container, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    volumes: tuple[Volume, ...] = ()
    owner: str | None = None  # the name of an Owner in the same namespace
    grace_s: int = 30  # terminationGracePeriodSeconds


# kind -> (apiVersion, plural) of the controllers a pod's ownerReferences may name.
OWNER_KINDS = {
    "ReplicaSet": ("apps/v1", "replicasets"),
    "StatefulSet": ("apps/v1", "statefulsets"),
    "Deployment": ("apps/v1", "deployments"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
}
# A StatefulSet (and a LeaderWorkerSet, whose pods a StatefulSet makes) recreates a pod under the same name,
# only after the old one is gone; a ReplicaSet makes one with a new generated name at once.
KEEPS_NAMES = {"StatefulSet", "LeaderWorkerSet"}


@dataclass
class Owner:
    """A controller record: it recreates its deleted pods (controller.py) and reports a rollout as a test sets it.

    `recreate_group`: LeaderWorkerSet's default RestartPolicy RecreateGroupOnPodRestart: a deleted pod, or a
    restarted container, in a group (label leaderworkerset.sigs.k8s.io/group-index) recreates the whole group."""

    kind: str
    name: str
    namespace: str
    replicas: int = 1
    updated_replicas: int | None = None  # None: settled (= replicas)
    ready_replicas: int | None = None
    recreate_group: bool = False
    generation: int = 1
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def api_version(self) -> str:
        return OWNER_KINDS[self.kind][0]

    def reference(self) -> Json:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}

    def to_json(self, resource_version: int) -> Json:
        updated = self.replicas if self.updated_replicas is None else self.updated_replicas
        ready = self.replicas if self.ready_replicas is None else self.ready_replicas
        return {"apiVersion": self.api_version, "kind": self.kind,
                "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                             "generation": self.generation, "resourceVersion": str(resource_version)},
                "spec": {"replicas": self.replicas},
                "status": {"observedGeneration": self.generation, "replicas": self.replicas,
                           "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready,
                           "currentReplicas": updated}}


@dataclass
class ContainerState:
    """What the kubelet knows of one container of a pod; changed under the server's lock."""

    spec: Container
    restart_count: int = 0
    podman_name: str = ""
    container_id: str = ""  # podman's id of the container running now ("" while none runs)
    pid: int = 0  # its main process, in the host's PID namespace
    started_at: str = ""
    waiting: str = "ContainerCreating"  # the reason while none runs
    last_terminated: Json | None = None

    @property
    def running(self) -> bool:
        return bool(self.container_id)

    def ready(self) -> bool:
        return self.running and (self.spec.readiness is None or self.spec.readiness.passes())

    def to_json(self) -> Json:
        status: Json = {"name": self.spec.name, "image": IMAGE, "imageID": IMAGE_ID,
                        "restartCount": self.restart_count, "ready": self.ready(), "started": self.running}
        if self.running:
            status["containerID"] = f"podman://{self.container_id}"
            status["state"] = {"running": {"startedAt": self.started_at}}
        else:
            reason, _, message = self.waiting.partition(": ")
            status["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        status["lastState"] = {"terminated": self.last_terminated} if self.last_terminated else {}
        return status


@dataclass
class Pod:
    """A live pod: its own name and uid (a replacement has others), labels and annotations PATCH changes."""

    spec: PodSpec
    name: str
    namespace: str
    owner: Owner | None
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    created: str = field(default_factory=timestamp)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    containers: dict[str, ContainerState] = field(default_factory=dict)
    volume_dirs: dict[str, Path] = field(default_factory=dict)  # volume name -> the host dir mounted
    deletion: str | None = None  # deletionTimestamp once DELETE came
    resource_version: int = 0

    def phase(self) -> str:
        if all(state.running or state.restart_count for state in self.containers.values()):
            return "Running"
        return "Pending"

    def to_json(self) -> Json:
        ready = all(state.ready() for state in self.containers.values())
        metadata: Json = {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                          "resourceVersion": str(self.resource_version), "creationTimestamp": self.created,
                          "labels": dict(self.labels), "annotations": dict(self.annotations)}
        if self.owner is not None:
            metadata["ownerReferences"] = [self.owner.reference()]
            if self.owner.kind not in KEEPS_NAMES:
                metadata["generateName"] = f"{self.owner.name}-"
        if self.deletion is not None:
            metadata["deletionTimestamp"] = self.deletion
            metadata["deletionGracePeriodSeconds"] = self.spec.grace_s
        conditions = [{"type": kind, "status": "True" if ok else "False", "lastTransitionTime": self.created}
                      for kind, ok in (("PodScheduled", True), ("Initialized", True), ("ContainersReady", ready),
                                       ("Ready", ready))]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                "spec": {"containers": [state.spec.to_json() for state in self.containers.values()],
                         "volumes": [volume.to_json() for volume in self.spec.volumes],
                         "restartPolicy": "Always", "nodeName": "standin-node", "hostNetwork": True,
                         "terminationGracePeriodSeconds": self.spec.grace_s},
                "status": {"phase": self.phase(), "conditions": conditions, "hostIP": "127.0.0.1",
                           "podIP": "127.0.0.1", "startTime": self.created,
                           "containerStatuses": [state.to_json() for state in self.containers.values()]}}


def dumps(document: Json) -> bytes:
    return json.dumps(document).encode()
