"""Typed models of the inventory and the playbook, and their strict loading."""

from __future__ import annotations

import os
import posixpath
import shlex
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StringConstraints,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from deployer.config import yamlsrc
from deployer.config.api import API_HELP, Api
from deployer.config.container import Container, check_own_containers
from deployer.config.notify import Notify
from deployer.config.persist import Persist
from deployer.config.podunits import check_pod_units
from deployer.config.rollout import Rollout as Rollout  # its own module: batches, strategies, pauses
from deployer.config.routers import BehindRouter, Router
from deployer.config.units import Unit as Unit  # its own module, beside the router it may name
from deployer.config.units import check_routers
from deployer.config.validation import UNKNOWN_KIND, validate
from deployer.errors import ConfigError

# The target's own loopback: the only place a storm (and a host's endpoint) may point.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


MIN_SECRET = 4


class SecretValue(Strict):
    """An environment value that must never be shown: `{secret: true, value: ...}` or `value_from_env`."""

    secret: bool = Field(default=True, description="true: the value is masked as *** in every output and log.")
    value: str | None = Field(default=None, description="The value itself.")
    value_from_env: str | None = Field(default=None, description=(
        "The environment variable, on the machine deployer runs on, that holds the value."))

    @model_validator(mode="after")
    def _one_source(self) -> SecretValue:
        if (self.value is None) == (self.value_from_env is None):
            raise ValueError("give exactly one of 'value' or 'value_from_env'")
        return self

    def resolve(self) -> str:
        if self.value is not None:
            found: str | None = self.value
        else:
            assert self.value_from_env is not None
            found = os.environ.get(self.value_from_env)
            if found is None:
                raise ConfigError(f"environment variable {self.value_from_env} is not set "
                                  "(an inventory value reads it with value_from_env)")
        if len(found or "") < MIN_SECRET:
            # Masking a 1-3 character string would blank out half of every line and still leak it.
            raise ConfigError(f"a secret value ({self.value_from_env or 'value'}) is shorter than "
                              f"{MIN_SECRET} characters; it cannot be masked reliably")
        return str(found)


EnvValue = str | SecretValue
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # what a POSIX shell can export


