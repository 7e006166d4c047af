"""Inventory groups and units, and what `--host` / `--limit` name: config errors point into the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config import targets
from deployer.config.models import Inventory, load_inventory
from deployer.errors import ConfigError
from deployer.steps.playbook import parse_playbook

HOSTS = """\
hosts:
  gpu-a: {transport: local, repo: /r/a, services: {prefill: {start: "true"}}}
  gpu-b: {transport: local, repo: /r/b, services: {decode: {start: "true"}}}
  gpu-c: {transport: local, repo: /r/c, services: {router: {start: "true"}}}
  gpu-d: {transport: local, repo: /r/d}
  cpu-e: {transport: local, repo: /r/e}
"""


def inventory(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS + extra)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    return str(caught.value)


GOOD = """\
groups:
  pd-east: [gpu-a, gpu-b, gpu-c]
  all: [pd-east, gpu-d]
units:
  pd-1: {services: [gpu-a:prefill, gpu-b:decode, gpu-c:router], metrics: gpu-a}
"""


@pytest.fixture
def good(tmp_path: Path) -> Inventory:
    return load_inventory(inventory(tmp_path, GOOD))


@pytest.mark.parametrize("spec, hosts", [
    ("gpu-d", ["gpu-d"]),
    ("pd-east", ["gpu-a", "gpu-b", "gpu-c"]),
    ("all", ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]),
    ("pd-1", ["gpu-a", "gpu-b", "gpu-c"]),
    ("gpu-d,cpu-e,gpu-d", ["gpu-d", "cpu-e"]),
    ("gpu-*", ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]),
    ("cpu-e, pd-east", ["cpu-e", "gpu-a", "gpu-b", "gpu-c"]),
])
def test_host_names_a_host_a_group_a_unit_a_list_or_a_glob(good: Inventory, spec: str, hosts: list[str]) -> None:
    assert targets.resolve(good, spec) == hosts


def test_limit_narrows_and_keeps_the_order_of_host(good: Inventory) -> None:
    assert targets.resolve(good, "all", limit="gpu-d,gpu-a") == ["gpu-a", "gpu-d"]
    assert targets.resolve(good, "gpu-*", limit="pd-1") == ["gpu-a", "gpu-b", "gpu-c"]


def test_unknown_names_and_empty_selections_are_config_errors(good: Inventory) -> None:
    with pytest.raises(ConfigError, match=r"'gpu-z' is not a host, group or unit"):
        targets.resolve(good, "gpu-a,gpu-z")
    with pytest.raises(ConfigError, match=r"glob 'tpu-\*' matches no host"):
        targets.resolve(good, "tpu-*")
    with pytest.raises(ConfigError, match="--limit 'cpu-e' leaves no host of 'pd-east'"):
        targets.resolve(good, "pd-east", limit="cpu-e")
    with pytest.raises(ConfigError, match="empty"):
        targets.resolve(good, " , ")


def test_units_of_a_selection_group_their_hosts(good: Inventory) -> None:
    units = targets.units_of(good, ["gpu-d", "gpu-b"])
    assert units == {"pd-1": ["gpu-a", "gpu-b", "gpu-c"]}


def test_a_group_naming_an_unknown_host_points_at_the_entry(tmp_path: Path) -> None:
    path = inventory(tmp_path, "groups:\n  east: [gpu-a, gpu-q]\n")
    assert load_error(path) == f"{path}:8:17: groups.east.1: 'gpu-q' is not a host, group or unit"


def test_a_group_cycle_is_refused_and_named(tmp_path: Path) -> None:
    path = inventory(tmp_path, "groups:\n  a: [gpu-a, b]\n  b: [c]\n  c: [a]\n")
    assert load_error(path) == f"{path}:8:14: groups.a.1: groups form a cycle: a -> b -> c -> a"


def test_a_host_in_two_units_is_refused(tmp_path: Path) -> None:
    path = inventory(tmp_path, "units:\n  u1: {services: [gpu-a:prefill, gpu-b:decode]}\n"
                               "  u2: {services: [gpu-c:router, gpu-b:decode]}\n")
    assert load_error(path) == (f"{path}:9:33: units.u2.services.1: host 'gpu-b' is already in unit 'u1' "
                                "(a host belongs to one unit at most)")


@pytest.mark.parametrize("entry, problem", [
    ("gpu-q:prefill", "host 'gpu-q' is not in the inventory"),
    ("gpu-a:decode", "host 'gpu-a' has no service 'decode' (services: prefill)"),
    ("gpu-a", "a unit's service is HOST:SERVICE, such as gpu-a:prefill"),
])
def test_a_unit_naming_an_unknown_host_or_service_is_refused(tmp_path: Path, entry: str, problem: str) -> None:
    path = inventory(tmp_path, f"units:\n  u1: {{services: [{entry}]}}\n")
    assert load_error(path) == f"{path}:8:19: units.u1.services.0: {problem}"


def test_a_unit_metrics_host_must_be_one_of_its_hosts(tmp_path: Path) -> None:
    path = inventory(tmp_path, "units:\n  u1: {services: [gpu-a:prefill], metrics: gpu-d}\n")
    assert load_error(path) == f"{path}:8:44: units.u1.metrics: 'gpu-d' is not a host of unit 'u1' (gpu-a)"


def test_a_group_or_unit_named_like_a_host_is_refused(tmp_path: Path) -> None:
    path = inventory(tmp_path, "groups:\n  gpu-a: [gpu-b]\n")
    assert load_error(path) == f"{path}:8:3: groups.gpu-a: the name is already a host"
    path = inventory(tmp_path, "groups:\n  g: [gpu-b]\nunits:\n  g: {services: [gpu-a:prefill]}\n")
    assert load_error(path) == f"{path}:10:3: units.g: the name is already a group"


def write_playbook(tmp_path: Path, rollout: str) -> Path:
    (tmp_path / "a.py").write_text("x = 1\n")
    path = tmp_path / "fix.yaml"
    path.write_text(f"name: x\nfiles: [{{src: a.py, dest: a.py}}]\nsteps: [upload]\n{rollout}")
    return path


def test_rollout_batches_split_hosts_canary_first(tmp_path: Path) -> None:
    model, _, _ = parse_playbook(write_playbook(
        tmp_path, "rollout: {batches: [1, '25%', '100%'], max_failures: 1, pause_s: 0.5}\n"
                  "on_failure: rollback_fleet\n"))
    assert model.rollout.max_failures == 1 and model.on_failure == "rollback_fleet"
    hosts = [f"h{i}" for i in range(9)]
    assert model.rollout.split(hosts) == [["h0"], ["h1", "h2", "h3"], hosts[4:]]
    assert model.rollout.split(hosts[:2]) == [["h0"], ["h1"]]


def test_without_rollout_every_host_is_one_batch(tmp_path: Path) -> None:
    model, _, _ = parse_playbook(write_playbook(tmp_path, ""))
    assert model.rollout.split(["a", "b", "c"]) == [["a", "b", "c"]]


def test_a_last_batch_repeats_until_every_host_is_in_one(tmp_path: Path) -> None:
    model, _, _ = parse_playbook(write_playbook(tmp_path, "rollout: {batches: [1, 2]}\n"))
    assert model.rollout.split(list("abcdef")) == [["a"], ["b", "c"], ["d", "e"], ["f"]]


@pytest.mark.parametrize("batches, problem", [("['0%']", "above 0%"), ("[0]", "at least 1"),
                                              ("['150%']", "at most 100%"), ("[]", "must not be empty"),
                                              ("['x']", "a host count or a percentage")])
def test_bad_batches_are_refused_with_their_position(tmp_path: Path, batches: str, problem: str) -> None:
    path = write_playbook(tmp_path, f"rollout: {{batches: {batches}}}\n")
    with pytest.raises(ConfigError) as caught:
        parse_playbook(path)
    assert str(caught.value).startswith(f"{path}:4:") and problem in str(caught.value)


def test_a_selection_taking_part_of_a_unit_is_refused(good: Inventory) -> None:
    assert targets.whole_units(good, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]) == {"pd-1": ["gpu-a", "gpu-b", "gpu-c"]}
    with pytest.raises(ConfigError, match=r"takes part of unit 'pd-1' .* but not gpu-c: a unit is deployed"):
        targets.whole_units(good, ["gpu-a", "gpu-b"])


def test_in_a_unit_co_restart_names_unit_services_and_each_host_gets_its_part(tmp_path: Path,
                                                                              good: Inventory) -> None:
    from deployer.fleet.unit import steps_for
    from deployer.steps.services.co_restart import UnitRestart

    (tmp_path / "a.py").write_text("x = 1\n")
    path = tmp_path / "fix.yaml"
    path.write_text("name: x\nfiles: [{src: a.py, dest: a.py}]\nsteps:\n  - upload\n  - commit: {message: m}\n"
                    "  - co_restart: {services: [decode, prefill]}\n  - drain: {metric: g, to: 0}\n")
    _, steps, _ = parse_playbook(path)
    unit = good.units["pd-1"]
    parts = {h: steps_for(steps, "pd-1", unit, h) for h in unit.hosts()}
    assert [s.kind for s in parts["gpu-a"]] == ["upload", "commit", "co_restart", "drain"]
    assert [s.kind for s in parts["gpu-b"]] == ["upload", "commit", "co_restart"]  # drain: the metrics host only
    restarts = {h: next(s for s in p if isinstance(s, UnitRestart)).here for h, p in parts.items()}
    assert restarts == {"gpu-a": ["prefill"], "gpu-b": ["decode"], "gpu-c": []}
    path.write_text(path.read_text().replace("[decode, prefill]", "[decode, nope]"))
    _, steps, _ = parse_playbook(path)
    with pytest.raises(ConfigError) as caught:
        steps_for(steps, "pd-1", unit, "gpu-a")
    assert str(caught.value) == (f"{path}:6:5: co_restart: unit pd-1 has no service nope "
                                 "(it has: gpu-a:prefill, gpu-b:decode, gpu-c:router)")


# A router refused as a whole is pointed at where its mapping starts (its `host:`, line 9).
ROUTER = "routers:\n  r:\n    host: gpu-c\n    url: http://127.0.0.1:30000\n"


@pytest.mark.parametrize("calls, problem", [
    ("    api: sglang-router\n    remove: [drop, '{worker}']\n",
     "9:5: routers.r: remove: only for api http or command (api sglang-router knows its calls)"),
    ("    remove: {path: /out}\n    add: {path: /in}\n",
     "9:5: routers.r: remove, add: only for api http or command (api sglang-gateway knows its calls)"),
    ("    api: http\n    remove: {path: /out}\n    add: [in]\n    list: {path: /ls}\n",
     "9:5: routers.r: api http needs `add:` as {method, path, body}"),
    ("    api: http\n    remove: {path: /out}\n    add: {path: /in}\n    list: [ls]\n",
     "9:5: routers.r: api http needs `list:` as {path, urls}"),
    ("    api: command\n    remove: [out]\n    add: [in]\n",
     "9:5: routers.r: api command needs `list:` as an argv list"),
])
def test_a_router_whose_calls_do_not_fit_its_api_is_refused_at_its_line(tmp_path: Path, calls: str,
                                                                        problem: str) -> None:
    path = inventory(tmp_path, ROUTER + calls)
    assert f"{path}:{problem}" in load_error(path)


def test_a_router_whose_calls_fit_its_api_loads(tmp_path: Path) -> None:
    path = inventory(tmp_path, ROUTER + "    api: command\n    remove: [out, '{worker}']\n    add: [in, '{worker}']\n"
                                        "    list: [ls]\n")
    assert load_inventory(path).routers["r"].remove == ["out", "{worker}"]
