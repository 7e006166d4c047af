"""`deployer check`'s reports: one host's checks, or one row per host."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from deployer.ui.console import columns, show_error

if TYPE_CHECKING:
    from deployer.app.checks import CheckReport, GroupReport


def show_check(console: Console, report: CheckReport) -> None:
    marks = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}
    first = report.first_problem
    said_below = first is not None and bool(first.message)  # a refusal's whole message: said once, as the error
    rows = [(report.host, c.name, marks[c.status], "see the error below" if said_below and c is first else c.detail)
            for c in report.checks]
    columns(console, ("host", "check", "status", "detail"), rows)
    if first is None:
        console.print(f"{report.host}: ready to deploy", markup=False, highlight=False)
    else:
        detail = "" if said_below else f": {first.detail}"
        console.print(f"{report.host}: not ready: {first.name}{detail} (exit {first.exit_code})",
                      markup=False, highlight=False)
        if first.message:
            show_error(first.message)


def show_check_group(console: Console, group: GroupReport) -> None:
    """One row per host: ready, or its first problem and the exit code that problem has."""
    rows = []
    for report in group.reports:
        first = report.first_problem
        if first is None:
            warned = [f"{c.name}: {c.detail}" for c in report.checks if c.status == "warn"]
            rows.append((report.host, "ready", "0", "; ".join(f"warn: {w}" for w in warned) or "-"))
        else:
            more = sum(c.status == "fail" for c in report.checks) - 1
            rows.append((report.host, "FAIL", str(first.exit_code),
                         f"{first.name}: {first.detail}{f' (+{more} more)' if more else ''}"))
    columns(console, ("host", "status", "exit", "detail"), rows)
    ready = sum(r.first_problem is None for r in group.reports)
    found = group.first_problem
    tail = "" if found is None else f"; first problem: {found[0]}: {found[1].name} (exit {found[1].exit_code})"
    console.print(f"{ready} of {len(group.reports)} hosts ready to deploy{tail}", markup=False, highlight=False)