def check_url(url: str) -> str:
    """An absolute http(s) URL as the target sees it: a relative one has nothing to connect to."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} must be an absolute http:// URL, such as http://127.0.0.1:30000/metrics")
    try:
        bad_port = parts.port == 0
    except ValueError:  # not a number, or above 65535
        bad_port = True
    if bad_port:
        raise ValueError(f"{url!r} has a bad port")
    return url


def check_loopback_url(url: str) -> str:
    """Where a storm may be sent: the target's own loopback, over plain http (deployer.steps.storm's rule)."""
    check_url(url)
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"{url!r}: a storm speaks plain http:// only")
    if parts.hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"{url!r}: host {parts.hostname!r} is not loopback (127.0.0.1, localhost, ::1); "
                         "a storm only hits the target's own loopback")
    return url


def absolute_path(path: str) -> str:
    if not posixpath.isabs(path):
        raise ValueError("must be an absolute path on the target")
    return posixpath.normpath(path)


Url = Annotated[str, AfterValidator(check_url)]
TargetPath = Annotated[str, AfterValidator(absolute_path)]
LoopbackUrl = Annotated[str, AfterValidator(check_loopback_url)]


def _argv(value: str | list[str] | None) -> list[str] | None:
    if value is None or isinstance(value, list):
        return value
    return shlex.split(value)


class Service(Strict):
    """A process on the target that the patch's code runs in."""

    start: list[str] | None = Field(default=None, description=(
        "The command that starts the service (a line, split as a shell would, or an argv list), run in its own "
        "session."))
    stop: list[str] | None = Field(default=None, description=(
        "A command that stops the service, run before its process tree is signalled (TERM, then KILL after "
        "stop_grace_s)."))
    systemd: str | None = Field(default=None, description="The systemd unit that runs the service.")
    container: Container | None = Field(default=None, description=(
        "The container that is the service (its name, docker's; or {engine, name, engine_path}): the engine stops "
        "and starts it, its State.Pid and State.StartedAt prove the restart."))
    kubernetes: Literal["container", "pod"] | None = Field(default=None, description=(
        "On a kubernetes host, the service is the pod's container itself (its main process is the server). "
        "container: a restart ends that process and the kubelet starts a new container from the image (restartCount "
        "+1 and a new containerID prove it); pod: a restart deletes the pod and its controller makes a new one "
        "(a new uid proves it)."))
    health: Url | None = Field(default=None, description=(
        "The http URL, as the target sees it, that answers 200 once the service serves: each start waits for it."))
    health_timeout_s: float = Field(default=60.0, gt=0, description="Seconds a start has to answer on health.")
    stop_grace_s: float = Field(default=10.0, ge=0, description=(
        "Seconds between TERM and KILL when the service's processes are stopped."))
    cwd: str | None = Field(default=None, description=(
        "The directory the start and stop commands run in, relative to the host's repo (default: the repo)."))
    env: dict[Annotated[str, StringConstraints(pattern=ENV_NAME)], EnvValue] = Field(
        default_factory=dict, description=(
            "Environment variables of the service, beside the host's: a value, or {secret: true, value or "
            "value_from_env}, masked everywhere."))
    gpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, description=(
        "The GPUs (nvidia-smi indices) the service loads onto: a restart starts it only once they are released."))
    gpu_free_mib: int | None = Field(default=None, gt=0, description=(
        "MiB that must be free on each of its GPUs before a start (default: used memory within 1 GiB of idle)."))
    # a killed server's memory can take a while to be freed
    gpu_wait_s: float = Field(default=120.0, gt=0, description="Seconds a restart waits for its GPUs to be released.")
    adopt: Literal["port"] | None = Field(default=None, description=(
        "port: whatever listens on the health URL's port is the service (started by hand, by a launcher), when "
        "deployer's own record names no live process."))
    pidfile: TargetPath | None = Field(default=None, description=(
        "The pid file (absolute, on the target) the server or its launcher writes: the live process it names is "
        "the service when deployer's own record names none."))
    detaches: bool = Field(default=False, description=(
        "true: `start` returns once the server runs in the background (a daemonizing script); the service is what "
        "serves the port, and the launcher's own exit is no failure."))
    log: TargetPath | None = Field(default=None, description=(
        "The file (absolute, on the target) the server writes its own output to, when its launcher sends it there "
        "(`nohup server >> own.log &`): a failed start shows that file's tail since this start, not the "
        "launcher's output in deployer's log."))

    _split = field_validator("start", "stop", mode="before")(_argv)

    @field_validator("container", mode="before")
    @classmethod
    def _container_name(cls, value: object) -> object:
        return {"engine": "docker", "name": value} if isinstance(value, str) else value

    @field_validator("gpus")
    @classmethod
    def _distinct_gpus(cls, gpus: list[int]) -> list[int]:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"names a GPU twice: {gpus}")
        return gpus

    @field_validator("gpu_free_mib", "gpu_wait_s")
    @classmethod
    def _only_with_gpus(cls, value: float | None, info: ValidationInfo) -> float | None:
        # Validated only when given: a GPU setting on a service without `gpus:` would silently do nothing.
        if not info.data.get("gpus"):
            raise ValueError(f"'{info.field_name}' needs 'gpus' (the GPU indices to wait for) on the same service")
        return value

    @model_validator(mode="after")
    def _one_manager(self) -> Service:
        if sum(way is not None for way in (self.start, self.systemd, self.container, self.kubernetes)) != 1:
            raise ValueError("give exactly one of 'start' (a command), 'systemd' (a unit name), 'container' "
                             "(a container's name) or 'kubernetes' (container or pod: a pod's container itself)")
        if self.start is not None and not self.start:
            raise ValueError("'start' is empty")
        if (self.adopt is not None or self.detaches) and (self.health is None or self.start is None):
            raise ValueError("'adopt: port' and 'detaches' need 'start' and a 'health' URL: the process on its port "
                             "is the service")
        if self.pidfile is not None and self.start is None:
            raise ValueError("'pidfile' needs 'start': deployer adopts the process it names, then starts its own")
        if self.log is not None and self.start is None:
            raise ValueError("'log' needs 'start': a container's or a unit's output is read from its engine or journal")
        return self


