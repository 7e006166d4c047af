"""Units from the workload's roles: a unit whose services name selector hosts becomes units of their pods, paired by
a group label (LeaderWorkerSet's group index), with its leader, metrics host and router workers on those pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config import targets
from deployer.config.models import Inventory, KubernetesHost, load_inventory
from deployer.config.podunits import expand_pod_units
from deployer.config.units import Unit
from deployer.errors import ConfigError

GROUP = "leaderworkerset.sigs.k8s.io/group-index"


def pods(host: str, *names_and_groups: tuple[str, str]) -> dict[str, dict[str, str]]:
    return {f"{host}.{name}": {GROUP: group, "app": "sglang"} for name, group in names_and_groups}


PD = Unit.model_validate({
    "services": ["prefill:server", "decode:server"], "group_label": GROUP, "metrics": "prefill", "router": "r",
    "workers": [{"service": "prefill:server", "worker_type": "prefill", "bootstrap_port": 8998,
                 "url": "http://{pod}.sglang.serving.svc:30000"},
                {"service": "decode:server", "worker_type": "decode"}]})


def test_a_group_label_makes_one_unit_per_group_of_every_roles_pods_and_a_group_of_them() -> None:
    listed = {"prefill": pods("prefill", ("sglang-prefill-10", "10"), ("sglang-prefill-2", "2")),
              "decode": pods("decode", ("sglang-decode-2", "2"), ("sglang-decode-10a", "10"),
                             ("sglang-decode-10b", "10"))}
    units, groups = expand_pod_units({"pd": PD}, listed)
    assert groups == {"pd": ["pd.2", "pd.10"]}  # group values that are numbers in their order
    two, ten = units["pd.2"], units["pd.10"]
    assert two.services == ["prefill.sglang-prefill-2:server", "decode.sglang-decode-2:server"]
    assert ten.services == ["prefill.sglang-prefill-10:server", "decode.sglang-decode-10a:server",
                            "decode.sglang-decode-10b:server"]
    assert ten.metrics == "prefill.sglang-prefill-10" and ten.router == "r" and ten.group_label is None
    assert [(w.service, w.worker_type, w.url) for w in ten.workers] == [
        ("prefill.sglang-prefill-10:server", "prefill", "http://sglang-prefill-10.sglang.serving.svc:30000"),
        ("decode.sglang-decode-10a:server", "decode", None), ("decode.sglang-decode-10b:server", "decode", None)]
    assert ten.workers[0].bootstrap_port == 8998


def test_a_lws_gangs_leader_is_the_one_pod_of_its_group_the_leader_host_selects() -> None:
    gang = Unit.model_validate({"services": ["leader:server", "workers:server"], "gang": True,
                                "leader": "leader:server", "group_label": GROUP})
    listed = {"leader": pods("leader", ("dsv4-0", "0"), ("dsv4-1", "1")),
              "workers": pods("workers", ("dsv4-0-1", "0"), ("dsv4-1-1", "1"))}
    units, _ = expand_pod_units({"dsv4": gang}, listed)
    assert units["dsv4.1"].services == ["leader.dsv4-1:server", "workers.dsv4-1-1:server"]
    assert units["dsv4.1"].leader == "leader.dsv4-1:server" and units["dsv4.1"].gang


def test_without_a_group_label_a_unit_takes_every_pod_and_plain_units_stay_as_written() -> None:
    one = Unit.model_validate({"services": ["prefill:server", "decode:server"]})
    plain = Unit.model_validate({"services": ["gpu-a:server"]})
    units, groups = expand_pod_units({"pd": one, "plain": plain}, {
        "prefill": pods("prefill", ("p-0", "0")), "decode": pods("decode", ("d-0", "0"), ("d-1", "0"))})
    assert units["pd"].services == ["prefill.p-0:server", "decode.d-0:server", "decode.d-1:server"]
    assert units["plain"] is plain and groups == {}


@pytest.mark.parametrize("listed, said", [
    ({"prefill": pods("prefill", ("p-0", "0"), ("p-1", "1")), "decode": pods("decode", ("d-0", "0"))},
     "unit pd: its group leaderworkerset.sigs.k8s.io/group-index=1 has no pod of decode: every group has every role"),
    ({"prefill": {"prefill.p-0": {"app": "sglang"}}, "decode": pods("decode", ("d-0", "0"))},
     "unit pd: pod prefill.p-0 has no label 'leaderworkerset.sigs.k8s.io/group-index' (its group_label)"),
])
def test_a_group_short_of_a_role_or_a_pod_without_the_label_is_refused(
        listed: dict[str, dict[str, dict[str, str]]], said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        expand_pod_units({"pd": PD}, listed)
    assert str(caught.value) == said


def test_a_leader_of_several_pods_and_one_url_for_several_pods_are_refused() -> None:
    gang = Unit.model_validate({"services": ["ranks:server"], "gang": True, "leader": "ranks:server"})
    with pytest.raises(ConfigError, match=r"its leader ranks:server is 2 pods .*worker-index=0"):
        expand_pod_units({"g": gang}, {"ranks": pods("ranks", ("r-0", "0"), ("r-1", "0"))})
    fixed = Unit.model_validate({"services": ["decode:server"], "router": "r", "workers": [
        {"service": "decode:server", "worker_type": "decode", "url": "http://decode:30000"}]})
    with pytest.raises(ConfigError, match=r"worker decode:server is 2 pods, all at http://decode:30000"):
        expand_pod_units({"u": fixed}, {"decode": pods("decode", ("d-0", "0"), ("d-1", "0"))})


INVENTORY = """\
hosts:
  gpu-a: {transport: local, repo: /r, services: {server: {start: "true", health: "http://127.0.0.1:1/health"}}}
  prefill:
    transport: kubernetes
    pod: {selector: "app=sglang,role=prefill", container: server}
    repo: /sgl-workspace
    services: {server: {start: "true", health: "http://127.0.0.1:30000/health"}}
