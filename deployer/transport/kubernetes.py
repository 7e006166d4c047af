"""The `kubernetes` target kind: the agent runs in a pod's container as `kubectl exec -i POD -c CONTAINER -- <python>`.

One pipe, the same protocol: every step, the lock and the intent record (in the container's repo) work unchanged.
kubectl runs on this machine (a local transport around it) or on a bastion over SSH (the host's `via:`, an ssh
host of the inventory): the exec is a `Within` on that transport, as a container's `<engine> exec -i` is
(transport/container.py), so its pipe is the transport's own.

No probe before the exec: kubectl's own failure (no such context, an API server not reached or refusing our
credentials, RBAC forbids pods/exec, no such pod or namespace, a container not running or not in the pod, no kubectl
at all) shows as the exec ending before the agent said anything, and its stderr is translated here into a sentence
naming the pod, its container, its namespace and its context, followed by kubectl's own last lines. The agent's
start fails with it (AgentLost: exit 4), in `check` as in `apply`.

The pod's loopback is its own: what this machine sends there (a storm) goes through `kubectl port-forward`, started
where kubectl runs and ended with the connection (PodPorts, the transport's `ports`).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.agent.pipe import Pipe
from deployer.command import quote
from deployer.config.models import KubernetesHost
from deployer.config.podunits import expand_pod_units, selectors_named
from deployer.errors import AgentLost, ConfigError, DeployerError, StepFailed, TransportError
from deployer.text import visible
from deployer.transport.base import Transport
from deployer.transport.container import ContainerPipe, beside_container
from deployer.transport.kinds import Row
from deployer.transport.local import LocalTransport
from deployer.transport.pipes import shell_found_no

if TYPE_CHECKING:
    from deployer.config.models import Host, Inventory, Pod
    from deployer.transport.kinds import Emitter

# What the kubelet says (through kubectl) of a container it runs no process in: not started yet, crash-looping,
# or (a runtime's words when the exec raced its exit) stopped.
NOT_RUNNING = ("container not found", "not running", "containercreating", "cannot exec in a stopped state",
               "can only create exec sessions on running containers", "container state improper")
SELECTED_S = 60.0  # for `kubectl get pods -l`: an API server that does not answer by then is not reached


def open_host(name: str, host: KubernetesHost, bus: Emitter, accept_new_host_key: bool) -> Transport:
    """The registry's opener for `transport: kubernetes` (transport/kinds.py): the transport kubectl runs over,
    with the pod's exec as where its agent runs."""
    pod = host.pod
    if pod.name is None:
        raise ConfigError(f"{name}: pod.selector {pod.selector!r} names pods, not one: a host of a selector is "
                          "opened as one host per pod (HOST.POD)")
    transport = kubectl_side(name, host, bus, accept_new_host_key, python=host.python)
    transport.run_within(KubectlExec(pod))
    # Over SSH, kubectl's own local port is the bastion's, reached through the SSH connection's forward.
    transport.ports = PodPorts(transport, pod, transport.forward if host.via is not None else None)
    transport.info.extra["via"] = transport.info.kind  # where kubectl ran: local, or ssh to the bastion
    transport.info.kind = "kubernetes"
    return transport


def kubectl_side(name: str, host: KubernetesHost, bus: Emitter, accept_new_host_key: bool, *,
                 python: str) -> Transport:
    """The machine kubectl runs on: this one, or the host's bastion (its `via:`) over SSH."""
    bastion = host.via_host
    if bastion is None:
        return LocalTransport(name, python=python)
    from deployer.transport.ssh.params import SshParams  # the ssh kind's import (paramiko) only for a bastion
    from deployer.transport.ssh.transport import connect_host

    assert host.via is not None
    params = SshParams.of(host.via, bastion)
    # The agent's python is the pod's; no sudo on the bastion (its kubeconfig is the login's).
    return connect_host(name, SshParams(**{**params.document(), "python": python, "become": False}), bus,
                        accept_new_host_key)


def kubectl_argv(pod: Pod) -> list[str]:
    """kubectl with the pod's kubeconfig, context and namespace, before its verb."""
    return [pod.kubectl, *(["--kubeconfig", pod.kubeconfig] if pod.kubeconfig else []),
            *(["--context", pod.context] if pod.context else []), "--namespace", pod.namespace]


