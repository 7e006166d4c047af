"""A storm is sent from this machine to the target's loopback: on a pod, through `kubectl port-forward` (the pod's
loopback is its own), so a storm (its own step or a baseline's) on a kubernetes host passes the inventory check as
on any host with an endpoint (tests/transport/test_kubernetes_pod_commands.py sends one)."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.config.models import KubernetesHost
from deployer.steps import optional
from deployer.steps.kinds import KINDS

POD: dict[str, Any] = {"transport": "kubernetes", "repo": "/sgl-workspace/sglang", "python": "python3",
                       "pod": {"name": "decode-0", "container": "server", "namespace": "serving"},
                       "endpoint": "http://127.0.0.1:30000", "metrics": "http://127.0.0.1:30000/metrics"}


def made(kind: str, params: dict[str, Any]) -> Any:
    cls = KINDS[kind]
    return cls(cls.Params.model_validate(params), where="fix.yaml:3:5", name=kind)


@pytest.mark.parametrize(("kind", "params"), [("storm", {"requests": 10}),
                                              ("baseline", {"metric": "m", "storm": {"requests": 10}}),
                                              ("baseline", {"metric": "m"})])
def test_a_storm_on_a_pod_with_an_endpoint_passes_the_inventory_check(kind: str, params: dict[str, Any]) -> None:
    assert optional.check_host(made(kind, params), "decode", KubernetesHost.model_validate(POD)) is None


def test_a_storm_on_a_pod_without_an_endpoint_is_refused_for_that() -> None:
    pod = KubernetesHost.model_validate({k: v for k, v in POD.items() if k != "endpoint"})
    said = optional.check_host(made("storm", {"requests": 10}), "decode", pod)
    assert said is not None and "endpoint" in said
