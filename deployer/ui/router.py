"""A unit's router steps (taken out, seen unlisted, drained, put back, seen listed) as one line each. The worker
URLs a router listed are its input: shown escaped."""

from __future__ import annotations

from typing import Any

from deployer.text import visible

ROUTER_EVENTS = ("router_remove", "router_listed", "worker_inflight", "router_add")


def url(value: object) -> str:
    return visible(str(value), multiline=False)  # a control character escaped, never a line of its own


def inflight_text(event: dict[str, Any]) -> str:
    """`worker http://127.0.0.1:30001 (gpu-a:prefill) in flight: 2, 1.5s of 20s`: a drain's wait in one line."""
    value = event.get("value")
    count = "unreadable" if value is None else f"{float(value):g}"
    clock = f", {float(event.get('elapsed_s') or 0.0):.1f}s" + (
        f" of {float(event['budget_s']):g}s" if event.get("budget_s") is not None else "")
    return f"worker {url(event['worker'])} ({event['service']}) in flight: {count}{clock}"


def owner(event: dict[str, Any]) -> str:
    """Whose workers a router event is about: `unit pd-1`, or `host gpu-e` for a plain host's unit of one (named as
    the host, whose events it emits; no unit may take a host's name)."""
    unit = str(event["unit"])
    return f"host {unit}" if unit == event.get("host") else f"unit {unit}"


def router_line(event: dict[str, Any]) -> str | None:
    """The plain line of a router event (None: not one)."""
    kind = event.get("type")
    if kind not in ROUTER_EVENTS:
        return None
    where = f"[router {event['router']}]" + (f" {owner(event)}:" if event.get("unit") else "")
    if kind == "router_remove":
        return f"{where} removed worker {url(event['worker'])} ({event['service']})"
    if kind == "router_add":
        return f"{where} added worker {url(event['worker'])} ({event['service']})"
    if kind == "router_listed":
        listed = ", ".join(url(w) for w in event.get("workers") or []) or "none"
        return f"{where} seen to {event['check']}: lists {listed}"
    return f"{where} {inflight_text(event)}"