class Host(BehindRouter, Strict):
    """What every host has, whatever reaches it (a plain host may name its router: BehindRouter); each transport
    kind's model adds its own fields."""

    transport: str  # each kind's model narrows it to its own name (the union's tag), and says what it means
    repo: TargetPath = Field(description="The git checkout on the target (an absolute path) that a fix is applied to.")
    python: str = Field(default="python3", description=(
        "The Python on the target that runs deployer's agent and compiles the shipped files."))
    metrics: Url | None = Field(default=None, description=(
        "The Prometheus metrics URL, as the target sees it, that baseline and drain read by default."))
    endpoint: LoopbackUrl | None = Field(default=None, description=(
        "The serving entry point on the target's loopback (e.g. the router) that a storm is sent to by default."))
    api: Api = Field(default="sglang", description=(
        f"The serving API its storms and canaries speak (a step's `api:` overrides it): {API_HELP}."))
    services: dict[str, Service] = Field(default_factory=dict, description=(
        "The services the patched code runs in, by name: what co_restart restarts."))
    env: dict[Annotated[str, StringConstraints(pattern=ENV_NAME)], EnvValue] = Field(
        default_factory=dict, description=(
            "Environment variables of every command on the host: a value, or {secret: true, value or "
            "value_from_env}, masked everywhere."))
    become: bool = Field(default=False, description="true: commands on the target run under sudo -n.")
    lock_ttl_s: float = Field(default=120.0, gt=0, description=(
        "Seconds a deploy lock holds without being renewed: after that, one whose run is gone may be taken over."))
    container: Container | None = Field(default=None, description=(
        "The container on the host that the agent runs in: the repo, python and paths are the container's."))

    # Where the inventory says `python:` (file:line:col), when it was read from one: a python the host does not
    # have is reported there.
    _python_at: str | None = PrivateAttr(default=None)

    @property
    def python_at(self) -> str | None:
        return self._python_at

    def secrets(self) -> list[str]:
        envs = [self.env, *(s.env for s in self.services.values())]
        return [v.resolve() for env in envs for v in env.values() if isinstance(v, SecretValue) and v.secret]


class SshHost(Host):
    """A host over SSH, the kind a host without `transport:` is."""

    transport: Literal["ssh"] = Field(default="ssh", description=(
        "ssh (the default): the host is reached over SSH; local: it is a directory on this machine."))
    address: str | None = Field(default=None, description=(
        "The host name or address to connect to, or an ssh_config alias (default: the inventory's name of the host)."))
    port: int | None = Field(default=None, ge=1, le=65535, description="The SSH port (default: ssh_config's, or 22).")
    user: str | None = Field(default=None, description="The user to log in as (default: ssh_config's, or yours).")
    identity_file: str | None = Field(default=None, description=(
        "The private key to log in with (default: ssh_config's IdentityFile for the host)."))
    known_hosts: str | None = Field(default=None, description=(
        "The known_hosts file the host's key is checked against (default: ~/.ssh/known_hosts)."))
    ssh_config: str | None = Field(default=None, description=(
        "The ssh_config whose HostName, User, Port, IdentityFile and ProxyJump apply (default: ~/.ssh/config)."))
    host_key_policy: Literal["reject", "accept-new"] = Field(default="reject", description=(
        "reject (the default) refuses an unknown host key; accept-new pins it. A changed key is always refused."))
    connect_timeout_s: float = Field(default=10.0, gt=0, description=(
        "Seconds for the TCP connect, for the handshake and login, and for each channel open."))


class LocalHost(Host):
    """A directory on this machine (the demo, most tests): nothing to connect to."""

    # no default: a dumped inventory must keep saying it (ssh is the default)
    transport: Literal["local"] = Field(description=(
        "local: the host is a directory on this machine (the demo, tests); ssh (the default): reached over SSH."))


class Pod(Strict):
    """The pod a `transport: kubernetes` host runs its agent in, and the kubectl that reaches it."""

    name: str | None = Field(default=None, min_length=1, description=(
        "The pod's name: this host is that pod."))
    selector: str | None = Field(default=None, min_length=1, description=(
        "A label selector (app=sglang,role=decode): the host expands into one host per pod it selects, "
        "named HOST.POD, like a group."))
    container: str = Field(min_length=1, description="The container in the pod that the agent runs in.")
    namespace: str = Field(default="default", min_length=1, description="The pod's namespace.")
    context: str | None = Field(default=None, min_length=1, description=(
        "The kubeconfig context (default: the kubeconfig's current-context)."))
    kubeconfig: str | None = Field(default=None, min_length=1, description=(
        "The kubeconfig, a path where kubectl runs (default: kubectl's own: $KUBECONFIG, then ~/.kube/config)."))
    kubectl: str = Field(default="kubectl", min_length=1, description="The kubectl command where it runs.")

    @model_validator(mode="after")
    def _one_way_to_name(self) -> Pod:
        if (self.name is None) == (self.selector is None):
            raise ValueError("give exactly one of 'name' (a pod) or 'selector' (a label selector: one host per pod)")
        return self

    def named(self, name: str) -> Pod:
        """This pod's settings for the pod of that name (a selector's expansion)."""
        return self.model_copy(update={"name": name, "selector": None})

    def where(self) -> str:
        """How an error names it: the pod, its container, its namespace and its context."""
        return (f"pod {self.name or self.selector!r} (container {self.container!r}, namespace {self.namespace!r}, "
                f"context {self.context or '(current-context)'!r})")


