"""A storm is sent from this machine through a tunnel to the target's loopback: a pod's loopback is its own, which
kubectl exec does not reach, so a storm (its own step or a baseline's) on a kubernetes host is refused with the
inventory check, before anything connects — not sent to this machine's (or a bastion's) own loopback."""

from __future__ import annotations

from typing import Any

import pytest

from deployer.config.models import KubernetesHost, LocalHost
from deployer.steps import optional
from deployer.steps.kinds import KINDS

POD: dict[str, Any] = {"transport": "kubernetes", "repo": "/sgl-workspace/sglang", "python": "python3",
                       "pod": {"name": "decode-0", "container": "server", "namespace": "serving"},
                       "endpoint": "http://127.0.0.1:30000", "metrics": "http://127.0.0.1:30000/metrics"}


def made(kind: str, params: dict[str, Any]) -> Any:
    cls = KINDS[kind]
    return cls(cls.Params.model_validate(params), where="fix.yaml:3:5", name=kind)


@pytest.mark.parametrize(("kind", "params"), [("storm", {"requests": 10}),
                                              ("baseline", {"metric": "m", "storm": {"requests": 10}})])
def test_a_storm_on_a_pod_is_refused_before_anything_connects(kind: str, params: dict[str, Any]) -> None:
    said = optional.check_host(made(kind, params), "decode", KubernetesHost.model_validate(POD))
    assert said is not None and "a pod's loopback is its own" in said


def test_the_same_storm_on_a_host_that_reaches_its_endpoint_is_not_refused() -> None:
    local = LocalHost.model_validate({**{k: v for k, v in POD.items() if k != "pod"}, "transport": "local"})
    assert optional.check_host(made("storm", {"requests": 10}), "box", local) is None
    # A baseline without a storm reads the pod's metrics through the agent in it: nothing to refuse.
    assert optional.check_host(made("baseline", {"metric": "m"}), "decode", KubernetesHost.model_validate(POD)) is None
