"""A service's GPU settings in the inventory: refused with file:line:column and the field, before any connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.config.models import load_inventory
from deployer.errors import ConfigError


def refused(tmp_path: Path, services: str) -> list[str]:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  h:\n    repo: /r\n    services:\n{services}")
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    return [line.replace(f"{path}:", "") for line in str(caught.value).splitlines()]


def test_gpu_settings_default_to_an_idle_reading_and_a_two_minute_wait(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  h:\n    repo: /r\n    services:\n      prefill: {start: x, gpus: [0, 1]}\n")
    service = load_inventory(path).hosts["h"].services["prefill"]
    assert (service.gpus, service.gpu_free_mib, service.gpu_wait_s) == ([0, 1], None, 120.0)


def test_gpu_settings_without_gpus_name_the_field_that_would_do_nothing(tmp_path: Path) -> None:
    assert refused(tmp_path, "      prefill: {start: x, gpu_free_mib: 70000}\n") == [
        "5:41: hosts.h.services.prefill.gpu_free_mib: 'gpu_free_mib' needs 'gpus' (the GPU indices "
        "to wait for) on the same service"]
    assert refused(tmp_path, "      prefill:\n        start: x\n        gpu_wait_s: 300\n")[0].startswith(
        "7:21: hosts.h.services.prefill.gpu_wait_s: 'gpu_wait_s' needs 'gpus'")


def test_bad_gpu_indices_and_budgets_are_refused_where_they_are_written(tmp_path: Path) -> None:
    lines = refused(tmp_path, "      a: {start: x, gpus: [0, 0]}\n      b: {start: x, gpus: [-1]}\n"
                              "      c: {start: x, gpus: [0], gpu_wait_s: 0, gpu_free_mib: 0}\n")
    assert lines[0] == "5:27: hosts.h.services.a.gpus: names a GPU twice: [0, 0]"
    assert lines[1] == "6:28: hosts.h.services.b.gpus.0: must be 0 or more, got -1"
    assert sorted(lines[2:]) == [
        "7:44: hosts.h.services.c.gpu_wait_s: must be greater than 0, got 0",
        "7:61: hosts.h.services.c.gpu_free_mib: must be greater than 0, got 0"]