class KubernetesHost(Host):
    """A container of a pod: the agent runs through `kubectl exec -i`, kubectl on this machine or on a bastion."""

    transport: Literal["kubernetes"] = Field(description=(
        "kubernetes: the agent runs in a pod's container through kubectl exec -i."))
    pod: Pod = Field(description="The pod (or a label selector of pods), its container, namespace and context.")
    via: str | None = Field(default=None, min_length=1, description=(
        "An inventory host of transport ssh (a bastion) where kubectl runs (default: kubectl runs on this machine)."))

    # The bastion's model, set by load_inventory from `via` (a host of the inventory, checked to be an ssh host).
    _via_host: SshHost | None = PrivateAttr(default=None)

    @property
    def via_host(self) -> SshHost | None:
        return self._via_host

    @model_validator(mode="after")
    def _no_container(self) -> KubernetesHost:
        if self.container is not None:
            raise ValueError("a kubernetes host names its container under 'pod:' (pod.container), not 'container:'")
        return self


def transport_of(data: Any) -> str:
    """The kind a host is: its `transport:`, ssh when it has none (and for what is not a mapping, so that
    SshHost says what is wrong with it)."""
    found = data.get("transport", "ssh") if isinstance(data, dict) else getattr(data, "transport", "ssh")
    return found if isinstance(found, str) else repr(found)


# The host model of each target kind, by the kind's name (its `transport:`): the inventory's union is built from it.
# transport/kinds.py keys its registry by the same names (a test holds the two equal); `container:` is no kind but
# a wrapper around any kind's exec (Host.container).
HOST_MODELS: dict[str, type[Host]] = {"ssh": SshHost, "local": LocalHost, "kubernetes": KubernetesHost}


def _host_union() -> Any:
    members = tuple(Annotated[model, Tag(kind)] for kind, model in HOST_MODELS.items())
    *others, last = (repr(kind) for kind in HOST_MODELS)
    names = f"{', '.join(others)} or {last}"
    return Annotated[Union[members],  # noqa: UP007 (a union built from a tuple)
                     Discriminator(transport_of, custom_error_type=UNKNOWN_KIND,
                               custom_error_context={"key": "transport"},
                               custom_error_message=f"Input should be {names}")]


if TYPE_CHECKING:  # to the type checker a host is the common model; isinstance narrows it to its kind's
    AnyHost = Host
else:
    AnyHost = _host_union()


def resolve_env(env: dict[str, EnvValue]) -> dict[str, str]:
    return {k: v.resolve() if isinstance(v, SecretValue) else v for k, v in env.items()}


class Inventory(Strict):
    hosts: dict[str, AnyHost] = Field(description=(
        "The targets by name: each one's repo, python, services and how to reach it."))
    groups: dict[str, list[str]] = Field(default_factory=dict, description=(
        "Names for lists of hosts, groups or units, for --host."))
    units: dict[str, Unit] = Field(default_factory=dict, description=(
        "Services on several hosts that restart as one (prefill on one node, decode on another), by name."))
    routers: dict[str, Router] = Field(default_factory=dict, description=(
        "The routers that send units their traffic, by name, and how a worker is taken out and put back."))
    notify: Notify | None = Field(default=None, description=(
        "Where each rollout's events go besides the screen and the run log: webhooks, OpenTelemetry spans."))


# Control characters split line-based answers and reach sshd as invalid packets; line and paragraph separators
# split lines too (str.splitlines); format characters (RIGHT-TO-LEFT OVERRIDE...) make a name read as another one.
_UNSAFE_CATEGORIES = {"Cc", "Cf", "Zl", "Zp"}


def check_plain_name(path: str) -> str:
    """A path that reads the same to every tool: no control characters, not an option (leading '-')."""
    for index, char in enumerate(path):
        if unicodedata.category(char) in _UNSAFE_CATEGORIES:
            raise ValueError(f"must not contain control characters (U+{ord(char):04X} at index {index})")
    if posixpath.normpath(path).startswith("-"):
        raise ValueError("must not start with '-' (it would read as an option)")
    return path