class KubectlExec:
    """`Within` for a pod's container: the agent is `kubectl exec -i POD -c CONTAINER -- <python> ...`."""

    def __init__(self, pod: Pod) -> None:
        assert pod.name is not None
        self.pod = pod

    def prefix(self) -> list[str]:
        # -i: stdin streams through (the agent's source, then the protocol); no -t: a tty would mangle the frames.
        assert self.pod.name is not None
        return [*kubectl_argv(self.pod), "exec", "-i", self.pod.name, "-c", self.pod.container, "--"]

    def facts(self) -> dict[str, str]:
        return {"pod": self.pod.name or "", "container": self.pod.container, "namespace": self.pod.namespace,
                "context": self.pod.context or "(current-context)"}

    def open(self, start: Callable[[Sequence[str]], Pipe], argv: Sequence[str], host: str) -> Pipe:
        try:
            pipe = start(argv)
        except TransportError as exc:  # kubectl could not be executed at all (this machine has none)
            raise AgentLost(f"{host}: {self.explain(str(exc))}") from None
        return ContainerPipe(pipe, self.explain)

    def explain(self, stderr: str) -> str:
        """What kubectl said went wrong before the agent ran, as a sentence naming the pod and where it is."""
        return kubectl_failure(self.pod, stderr)


FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")
# kubectl port-forward never reads its stdin, so it would outlive a deployer killed before its close (SIGKILL, a lost
# SSH link): a shell holds the pipe's stdin and kills it when that ends. The shell lets go of stdout and stderr, so
# they end with kubectl (its exit on a failed connection is seen).
TIED = ("sh", "-c", '"$@" & exec >/dev/null 2>&1; read -r _; kill "$!"', "port-forward")
FORWARD_S = 30.0  # for kubectl port-forward to say where it listens
FAILED_S = 5.0  # for kubectl port-forward to say why a connection through it failed (it then ends)


class PodPorts:
    """The pod's own loopback ports, reached from this machine: for each port, `kubectl port-forward pod/POD :PORT`
    where kubectl runs (on its own pipe: a session of its own here, an exec channel on the bastion), its local port
    read from its "Forwarding from 127.0.0.1:N -> PORT" line (on a bastion, N is reached through the SSH
    connection's forward). Each is ended with the connection, its process group killed, or by its shell when the
    pipe from deployer ends (TIED): none outlives the command."""

    def __init__(self, side: Transport, pod: Pod, tunnel: Callable[[int], int] | None) -> None:
        self.side = side  # where kubectl runs: its host_pipe starts kubectl there, beside the agent's exec
        self.pod = pod
        self.tunnel = tunnel
        self._lock = threading.Lock()
        self._open: dict[int, _PortForward] = {}  # by the pod's port
        self._closed = False

    def forward(self, remote_port: int, remote_host: str) -> int:
        if remote_host not in ("127.0.0.1", "localhost"):
            raise TransportError(f"{self.pod.where()}: kubectl port-forward reaches the pod's own ports, not "
                                 f"{remote_host}:{remote_port}")
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.pod.where()}: the connection is closed")
            if remote_port not in self._open:
                self._open[remote_port] = self._start(remote_port)
            return self._open[remote_port].local_port

    def said(self, local_port: int) -> str:
        """Why a connection to local_port failed, as kubectl says (it ends on a failed connection); "" if not."""
        with self._lock:
            found = next((each for each in self._open.values() if each.local_port == local_port), None)
        said = found.said() if found is not None else ""
        return f"{found.what} says: {said}" if found is not None and said else ""

    def close(self) -> None:
        with self._lock:
            self._closed = True
            forwards, self._open = list(self._open.values()), {}
        for each in forwards:
            each.pipe.close(kill=True)

    def _start(self, port: int) -> _PortForward:
        what = f"kubectl port-forward of port {port} of {self.pod.where()}"
        try:
            pipe = self.side.host_pipe([*TIED, *port_forward_argv(self.pod, port)])
        except TransportError as exc:
            raise TransportError(f"{what} could not start: {exc}") from None
        found = _PortForward(pipe, what)
        if not found.listening.wait(FORWARD_S) or found.remote_port is None:
            pipe.close(kill=True)
            said = found.said() or f"it said nothing in {FORWARD_S:g}s"
            raise TransportError(f"{what} failed: {said}")
        found.local_port = self.tunnel(found.remote_port) if self.tunnel is not None else found.remote_port
        return found


