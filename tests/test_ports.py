"""The test ports' allocator: each xdist worker its own slice, out of the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest
from ports import ephemeral_low, free_port, free_ports, worker_slice


def test_workers_slices_are_disjoint_and_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for index in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        slices.append(set(worker_slice()))
    assert all(len(s) >= 100 for s in slices)
    assert sum(len(s) for s in slices) == len(set().union(*slices))
    assert max(max(s) for s in slices) < ephemeral_low()


def test_a_free_port_is_this_workers_binds_and_is_never_one_already_taken() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        ports = free_ports(100)
    assert taken not in ports
    assert len(set(ports)) == len(ports)
    assert set(ports) <= set(worker_slice())