class FileSpec(Strict):
    src: Annotated[str, AfterValidator(check_plain_name)] = Field(description=(
        "The file shipped, relative to the playbook."))
    dest: str = Field(description="The file it replaces, relative to the host's repo.")
    create: bool = Field(default=False, description="true: dest may be a file git does not track yet.")

    @field_validator("dest")
    @classmethod
    def _inside_repo(cls, dest: str) -> str:
        return check_repo_relative(dest)


def check_repo_relative(dest: str) -> str:
    """A path relative to the repo that cannot leave it or touch git's own files."""
    check_plain_name(dest)
    if not dest or posixpath.isabs(dest):
        raise ValueError("must be a path relative to the host's repo, not absolute")
    parts = dest.split("/")
    if ".." in parts:
        raise ValueError("must not contain '..' (it would escape the repo)")
    if ".git" in parts:
        raise ValueError("must not point into .git")
    if posixpath.normpath(dest) == "." or dest.endswith("/"):
        raise ValueError("must name a file, not a directory")
    return posixpath.normpath(dest)


class Playbook(Strict):
    name: str = Field(min_length=1, description="The fix's name, in plans, summaries and the run log.")
    description: str = Field(default="", description="What the fix changes and why, for the people who read it.")
    files: list[FileSpec] = Field(default_factory=list, description=(
        "Full-file replacements, each a src (relative to the playbook) and a dest (relative to the repo)."))
    patch: Annotated[str, AfterValidator(check_plain_name)] | None = Field(default=None, description=(
        "A diff (relative to the playbook) applied with git apply on the target, instead of files."))
    steps: list[Any] = Field(min_length=1, description=(
        "The steps, in order: a kind's name, or {kind: {its parameters}}; the first that fails stops the run."))
    on_failure: Literal["restore", "rollback", "rollback_fleet"] = Field(default="restore", description=(
        "After the commit, a failure leaves the commit (restore), reverts it and proves the old build (rollback), "
        "or also rolls back every host of the fleet run that committed (rollback_fleet)."))
    persist: Persist = Field(default="any", description=(
        "required: every dest must outlive a recreate: in a host's container on a bind mount or a volume, in a "
        "pod (transport: kubernetes) on a hostPath or a PVC; any (the default): shipped wherever it lives."))
    rollout: Rollout = Field(default_factory=Rollout, description=(
        "How a fleet run spreads over its hosts: batch sizes, failures allowed, pauses, strategy."))

    @model_validator(mode="after")
    def _files_or_patch(self) -> Playbook:
        # Neither: a playbook that ships nothing (a restart and its checks); playbook.py refuses one that uploads.
        if self.files and self.patch is not None:
            raise ValueError("give exactly one of 'files' or 'patch'")
        dests = [f.dest for f in self.files]
        if len(set(dests)) != len(dests):
            raise ValueError("two files have the same dest")
        return self


def load_inventory(path: Path) -> Inventory:
    doc = yamlsrc.load(path)
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{path}:1:1: an inventory is a mapping with a 'hosts' key")
    inventory = validate(Inventory, doc.data, doc)
    check_topology(inventory, doc)
    for name, host in inventory.hosts.items():
        host._python_at = str(doc.key_mark(("hosts", name, "python"))) if "python" in host.model_fields_set else None
        if isinstance(host, KubernetesHost) and isinstance(bastion := inventory.hosts.get(host.via or ""), SshHost):
            host._via_host = bastion  # check_topology refused a `via:` that is not an ssh host
    return inventory