def port_forward_argv(pod: Pod, port: int) -> list[str]:
    """`kubectl port-forward pod/POD :PORT`: the pod's PORT on a free local port of the machine kubectl runs on."""
    assert pod.name is not None
    return [*kubectl_argv(pod), "port-forward", f"pod/{pod.name}", f":{port}"]


class _PortForward:
    """One kubectl port-forward: its output read to its end (it prints a line per connection), its local port."""

    def __init__(self, pipe: Pipe, what: str) -> None:
        self.pipe = pipe
        self.what = what
        self.remote_port: int | None = None  # where kubectl listens, on the machine it runs on
        self.local_port = 0
        self.listening = threading.Event()  # set at its Forwarding line, or at its end
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True, name="port-forward").start()

    def _read(self) -> None:
        seen = b""
        try:
            while chunk := self.pipe.read(65536):
                if self.remote_port is None:
                    seen += chunk
                    if found := FORWARDING.search(seen):
                        self.remote_port = int(found[1])
                        self.listening.set()
                        seen = b""
        except (OSError, EOFError, DeployerError):
            pass
        self.ended.set()
        self.listening.set()

    def said(self) -> str:
        self.ended.wait(FAILED_S)
        tail = visible(self.pipe.stderr_tail().strip(), multiline=False)[-500:]
        return tail if self.ended.is_set() or tail else ""


def kubectl_failure(pod: Pod, stderr: str, doing: str | None = None) -> str:
    """What kubectl said went wrong, as a sentence naming the pod and where it is, then kubectl's own lines (said).
    doing: the kubectl command that failed, when it was not the agent's exec (a listing, a read)."""
    where = pod_or_selector(pod)
    said = said_lines(stderr)
    low = stderr.lower()
    failed = f"{doing} failed" if doing is not None else "kubectl exec ended before the agent started"
    if shell_found_no(pod.kubectl, stderr) or ("no such file or directory" in low and pod.kubectl in stderr):
        return f"kubectl ({pod.kubectl}) is not installed where it runs, so {where} cannot be reached:\n{said}"
    if "context was not found" in low or ("context" in low and "does not exist" in low):
        return f"the kubeconfig has no context {pod.context!r} for {where}:\n{said}"
    if (server := api_server_failure(stderr)) is not None:
        return f"{failed}: {server}: {where}:\n{said}"
    if "forbidden" in low:
        return f"RBAC forbids it: {where}:\n{said}"
    if "namespaces" in low and "not found" in low:
        return f"no namespace {pod.namespace!r}: {where}:\n{said}"
    if "pods" in low and "not found" in low:
        return f"no such pod: {where}:\n{said}"
    if "is not valid for pod" in low:
        return f"the pod has no container {pod.container!r}: {where}:\n{said}"
    if any(marker in low for marker in NOT_RUNNING):
        return f"the container is not running: {where}:\n{said}"
    return f"{failed}: {where}:\n{said}"


def pod_or_selector(pod: Pod) -> str:
    """pod.where(), or for a selector's listing where it looks (a selector is no pod, nor has a container yet)."""
    if pod.name is not None:
        return pod.where()
    return f"selector {pod.selector!r} (namespace {pod.namespace!r}, context {pod.context or '(current-context)'!r})"


# kubectl's words when the API server is not reached, or refuses who we are, and what each means to an operator.
UNREACHED = (("unauthorized", "refuses our credentials (Unauthorized: the kubeconfig's token or certificate "
                               "expired or is wrong)"),
             ("must be logged in", "refuses our credentials (Unauthorized: the kubeconfig's token or certificate "
                                   "expired or is wrong)"),
             ("x509", "cannot be reached: its certificate is not trusted (x509)"),
             ("no such host", "cannot be reached: its host name does not resolve"),
             ("i/o timeout", "cannot be reached: it does not answer (i/o timeout)"),
             ("connection refused", "cannot be reached: nothing listens there (connection refused)"),
             ("was refused", "cannot be reached: nothing listens there (connection refused)"))
SERVER_URL = re.compile(r'(https?://[^/\s"\\]+)')
SERVER_REFUSED = re.compile(r"connection to the server (\S+) was refused")


def api_server_failure(stderr: str) -> str | None:
    """"the API server URL cannot be reached: why" (or refuses our credentials) when kubectl says so, else None."""
    low = stderr.lower()
    why = next((meaning for marker, meaning in UNREACHED if marker in low), None)
    if why is None:
        return None
    url = SERVER_URL.search(stderr) or SERVER_REFUSED.search(stderr)
    server = visible(url[1], multiline=False) if url else "of the kubeconfig's context"
    return f"the API server {server} {why}"


