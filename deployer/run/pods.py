"""Which pod, and which container of it, a run's files went into, and whether they are still there.

A run on a `transport: kubernetes` host records in its `pod` event the pod's uid, its container's containerID and
restartCount, and where each dest lives in the pod (the pod spec's volumes, as transport/kubernetes.py places them):
read by `kubectl get pod -o json` where kubectl runs, on a thread started when preflight sends its reads, so it
overlaps their round trip. A restart of the run's own that makes a new container or a new pod (`kubernetes:
container`, `kubernetes: pod`) records the new identity in another `pod` event: the last one is what the run left.

A later look (`check`, `runs show`) reads the pod now and compares. Another uid is another pod: only a hostPath (on
the same node) or a PVC kept the files. The same uid with another containerID is a new container from the image:
the files in the container's own layer are gone, every volume's stay. What the target said is input, and so is a
log: both are validated before they are compared or shown.

`persist: required` reads the same placement: a dest a new pod would not have (the container's layer, an emptyDir)
refuses the run before anything changes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.config import yamlsrc
from deployer.config.models import KubernetesHost
from deployer.errors import ConfigError, DeployerError
from deployer.run.mounts import Inspection, newest_runs_on
from deployer.runlog import Run
from deployer.text import visible
from deployer.transport.kubernetes import (
    CONTAINER_ID,
    KEEPS,
    LAYER,
    NODE,
    UID,
    PodSeen,
    get_pod_argv,
    placements,
)

if TYPE_CHECKING:
    from deployer.steps.context import Context
    from deployer.transport.base import Transport

# What a new pod keeps of its volumes' kinds (a hostPath: on the same node); a new container keeps an emptyDir too.
KEPT_BY_POD = ("hostPath", "persistentVolumeClaim")
KEPT_BY_CONTAINER = ("emptyDir", *KEPT_BY_POD)
KINDS = (*KEEPS, "layer")


@dataclass(frozen=True)
class Left:
    """What a run left in a pod, as its log says (validated): the pod, its uid, the container's containerID and
    restartCount after the run's own restart, and each dest's volume ("": the container's layer) and its kind."""

    run_id: str
    pod: str
    container: str
    uid: str
    container_id: str
    restarts: int
    node: str
    files: dict[str, tuple[str, str]]

    def judge(self, now: PodSeen) -> tuple[bool, str]:
        """Whether the run's files are all still there (False: some are gone), and what to tell about it."""
        if now.uid != self.uid:
            moved = bool(self.node) and bool(now.node) and now.node != self.node
            lost = self._kept_not_by(("persistentVolumeClaim",) if moved else KEPT_BY_POD)
            said = (f"pod {self.pod} was recreated since run {self.run_id} (uid {self.uid} then, {now.uid} now"
                    f"{f'; on node {now.node}, not {self.node}' if moved else ''}): "
                    + ("its hot-fix is gone unless its dests are on a PVC or a hostPath (on the same node)" if lost
                       else "its files are on volumes a new pod keeps"))
        elif now.container_id != self.container_id:
            lost = self._kept_not_by(KEPT_BY_CONTAINER)
            said = (f"container {self.container} of pod {self.pod} restarted since run {self.run_id} (restartCount "
                    f"{self.restarts} then, {now.restarts} now: a new container from the image)")
            if lost:
                said += ": the hot-fix in the layer is gone"
        else:
            return True, (f"pod {self.pod}, container {self.container}: the ones run {self.run_id} left (uid "
                          f"{self.uid}, restartCount {self.restarts}): its files are there")
        kept = sorted(set(self.files) - set(lost))
        if lost:
            said += f"; lost: {', '.join(self._where(dest) for dest in lost)}"
        if kept:
            said += f"; kept: {', '.join(self._where(dest) for dest in kept)}"
        return not lost, said

    def _kept_not_by(self, kinds: tuple[str, ...]) -> list[str]:
        return sorted(dest for dest, (_, kind) in self.files.items() if kind not in kinds)

    def _where(self, dest: str) -> str:
        volume, kind = self.files[dest]
        return f"{dest} ({'the container layer' if kind == 'layer' else f'{kind} {volume!r}'})"

    def shown(self) -> list[str]:
        """For `runs show`: the pod the run left and where each of its files lives there."""
        return [f"in pod {self.pod} (uid {self.uid}), container {self.container} (restartCount {self.restarts}, "
                f"containerID {self.container_id.rpartition('/')[2][:12] or '-'}):",
                *(f"  {dest}: {KEEPS.get(kind, LAYER)}" + (f" (volume {volume!r})" if volume else "")
                  for dest, (volume, kind) in sorted(self.files.items()))]


_started: weakref.WeakKeyDictionary[Transport, Inspection[PodSeen]] = weakref.WeakKeyDictionary()


def reading(ctx: Context) -> Inspection[PodSeen] | None:
    """The pod's read for this connection (started on the first call), or None: not a pod's host."""
    host = ctx.host
    if not isinstance(host, KubernetesHost) or host.pod.name is None:
        return None
    if ctx.transport not in _started:
        container = host.pod.container
        _started[ctx.transport] = Inspection(ctx.transport, get_pod_argv(host.pod),
                                             lambda out: PodSeen.parse(out, container), f"pod-{host.pod.name}")
    return _started[ctx.transport]


def placed_in_pod(ctx: Context, dests: list[str]) -> dict[str, Any] | None:
    """The pod the run ships into and where each dest lives there (None: not a pod's host), as the `pod` event
    records it."""
    started = reading(ctx)
    if started is None:
        return None
    assert isinstance(ctx.host, KubernetesHost)
    seen, pod = started.result(), ctx.host.pod
    placed = placements(seen.spec, pod.container, [ctx.in_repo(dest) for dest in dests])
    return {**seen.identity(pod), "files": {dest: {"volume": volume or "", "kind": kind}
                                            for dest, (volume, kind) in zip(dests, placed, strict=True)}}


def place_pod(ctx: Context, dests: list[str]) -> dict[str, Any] | None:
    """placed_in_pod, recorded in the run's `pod` event. A pod that cannot be read refuses the run only under
    `persist: required` (which needs the answer); otherwise the run goes on unrecorded (a chain sent whole reads it
    after its changes), and its `pod_unread` event says why."""
    try:
        placed = placed_in_pod(ctx, dests)
    except DeployerError as exc:
        if ctx.playbook.model.persist == "required":
            raise
        ctx.emit("pod_unread", error=str(exc))
        return None
    if placed is not None:
        ctx.emit("pod", **placed)
    return placed


def unkept(placed: dict[str, Any]) -> list[str]:
    """Each dest a new pod would not have (the container's layer, an emptyDir), with where it lives."""
    return [f"{dest} ({KEEPS.get(place['kind'], LAYER)})" for dest, place in placed["files"].items()
            if place["kind"] not in KEPT_BY_POD]


def refuse_unkept(ctx: Context, placed: dict[str, Any] | None) -> None:
    """`persist: required`: a dest a new pod would not have refuses the run before any change, exit 2."""
    if placed is None or ctx.playbook.model.persist != "required" or not (lost := unkept(placed)):
        return
    where = yamlsrc.load(ctx.playbook.path).mark(("persist",))
    raise ConfigError(f"{where}: persist: required, but a new pod {placed['pod']} would not have {', '.join(lost)}; "
                      f"nothing was changed. {KEEP}")


# What keeps a file through a new pod, said where persist: required refuses one.
KEEP = ("Put the repo (or those files) on a PVC or a hostPath volume of the pod, make the fix part of the image "
        "(deployer bake RUN_ID after a run), or drop persist: required")


def recorded(run: Run) -> Left | None:
    """What the run left in a pod, if its log says so in the shape place_pod and the restart write (a log is
    input too: anything else is None)."""
    events = run.all("pod")
    placed = next((event for event in events if isinstance(event.get("files"), dict)), None)
    if placed is None:
        return None
    last = events[-1]
    uid, container_id, restarts = last.get("uid"), last.get("container_id"), last.get("restart_count")
    node = last.get("node", "")
    if not (isinstance(uid, str) and UID.match(uid) and isinstance(container_id, str)
            and isinstance(node, str) and (node == "" or NODE.match(node))
            and (container_id == "" or CONTAINER_ID.match(container_id)) and type(restarts) is int
            and last.get("pod") == placed.get("pod") and isinstance(placed.get("pod"), str)
            and isinstance(placed.get("container"), str)):
        return None
    files: dict[str, tuple[str, str]] = {}
    for dest, place in placed["files"].items():
        if not (isinstance(place, dict) and isinstance(place.get("volume"), str) and place.get("kind") in KINDS):
            return None
        files[visible(str(dest), multiline=False)] = (visible(place["volume"], multiline=False), str(place["kind"]))
    return Left(run.run_id, visible(placed["pod"], multiline=False), visible(placed["container"], multiline=False),
                uid, container_id, restarts, node, files)


def _stands(run: Run) -> bool:
    """An apply whose commit is on the target still (not rolled back since)."""
    from deployer.run.shown import shown_state
    from deployer.runstate import Phase

    return run.start.get("kind", "apply") == "apply" and bool(run.git.get("after")) \
        and shown_state(run) != Phase.rolled_back.value \
        and not any(link.get("status") == "successful" for link in run.all("rolled_back_by"))


def last_left(runs_dir: Path, host: str, pod: str) -> Left | None:
    """What the host's newest apply that still stands left in this pod (None: no such run among the newest)."""
    for run in newest_runs_on(runs_dir, host):
        if _stands(run) and (left := recorded(run)) is not None and left.pod == pod:
            return left
    return None
