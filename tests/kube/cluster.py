"""The stand-in cluster's state: pods and owners, resourceVersions and watch events, the controllers, authorization.

What the controllers do is in Cluster's methods: a deleted pod's owner makes a new one (a new uid; a ReplicaSet's
at once under a new name, a StatefulSet's and a LeaderWorkerSet's under the same name once the old is gone); a
LeaderWorkerSet with recreate_group recreates a pod's whole group on a deletion or a container restart.
"""

from __future__ import annotations

import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .kubelet import Kubelet
from .objects import KEEPS_NAMES, OWNER_KINDS, ContainerState, Json, Owner, Pod, PodSpec, timestamp

GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
ANONYMOUS = "system:anonymous"


class ApiError(Exception):
    """A failure the API answers with a Status document."""

    def __init__(self, code: int, reason: str, message: str, details: Json | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Json:
        status: Json = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            status["details"] = self.details
        return status


def not_found(name: str, plural: str = "pods") -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


@dataclass(frozen=True)
class Rule:
    """A denial: `user` may not `verb` the `resource` (e.g. "create", "pods/exec"); user None: anyone."""

    verb: str
    resource: str
    user: str | None = None


class Cluster:
    """The objects, their resourceVersions and watch events, the controllers and the kubelet, under one lock."""

    def __init__(self, root: Path, podman_env: dict[str, str]) -> None:
        self.root = root
        self.lock = threading.RLock()
        self.changes = threading.Condition(self.lock)
        root.mkdir(parents=True, exist_ok=True)
        self.kubelet = Kubelet(podman_env, f"kube-standin-{secrets.token_hex(4)}", root, self.lock, self._changed,
                               self._exited)
        self.pods: dict[tuple[str, str], Pod] = {}
        self.owners: dict[tuple[str, str, str], Owner] = {}  # (namespace, kind, name)
        self.namespaces: set[str] = {"default"}
        self.denied: list[Rule] = []
        self.user = ANONYMOUS  # who every request is taken to come from (no authentication here)
        self.requests: list[str] = []  # "METHOD path" of every request, in order (what kubectl asked)
        self.events: list[tuple[int, str, Pod, Json]] = []
        self.version = 1

    # --- what tests call -------------------------------------------------------------------------------------

    def add_owner(self, owner: Owner) -> Owner:
        with self.lock:
            self.namespaces.add(owner.namespace)
            self.owners[(owner.namespace, owner.kind, owner.name)] = owner
            self.version += 1
        return owner

    def create(self, spec: PodSpec, namespace: str) -> Pod:
        """A new pod (its containers start in the background; poll its status for Running)."""
        with self.lock:
            self.namespaces.add(namespace)
            owner = self.owners[(namespace, *self._owner_key(spec.owner))] if spec.owner else None
            if (namespace, spec.name) in self.pods:
                raise ApiError(409, "AlreadyExists", f'pods "{spec.name}" already exists')
            pod = Pod(spec, spec.name, namespace, owner, labels=dict(spec.labels),
                      annotations=dict(spec.annotations))
            pod.containers = {container.name: ContainerState(container) for container in spec.containers}
            for volume in spec.volumes:
                if volume.kind == "emptyDir":
                    pod.volume_dirs[volume.name] = self.root / "pods" / pod.uid / volume.name
                elif volume.kind == "hostPath":
                    pod.volume_dirs[volume.name] = Path(volume.source)
                else:
                    pod.volume_dirs[volume.name] = self.root / "claims" / namespace / volume.source
                pod.volume_dirs[volume.name].mkdir(parents=True, exist_ok=True)
            self.pods[(namespace, pod.name)] = pod
            self.record(pod, "ADDED")
        self.kubelet.start(pod)
        return pod

    def delete(self, pod: Pod, grace_s: int | None = None) -> Json:
        """Graceful deletion, as the API does it: marked now, gone once its containers stopped."""
        grace = pod.spec.grace_s if grace_s is None else grace_s
        with self.lock:
            if pod.deletion is None:
                pod.deletion = timestamp()
                pod.spec = replace(pod.spec, grace_s=grace)
                self.record(pod, "MODIFIED")
                threading.Thread(target=self._finish_delete, args=(pod, grace), daemon=True,
                                 name=f"delete {pod.name}").start()
                if pod.owner is not None and pod.owner.kind not in KEEPS_NAMES:
                    self._replace(pod)  # a ReplicaSet does not count a terminating pod: its successor starts now
            return pod.to_json()

    def forbid(self, verb: str, resource: str, user: str | None = None) -> None:
        with self.lock:
            self.denied.append(Rule(verb, resource, user))

    def pod(self, name: str, namespace: str) -> Pod:
        with self.lock:
            found = self.pods.get((namespace, name))
            if found is None:
                raise not_found(name)
            return found

    def shutdown(self) -> None:
        """Every container gone, whatever state the pods were in."""
        self.kubelet.remove_all()

    # --- the controllers ---------------------------------------------------------------------------------------

    @staticmethod
    def _owner_key(name: str) -> tuple[str, str]:
        kind, _, owner_name = name.partition("/")
        if kind not in OWNER_KINDS or not owner_name:
            raise ValueError(f"an owner is named KIND/NAME (KIND one of {sorted(OWNER_KINDS)}), not {name!r}")
        return kind, owner_name

    def _finish_delete(self, pod: Pod, grace: int) -> None:
        self.kubelet.terminate(pod, grace)
        for volume in pod.spec.volumes:
            if volume.kind == "emptyDir":
                shutil.rmtree(pod.volume_dirs[volume.name], ignore_errors=True)
        with self.lock:
            if self.pods.get((pod.namespace, pod.name)) is pod:
                del self.pods[(pod.namespace, pod.name)]
            self.record(pod, "DELETED")
            if pod.owner is not None and pod.owner.kind in KEEPS_NAMES and not self.kubelet.stopping:
                self._replace(pod)

    def _replace(self, old: Pod) -> None:
        """The owner's new pod for `old`: the template's labels and annotations (not what was patched on the old
        one), a new uid, a new name unless the owner keeps names."""
        assert old.owner is not None
        if self.kubelet.stopping:
            return
        name = old.name if old.owner.kind in KEEPS_NAMES else f"{old.owner.name}-{secrets.token_hex(3)[:5]}"
        threading.Thread(target=self.create, args=(replace(old.spec, name=name), old.namespace), daemon=True,
                         name=f"recreate {name}").start()

    def _exited(self, pod: Pod) -> None:
        """A container of `pod` exited (the kubelet restarts it unless the owner recreates the group)."""
        owner = pod.owner
        if owner is None or not owner.recreate_group:
            return
        with self.lock:
            group = [other for other in self.pods.values()
                     if other.owner is owner and other.labels.get(GROUP_INDEX) == pod.labels.get(GROUP_INDEX)]
        for member in group:
            self.delete(member)

    # --- resourceVersions and watch -----------------------------------------------------------------------------

    def _changed(self, pod: Pod) -> None:
        self.record(pod, "MODIFIED")

    def record(self, pod: Pod, kind: str) -> None:
        with self.lock:
            self.version += 1
            pod.resource_version = self.version
            self.events.append((self.version, kind, pod, pod.to_json()))
            self.changes.notify_all()

    def watch(self, since: int, keep: Any, timeout_s: float) -> Iterator[tuple[str, Json]]:
        """Events after resourceVersion `since` whose pod `keep` accepts, until timeout_s passes."""
        deadline = time.monotonic() + timeout_s
        seen = since
        while True:
            with self.lock:
                fresh = [event for event in self.events if event[0] > seen]
                if not fresh:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self.changes.wait(timeout=min(left, 1.0))
                    continue
            for version, kind, pod, document in fresh:
                seen = version
                if keep(pod):
                    yield kind, document

    # --- authorization ----------------------------------------------------------------------------------------

    def authorize(self, user: str, verb: str, resource: str, namespace: str, name: str | None,
                  api_group: str = "") -> None:
        with self.lock:
            denied = any(rule.verb == verb and rule.resource == resource and rule.user in (None, user)
                         for rule in self.denied)
        if not denied:
            return
        plural = resource.split("/")[0]
        what = f'{plural} "{name}"' if name else plural
        raise ApiError(403, "Forbidden", f'{what} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
                       f'in API group "{api_group}" in the namespace "{namespace}"',
                       {"name": name, "kind": plural} if name else {"kind": plural})


# --- selectors -------------------------------------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\((.*)\)\s*$")


def label_selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes' label selector grammar: k=v, k==v, k!=v, k in (a,b), k notin (a,b), k, !k; comma is AND."""
    for term in re.split(r",(?![^()]*\))", selector):
        term = term.strip()
        if not term:
            continue
        in_set = _SET_TERM.match(term)
        if in_set:
            key, op, values = in_set.groups()
            members = {value.strip() for value in values.split(",")}
            if (labels.get(key) in members) != (op == "in") or (op == "in" and key not in labels):
                return False
        elif "!=" in term:
            key, value = (part.strip() for part in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (part.strip() for part in re.split("==?", term, maxsplit=1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_selector_matches(selector: str, pod: Pod) -> bool:
    fields = {"metadata.name": pod.name, "metadata.namespace": pod.namespace, "status.phase": pod.phase()}
    for term in filter(None, (part.strip() for part in selector.split(","))):
        negate = "!=" in term
        key, value = (part.strip() for part in re.split("!=|==?", term, maxsplit=1))
        if key not in fields:
            raise ApiError(400, "BadRequest", f'"{key}" is not a known field selector: only "metadata.name", '
                           '"metadata.namespace", "status.phase"')
        if (fields[key] == value) == negate:
            return False
    return True