KLOG = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [^\]]*\] ")  # klog's header: level, date, time, thread, file:line
SAID_CHARS = 1500  # of kubectl's last lines, whole lines


def said_lines(stderr: str) -> str:
    """kubectl's stderr as a message quotes it: line by line, indented, each line's control characters escaped (a
    newline is a line break, never shown as \\x0a); a line that repeats one before it but for klog's header (its
    retries) shown once; only its last whole lines, up to SAID_CHARS."""
    seen: set[str] = set()
    lines = []
    for line in stderr.strip().splitlines():
        if line.strip() and (said := KLOG.sub("", line)) not in seen:
            seen.add(said)
            lines.append(visible(line.rstrip(), multiline=False))
    kept: list[str] = []
    for line in reversed(lines):
        if kept and sum(map(len, kept)) + len(line) > SAID_CHARS:
            break
        kept.insert(0, line if len(line) <= SAID_CHARS else f"...{line[-SAID_CHARS:]}")
    cut = [f"({len(lines) - len(kept)} earlier lines left out)"] if len(kept) < len(lines) else []
    return "\n".join(f"  {line}" for line in [*cut, *kept]) or "  (kubectl said nothing)"


def rows(transport: Transport, host: KubernetesHost, dests: list[str]) -> list[Row]:
    """The kind's rows of `check`: the agent started in the pod's container (or kubectl's failure, exit 4: a failed
    row ends the host's check), then where the repo and each dest live in the pod (what a restart keeps)."""
    try:
        hello = transport.agent().verified()
    except AgentLost as exc:
        return [Row("pod", "fail", str(exc), exc.exit_code)]
    via = f"on the bastion {host.via} over SSH" if host.via else "on this machine"
    found = [Row("kubectl", "ok", f"{host.pod.kubectl} runs {via}"),
             Row("pod", "ok", f"{host.pod.where()}: the agent runs in it (pid {hello.pid} there)")]
    try:
        spec = pod_spec(transport, host.pod)
    except DeployerError as exc:
        return [*found, Row("placement", "warn", f"the pod's spec could not be read: {exc}")]
    paths = [posixpath.join(host.repo, dest) for dest in dests] or [host.repo]
    for path, (volume, kind) in zip(paths, placements(spec, host.pod.container, paths), strict=True):
        where = f"{path}: {KEEPS.get(kind, LAYER)}" + (f" (volume {volume!r})" if volume else "")
        found.append(Row("placement", "warn" if volume is None else "ok", where))
    return found


# What survives where a file of the pod lives (docs: a container restart is a new container from the image).
LAYER = "the container's own filesystem: gone when the container restarts (a new container from the image)"
KEEPS = {"emptyDir": "an emptyDir: kept through a container restart, gone with the pod",
         "hostPath": "a hostPath: kept through a container restart and by a new pod on the same node",
         "persistentVolumeClaim": "a PVC: kept through a container restart and by a new pod",
         "other": "a volume of another kind: see its own lifetime"}


def get_pod_argv(pod: Pod) -> list[str]:
    """`kubectl get pod POD --output json`: the pod's spec and status, as the API server has them now."""
    assert pod.name is not None
    return [*kubectl_argv(pod), "get", "pod", pod.name, "--output", "json"]


def pod_spec(transport: Transport, pod: Pod) -> dict[str, Any]:
    """The pod's spec, as kubectl gets it where it runs (beside the agent in the pod, over the same transport)."""
    return read_pod(beside_container(transport), pod).spec


def read_pod(side: Transport, pod: Pod) -> PodSeen:
    """The pod now, read by kubectl on side (where kubectl runs); AgentLost naming the pod when kubectl fails,
    StepFailed when what it printed is not such a pod."""
    argv = get_pod_argv(pod)
    done = side.run(argv, timeout=SELECTED_S)
    if done.exit_code != 0:
        raise AgentLost(kubectl_failure(pod, done.stderr.decode("utf-8", "replace"),
                                        f"reading the pod ({quote(argv)})"))
    try:
        return PodSeen.parse(done.stdout.decode("utf-8", "replace"), pod.container)
    except ValueError as exc:
        raise StepFailed("kubectl", f"{' '.join(argv)} printed what is not a pod: {exc}") from None