routers:
  r: {host: gpu-a, url: "http://127.0.0.1:8000"}
units:
  pd:
    services: [prefill:server, gpu-a:server]
    group_label: leaderworkerset.sigs.k8s.io/group-index
    router: r
    workers:
      - {service: "gpu-a:server", worker_type: decode, url: "http://{pod}.x:1"}
"""


def test_a_group_label_over_a_plain_host_and_a_pod_url_of_one_are_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(INVENTORY)
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    said = str(caught.value)
    assert "hosts.yaml:12:32: units.pd.services.1: group_label pairs the pods of selector hosts, and 'gpu-a' " \
        "names no pod.selector: it would be in every group's unit" in said, said
    assert "hosts.yaml:16:61: units.pd.workers.0.url: {pod} is the pod of a selector host, and 'gpu-a' has no " \
        "pod.selector" in said


def test_host_names_a_pod_units_group_and_each_of_its_units() -> None:
    listed = {"prefill": pods("prefill", ("p-0", "0"), ("p-1", "1")),
              "decode": pods("decode", ("d-0", "0"), ("d-1", "1"))}
    units, groups = expand_pod_units({"pd": PD}, listed)
    hosts = {name: KubernetesHost.model_validate({
        "transport": "kubernetes", "repo": "/r", "pod": {"name": name.partition(".")[2], "container": "server"},
        "services": {"server": {"start": "true", "health": "http://127.0.0.1:30000/health"}}})
        for of in listed.values() for name in of}
    inventory = Inventory.model_construct(hosts=hosts, groups=groups, units=units, routers={})
    assert targets.resolve(inventory, "pd") == ["prefill.p-0", "decode.d-0", "prefill.p-1", "decode.d-1"]
    assert targets.resolve(inventory, "pd.1") == ["prefill.p-1", "decode.d-1"]
