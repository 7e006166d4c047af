"""Units made of pods: a unit whose services name selector hosts (`transport: kubernetes` with `pod.selector`, one
host HOST.POD per pod it selects) is expanded, once the pods are listed, into units of those pods.

A LeaderWorkerSet labels each pod with its group (`leaderworkerset.sigs.k8s.io/group-index`) and its place in it
(`leaderworkerset.sigs.k8s.io/worker-index`, 0 the leader); RBG and llm-d label a pod's role (prefill, decode). A
selector host per role (or per leader and workers) gives each role its services; the unit's `group_label` pairs the
roles' pods: one unit per value of the label (UNIT.VALUE), and a group UNIT of them, so that `--host UNIT` takes
them all and a rolling rollout restarts one group at a time behind the router. Everything downstream (fleet, unit
restart, router drain, canary) sees ordinary units of ordinary hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from deployer.config.routers import RouterWorker
from deployer.config.units import Unit
from deployer.config.yamlsrc import Loc
from deployer.errors import ConfigError

POD = "{pod}"  # in a worker's url: the pod's name, for a router that names pods by their DNS names

# selector host -> its pods' hosts (HOST.POD), in order -> each pod's labels
Listed = Mapping[str, Mapping[str, Mapping[str, str]]]


def check_pod_units(units: Mapping[str, Unit], selecting: set[str], refuse: Callable[[Loc, str], None]) -> None:
    """At load: a unit's `group_label` pairs selector hosts' pods, so every service of it is on one (a plain host
    would be in every group's unit); `{pod}` in a worker's url names the pod of a selector host."""
    for name, unit in units.items():
        if unit.group_label is not None:
            for index, (host, _) in enumerate(unit.members()):
                if host not in selecting:
                    refuse(("units", name, "services", index),
                           f"group_label pairs the pods of selector hosts, and {host!r} names no pod.selector: "
                           f"it would be in every group's unit")
        for index, worker in enumerate(unit.workers):
            if worker.url is not None and POD in worker.url and worker.service.partition(":")[0] not in selecting:
                refuse(("units", name, "workers", index, "url"),
                       f"{POD} is the pod of a selector host, and {worker.service.partition(':')[0]!r} has no "
                       "pod.selector")


def selectors_named(groups: Mapping[str, list[str]], units: Mapping[str, Unit], selecting: Collection[str],
                    specs: Iterable[str]) -> set[str]:
    """The selector hosts whose pods a command's selections (--host, --limit: names, comma lists, globs) may take,
    before any pod is listed: so that a command lists those selectors only, and a cluster another host lives in
    that cannot be reached stops no command that does not need it. A name may be a host, a group, a unit, a
    selector's pod (HOST.POD) or a group_label's unit (UNIT.VALUE); a glob takes every selector (which of their pods it
    matches is known once they are listed); and a selector in a unit brings the unit's other selectors (a unit
    restarts whole, its pods paired by their labels)."""
    found: set[str] = set()

    def take(name: str, through: tuple[str, ...]) -> None:
        if name in units:
            found.update(units[name].hosts())
        elif name in groups:
            if name not in through:  # load_inventory refused cycles
                for member in groups[name]:
                    take(member, (*through, name))
        elif any(char in name for char in "*?["):
            found.update(selecting)  # whether it matches a HOST.POD is known once the pods are listed
        else:
            found.add(name)
            for prefix in [*selecting, *units]:  # HOST.POD, UNIT.VALUE (names may hold dots: each is tried)
                if name.startswith(f"{prefix}."):
                    found.update(units[prefix].hosts() if prefix in units else [prefix])

    for spec in specs:
        for part in spec.split(","):
            if part.strip():
                take(part.strip(), ())
    for unit in units.values():
        if found & set(unit.hosts()):
            found.update(unit.hosts())
    return found & set(selecting)


def expand_pod_units(units: Mapping[str, Unit], listed: Listed) -> tuple[dict[str, Unit], dict[str, list[str]]]:
    """The units with each one that names a selector host as units of its pods, and the groups a group_label
    makes (UNIT -> UNIT.VALUE...). A group that lacks a pod of one of the unit's hosts, a pod without the label, or
    a leader that is not one pod of its group is refused (ConfigError): the unit would not be what it says."""
    expanded: dict[str, Unit] = {}
    groups: dict[str, list[str]] = {}
    for name, unit in units.items():
        if not any(host in listed for host in unit.hosts()):
            expanded[name] = unit
            continue
        if unit.group_label is None:
            expanded[name] = _of_pods(name, unit, {host: list(listed[host]) for host in unit.hosts() if host in listed})
            continue
        by_value = _grouped(name, unit, unit.group_label, listed)
        for value, pods in by_value.items():
            expanded[f"{name}.{value}"] = _of_pods(f"{name}.{value}", unit, pods)
        groups[name] = [f"{name}.{value}" for value in by_value]
    return expanded, groups


def _grouped(name: str, unit: Unit, label: str, listed: Listed) -> dict[str, dict[str, list[str]]]:
    """label value -> each host of the unit -> its pods of that value, the values in order (numbers as numbers)."""
    values: dict[str, dict[str, list[str]]] = {}
    for host in unit.hosts():
        for pod, labels in listed[host].items():
            if label not in labels:
                raise ConfigError(f"unit {name}: pod {pod} has no label {label!r} (its group_label)")
            values.setdefault(labels[label], {}).setdefault(host, []).append(pod)
    for value, pods in values.items():
        missing = [host for host in unit.hosts() if host not in pods]
        if missing:
            raise ConfigError(f"unit {name}: its group {label}={value} has no pod of {', '.join(missing)}: "
                              "every group has every role")
    order = sorted(values, key=lambda v: (0, int(v), "") if v.isdecimal() else (1, 0, v))  # 2 before 10
    return {value: values[value] for value in order}


def _of_pods(name: str, unit: Unit, pods: Mapping[str, list[str]]) -> Unit:
    """The unit with each selector host's service as that service of each of its pods (pods: host -> its pods)."""
    def members(entry: str) -> list[str]:
        host, _, service = entry.partition(":")
        return [f"{pod}:{service}" for pod in pods[host]] if host in pods else [entry]

    leader = None
    if unit.leader is not None:
        leaders = members(unit.leader)
        if len(leaders) != 1:
            raise ConfigError(f"unit {name}: its leader {unit.leader} is {len(leaders)} pods "
                              f"({', '.join(leaders) or 'none'}): a gang's leader is one pod (select it alone, "
                              "e.g. by leaderworkerset.sigs.k8s.io/worker-index=0)")
        leader = leaders[0]
    metrics = unit.metrics
    if metrics is not None and metrics in pods:
        metrics = pods[metrics][0]
    pod_of = {pod: pod[len(host) + 1:] for host, of in pods.items() for pod in of}  # HOST.POD -> POD
    workers = []
    for worker in unit.workers:
        each = members(worker.service)
        if worker.url is not None and POD not in worker.url and len(each) > 1:
            raise ConfigError(f"unit {name}: worker {worker.service} is {len(each)} pods, all at {worker.url}: "
                              f"name each by its pod in its url ({POD}), or leave url: to its health URL")
        workers += [worker.model_copy(update={"service": service, "url": _url(worker, pod_of.get(host))})
                    for service in each for host in [service.partition(":")[0]]]
    return unit.model_copy(update={"services": [m for entry in unit.services for m in members(entry)],
                                   "leader": leader, "metrics": metrics, "workers": workers, "group_label": None})


def _url(worker: RouterWorker, pod: str | None) -> str | None:
    """The worker's url with {pod} as its pod's name."""
    if worker.url is None or pod is None:
        return worker.url
    return worker.url.replace(POD, pod)