def read_pod_now(name: str, host: KubernetesHost) -> PodSeen:
    """The pod now, without an agent in it: kubectl alone, where it runs (this machine, or the bastion, whose host
    key must be pinned already)."""
    side = kubectl_side(name, host, _Quiet(), False, python="python3")
    try:
        return read_pod(side, host.pod)
    finally:
        side.close()


# What the target says is input: a pod's uid is a UUID, a containerID `<runtime>://<hex id>` (docker, containerd,
# cri-o, podman), a restartCount a count; anything else is refused, never shown or compared as it is.
UID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
CONTAINER_ID = re.compile(r"^[a-z][a-z0-9.+-]{0,31}://[0-9a-f]{12,128}$")
NODE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")  # a DNS subdomain, as Kubernetes names a node


@dataclass(frozen=True)
class PodSeen:
    """What `kubectl get pod -o json` says of a pod and one of its containers, validated: the pod's uid (new for a
    new pod), the container's containerID ("": none runs) and restartCount (a container restart is a new container
    from the image), the image it names and the imageID it runs ("": not said), and the pod's spec (its volumes)."""

    uid: str
    container_id: str
    restarts: int
    image: str
    image_id: str
    node: str
    spec: dict[str, Any]

    @classmethod
    def parse(cls, out: str, container: str) -> PodSeen:
        """From kubectl's JSON, or ValueError saying what is not as a pod's."""
        try:
            pod = json.loads(out)
            uid, spec = pod["metadata"]["uid"], pod["spec"]
            specs = [c for c in spec.get("containers", []) if c.get("name") == container]
            statuses = [s for s in (pod.get("status") or {}).get("containerStatuses") or []
                        if s.get("name") == container]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"not a pod's JSON: {visible(out[:200], multiline=False)}") from None
        if not (isinstance(uid, str) and UID.match(uid)) or not isinstance(spec, dict):
            raise ValueError(f"its uid is not a pod's: {visible(str(uid)[:80], multiline=False)}")
        if not specs:
            raise ValueError(f"the pod has no container {visible(container, multiline=False)!r}")
        status = statuses[0] if statuses else {}
        container_id, restarts = status.get("containerID", ""), status.get("restartCount", 0)
        image, image_id = specs[0].get("image", ""), status.get("imageID", "")
        if not (isinstance(container_id, str) and (container_id == "" or CONTAINER_ID.match(container_id))):
            raise ValueError(f"its containerID is not one: {visible(str(container_id)[:160], multiline=False)}")
        if not (type(restarts) is int and restarts >= 0):
            raise ValueError(f"its restartCount is not a count: {visible(str(restarts)[:40], multiline=False)}")
        if not (isinstance(image, str) and isinstance(image_id, str)):
            raise ValueError("its image or imageID is not text")
        node = spec.get("nodeName", "")
        if not (isinstance(node, str) and (node == "" or NODE.match(node))):
            raise ValueError(f"its nodeName is not a node's name: {visible(str(node)[:80], multiline=False)}")
        return cls(uid, container_id, restarts, image, image_id, node, spec)

    def identity(self, pod: Pod) -> dict[str, Any]:
        return identity(pod, self.uid, self.container_id, self.restarts, self.node)


def identity(pod: Pod, uid: str, container_id: str, restarts: int, node: str) -> dict[str, Any]:
    """What a run records of the pod it shipped into, in its `pod` events (run/pods.py reads them back, validated
    again): at preflight, and after a restart of its own that made a new container or pod."""
    return {"pod": pod.name, "container": pod.container, "namespace": pod.namespace, "uid": uid,
            "container_id": container_id, "restart_count": restarts, "node": node}


def placements(spec: dict[str, Any], container: str, paths: list[str]) -> list[tuple[str | None, str]]:
    """For each absolute path in the container: the volume it is under (None: the container's own layer) and
    that volume's kind (emptyDir, hostPath, persistentVolumeClaim, other)."""
    kinds = {volume["name"]: next((kind for kind in KEEPS if kind in volume), "other")
             for volume in spec.get("volumes", [])}
    mounts = [(mount["mountPath"].rstrip("/") or "/", mount["name"])
              for each in spec.get("containers", []) if each.get("name") == container
              for mount in each.get("volumeMounts", [])]
    found: list[tuple[str | None, str]] = []
    for path in paths:
        under = [(at, name) for at, name in mounts if path == at or path.startswith(at.rstrip("/") + "/")]
        name = max(under, default=("", None), key=lambda mount: len(mount[0]))[1]
        found.append((name, kinds.get(name, "other")) if name is not None else (None, "layer"))
    return found