def check_topology(inventory: Inventory, doc: yamlsrc.Document) -> None:
    """Groups and units name what exists, groups do not loop, and a host is in one unit at most."""
    problems: list[tuple[yamlsrc.Mark, str]] = []

    def refuse(loc: yamlsrc.Loc, problem: str, key: bool = False) -> None:
        problems.append((doc.key_mark(loc) if key else doc.mark(loc), f"{'.'.join(str(p) for p in loc)}: {problem}"))

    for name in inventory.groups:
        if name in inventory.hosts:
            refuse(("groups", name), "the name is already a host", key=True)
    for name in inventory.units:
        if name in inventory.hosts or name in inventory.groups:
            refuse(("units", name), f"the name is already a {'host' if name in inventory.hosts else 'group'}",
                   key=True)
    known = {*inventory.hosts, *inventory.groups, *inventory.units}
    cycles: set[frozenset[str]] = set()  # each loop once, at the first group on it
    for name, members in inventory.groups.items():
        for index, member in enumerate(members):
            if member not in known:
                refuse(("groups", name, index), f"{member!r} is not a host, group or unit")
            elif (cycle := _cycle(inventory.groups, [name, member])) is not None and \
                    frozenset(cycle) not in cycles:
                cycles.add(frozenset(cycle))
                refuse(("groups", name, index), f"groups form a cycle: {' -> '.join(cycle)}")
    owner: dict[str, str] = {}
    for name, unit in inventory.units.items():
        for index, (host, service) in enumerate(unit.members()):
            loc: yamlsrc.Loc = ("units", name, "services", index)
            if not service:
                refuse(loc, "a unit's service is HOST:SERVICE, such as gpu-a:prefill")
            elif host not in inventory.hosts:
                refuse(loc, f"host {host!r} is not in the inventory")
            elif service not in inventory.hosts[host].services:
                have = ", ".join(inventory.hosts[host].services) or "none"
                refuse(loc, f"host {host!r} has no service {service!r} (services: {have})")
            elif owner.setdefault(host, name) != name:
                refuse(loc, f"host {host!r} is already in unit {owner[host]!r} (a host belongs to one unit at most)")
        if unit.metrics is not None and unit.metrics not in unit.hosts():
            refuse(("units", name, "metrics"),
                   f"{unit.metrics!r} is not a host of unit {name!r} ({', '.join(unit.hosts())})")
    check_routers(inventory.units, inventory.hosts, inventory.routers, refuse)  # each unit's and plain host's
    check_pod_units(inventory.units, {name for name, host in inventory.hosts.items()
                                      if isinstance(host, KubernetesHost) and host.pod.selector is not None}, refuse)
    check_own_containers(inventory.hosts, refuse)
    for name, target in inventory.hosts.items():
        if isinstance(target, KubernetesHost) and target.via is not None and \
                not isinstance(inventory.hosts.get(target.via), SshHost):
            refuse(("hosts", name, "via"), f"{target.via!r} is not a host of transport ssh in the inventory "
                   "(kubectl runs on a bastion reached over SSH)")
    for name, target in inventory.hosts.items():
        check_pod_container(name, target, refuse)
    if problems:
        raise ConfigError(yamlsrc.in_line_order(problems))


def check_pod_container(name: str, host: Host, refuse: Callable[[yamlsrc.Loc, str], None]) -> None:
    """`kubernetes: container|pod` is a pod's own container: only on a kubernetes host, once, first among its services
    (the others run inside it: stopped before it, started after it), without `gpus:` (their wait runs through the
    agent inside it, which its restart ends)."""
    own = [s for s, service in host.services.items() if service.kubernetes is not None]
    for index, service_name in enumerate(host.services):
        if service_name not in own:
            continue
        loc: yamlsrc.Loc = ("hosts", name, "services", service_name, "kubernetes")
        if not isinstance(host, KubernetesHost):
            refuse(loc, f"'kubernetes:' needs a host of transport kubernetes ({name} is "
                        f"{host.transport}): a container on a host is `container: NAME`")
        elif service_name != own[0]:
            refuse(loc, f"the pod's container is already service {own[0]}: a container is one service")
        elif index != 0:
            refuse(loc, f"the pod's own container must be its first service (its other services run inside it): "
                        f"move {service_name} above {next(iter(host.services))}")
        elif host.services[service_name].gpus:
            refuse(("hosts", name, "services", service_name, "gpus"),
                   "the pod's own container cannot wait for its GPUs: the wait runs through the agent inside it, "
                   "which its restart ends: drop `gpus:` here")


def _cycle(groups: dict[str, list[str]], path: list[str]) -> list[str] | None:
    """The loop through path[0] that path's last group leads back into, if any."""
    last = path[-1]
    if last == path[0]:
        return path
    if last in path[:-1] or last not in groups:
        return None
    for member in groups[last]:
        found = _cycle(groups, [*path, member])
        if found is not None:
            return found
    return None


def get_host(inventory: Inventory, name: str, path: Path) -> Host:
    try:
        return inventory.hosts[name]
    except KeyError:
        known = ", ".join(sorted(inventory.hosts)) or "none"
        raise ConfigError(f"host {name!r} is not in {path} (hosts: {known})") from None
