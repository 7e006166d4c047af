"""One host model per transport kind, chosen by `transport:` (ssh when absent): each kind takes only its own keys,
the inventory format is unchanged, and the JSON Schema says the same as the models."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml

from deployer.config.models import (
    HOST_MODELS,
    AnyHost,
    Inventory,
    KubernetesHost,
    LocalHost,
    SshHost,
    load_inventory,
)
from deployer.demo.run import DemoStack, fleet_inventory, fleet_stacks, unit_ports
from deployer.errors import ConfigError
from deployer.steps.schema import schema_for
from deployer.transport.kinds import KINDS, WRAPPERS, opener, rows

REPO = Path(__file__).resolve().parents[2]


def inventory_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    return str(caught.value).replace(str(path), "hosts.yaml")


def test_a_host_without_transport_is_ssh_and_a_local_one_is_local(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  gpu: {address: a.example, port: 2222, repo: /r}\n"
                    "  demo: {transport: local, repo: /d}\n  named: {transport: ssh, repo: /n}\n")
    hosts = load_inventory(path).hosts
    assert isinstance(hosts["gpu"], SshHost) and hosts["gpu"].port == 2222
    assert isinstance(hosts["named"], SshHost)
    assert isinstance(hosts["demo"], LocalHost) and hosts["demo"].repo == "/d"


def test_a_local_host_with_an_ssh_key_is_refused_at_that_key_saying_whose_key_it_is(tmp_path: Path) -> None:
    error = inventory_error(tmp_path, "hosts:\n  demo:\n    transport: local\n    repo: /r\n    port: 22\n")
    assert error == "hosts.yaml:5:5: hosts.demo.port: unknown key for transport: local ('port' is a key of " \
                    "transport: ssh only)"


def test_a_host_named_like_a_kind_is_judged_by_its_own_kind(tmp_path: Path) -> None:
    error = inventory_error(tmp_path, "hosts:\n  ssh:\n    transport: local\n    repo: /r\n    user: root\n")
    assert error.startswith("hosts.yaml:5:5: hosts.ssh.user: unknown key for transport: local")
    error = inventory_error(tmp_path, "hosts:\n  local:\n    repo: /r\n    adress: a\n")
    assert error == "hosts.yaml:4:5: hosts.local.adress: unknown key (did you mean 'address'?)"


def test_a_key_no_kind_takes_still_suggests_the_close_one(tmp_path: Path) -> None:
    error = inventory_error(tmp_path, "hosts:\n  demo:\n    transport: local\n    repo: /r\n    pyhton: x\n")
    assert error == "hosts.yaml:5:5: hosts.demo.pyhton: unknown key (did you mean 'python'?)"


def test_an_unknown_transport_is_refused_at_its_key(tmp_path: Path) -> None:
    error = inventory_error(tmp_path, "hosts:\n  box:\n    repo: /r\n    transport: docker\n")
    assert error == "hosts.yaml:4:16: hosts.box.transport: must be 'ssh', 'local' or 'kubernetes'"


def test_every_host_kind_has_a_transport_that_opens_it_and_the_union_is_built_from_the_models_registry() -> None:
    members, _discriminator = typing.get_args(AnyHost)
    tags = {typing.get_args(member)[1].tag for member in typing.get_args(members)}
    assert tags == set(KINDS) == set(HOST_MODELS) == {"ssh", "local", "kubernetes"}
    for kind in KINDS:  # each kind's module opens it and says its own rows of `check`
        assert callable(opener(kind)) and callable(rows(kind))
    assert "container" in WRAPPERS and "container" not in KINDS  # a wrapper around any kind's exec, not a kind


def test_a_kubernetes_host_names_its_pod_container_namespace_and_context(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  bastion: {address: b.example, repo: /unused}\n"
                    "  sglang:\n    transport: kubernetes\n    repo: /sgl-workspace\n"
                    "    pod: {name: sglang-0, container: server, namespace: serving, context: prod}\n"
                    "    via: bastion\n")
    host = load_inventory(path).hosts["sglang"]
    assert isinstance(host, KubernetesHost)
    assert (host.pod.name, host.pod.container, host.pod.namespace, host.pod.context) == \
        ("sglang-0", "server", "serving", "prod")
    assert isinstance(host.via_host, SshHost) and host.via_host.address == "b.example"


def test_a_kubernetes_host_refuses_a_pod_and_a_selector_together_a_container_key_and_a_via_that_is_not_ssh(
        tmp_path: Path) -> None:
    both = inventory_error(tmp_path, "hosts:\n  k:\n    transport: kubernetes\n    repo: /r\n"
                           "    pod: {name: a, selector: app=x, container: c}\n")
    assert "give exactly one of 'name' (a pod) or 'selector'" in both
    wrapped = inventory_error(tmp_path, "hosts:\n  k:\n    transport: kubernetes\n    repo: /r\n"
                              "    pod: {name: a, container: c}\n    container: {engine: podman, name: box}\n")
    assert "names its container under 'pod:'" in wrapped
    local_via = inventory_error(tmp_path, "hosts:\n  l: {transport: local, repo: /l}\n  k:\n"
                                "    transport: kubernetes\n    repo: /r\n    pod: {name: a, container: c}\n"
                                "    via: l\n")
    assert local_via == "hosts.yaml:7:10: hosts.k.via: 'l' is not a host of transport ssh in the inventory " \
                        "(kubectl runs on a bastion reached over SSH)"


def demo_inventories(tmp_path: Path) -> list[dict[str, object]]:
    """The inventories `deployer demo` and `deployer demo --fleet` write, as they write them."""
    one = Inventory(hosts={"demo": DemoStack(tmp_path / "one", unit_ports(1)[0]).host()})
    fleet = fleet_inventory(fleet_stacks(tmp_path / "fleet"))
    return [yaml.safe_load(yaml.safe_dump(i.model_dump(exclude_defaults=True), sort_keys=False)) for i in (one, fleet)]


def test_the_demo_inventories_stay_local_when_written_and_read_back(tmp_path: Path) -> None:
    for index, data in enumerate(demo_inventories(tmp_path)):
        path = tmp_path / f"written-{index}.yaml"
        path.write_text(yaml.safe_dump(data))
        assert {type(h) for h in load_inventory(path).hosts.values()} == {LocalHost}


def test_the_inventory_schema_takes_the_example_and_demo_inventories_and_refuses_what_the_models_refuse(
        tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = schema_for("inventory")
    jsonschema.Draft202012Validator.check_schema(schema)
    for data in [yaml.safe_load((REPO / "hosts.yaml").read_text()), *demo_inventories(tmp_path)]:
        jsonschema.validate(data, schema)
    for bad in ({"transport": "local", "repo": "/r", "port": 22}, {"transport": "docker", "repo": "/r"},
                {"repo": "/r", "adress": "a"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"hosts": {"h": bad}}, schema)