class _Quiet:
    """The emitter of a listing made before any run (a bastion's first host key is pinned all the same)."""

    def emit(self, kind: str, /, **data: object) -> None:
        pass


def expand_selectors(inventory: Inventory, specs: Sequence[str] | None = None) -> Inventory:
    """The inventory with each selector host as one host per pod it selects now (HOST.POD), and a group of
    the host's name listing them, so that `--host HOST` names them all as a group does; a unit of selector hosts
    as units of their pods (config.podunits). Given specs (what --host and --limit say, or a host's name), only the
    selectors they may take are listed (config.podunits.selectors_named); the others stay as they are, so that a
    cluster that cannot be reached stops only the commands that need its pods."""
    selecting = {name: host for name, host in inventory.hosts.items()
                 if isinstance(host, KubernetesHost) and host.pod.selector is not None}
    if specs is not None:
        needed = selectors_named(inventory.groups, inventory.units, selecting, specs)
        selecting = {name: host for name, host in selecting.items() if name in needed}
    if not selecting:
        return inventory
    hosts: dict[str, Host] = {}
    groups = dict(inventory.groups)
    labels: dict[str, dict[str, dict[str, str]]] = {}  # selector host -> HOST.POD -> the pod's labels
    for name, host in inventory.hosts.items():
        if name not in selecting:
            hosts[name] = host
            continue
        labels[name] = {f"{name}.{pod}": of for pod, of in selected(name, selecting[name], _Quiet()).items()}
        hosts.update({each: one(selecting[name], each[len(name) + 1:]) for each in labels[name]})
        groups[name] = list(labels[name])
    units, unit_groups = expand_pod_units(inventory.units, labels)
    return inventory.model_copy(update={"hosts": hosts, "groups": {**groups, **unit_groups}, "units": units})


# A command's listings of a selector's pods, by the kubectl command and where it runs: each command (a process)
# lists a selector once, however many of its hosts it loads the inventory for (Build.host loads it per host).
# The pods a listing names are the ones the command works on; a pod recreated under its name is the same host.
_listed: dict[tuple[str, ...], dict[str, dict[str, str]]] = {}
_listing = threading.Lock()


def selected(name: str, host: KubernetesHost, bus: Emitter) -> dict[str, dict[str, str]]:
    """The pods a selector's host selects, by name in order, each with its labels: listed once per process."""
    pod = host.pod
    assert pod.selector is not None
    argv = [*kubectl_argv(pod), "get", "pods", "--selector", pod.selector, "--output", "json"]
    bastion = host.via_host
    where = ("ssh", host.via or "", bastion.address or "", str(bastion.port), bastion.user or "") if bastion else \
        ("local", os.environ.get("KUBECONFIG", ""))
    with _listing:
        if (*where, *argv) not in _listed:
            _listed[(*where, *argv)] = list_pods(name, host, argv, bus)
        return _listed[(*where, *argv)]


def list_pods(name: str, host: KubernetesHost, argv: list[str], bus: Emitter) -> dict[str, dict[str, str]]:
    """`kubectl get pods --selector` run now where kubectl runs: the pods by name in order, with their labels.
    A failure says it was this listing (not an exec into a pod), with kubectl's command line: AgentLost, exit 4."""
    pod = host.pod
    listing = f"listing the pods of selector {pod.selector!r} ({quote(argv)})"
    side = kubectl_side(name, host, bus, False, python="python3")
    try:
        done = side.run(argv, timeout=SELECTED_S)
    except DeployerError as exc:
        raise AgentLost(f"{name}: {listing} failed: {exc}") from None
    finally:
        side.close()
    if done.exit_code != 0:
        raise AgentLost(f"{name}: {kubectl_failure(pod, done.stderr.decode('utf-8', 'replace'), listing)}")
    items = json.loads(done.stdout)["items"]
    found = {item["metadata"]["name"]: item["metadata"].get("labels") or {} for item in items}
    if not found:
        raise AgentLost(f"{name}: the selector selects no pod: {pod_or_selector(pod)}")
    return {each: found[each] for each in sorted(found)}


def one(host: KubernetesHost, pod: str) -> KubernetesHost:
    copy = host.model_copy(update={"pod": host.pod.named(pod)})
    copy._via_host = host.via_host
    copy._python_at = host.python_at
    return copy
