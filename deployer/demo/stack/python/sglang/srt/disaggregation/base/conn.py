"""The states a KV transfer moves through, as the prefill scheduler and decode side poll them.

The values are ordered on purpose: progress only ever moves to a larger number, which is what
lets the KV manager merge concurrent status writes with ``max``. ``Failed`` is the exception
(it sorts lowest yet must win), and that asymmetry is where the terminal-sticky bug lives.
"""

from __future__ import annotations


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


def poll_name(status: int | None) -> str:
    """Human-readable name of a status, for logs and JSON answers."""
    names = {
        KVPoll.Failed: "Failed",
        KVPoll.Bootstrapping: "Bootstrapping",
        KVPoll.WaitingForInput: "WaitingForInput",
        KVPoll.Transferring: "Transferring",
        KVPoll.Success: "Success",
    }
    return "Unknown" if status is None else names.get(status, f"Unknown({status})")
