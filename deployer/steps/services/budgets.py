"""Health budgets against what starts really take: each service's last time to healthy, as the newest run on
the host that recorded one says (its `service_healthy` event), for `check` and `plan` to show beside the
budget, warning when the budget is below it (the next start would be killed before it is ready)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from deployer.config.models import Host
from deployer.errors import DeployerError
from deployer.runlog import EVENTS, is_run_id, read_run

NEWEST = 50  # run dirs looked at, newest first: enough for every service of a host, never the whole history


@dataclass(frozen=True)
class Timing:
    """A service's last time to healthy in a run, against its budget."""
    service: str
    seconds: float  # its last time to healthy
    run_id: str  # the run that recorded it
    budget_s: float  # its health budget now (the inventory's health_timeout_s)

    @property
    def short(self) -> bool:
        return self.budget_s < self.seconds

    def document(self) -> dict[str, object]:
        return {**vars(self), "short": self.short}

    def describe(self) -> str:
        text = f"last healthy after {self.seconds:g}s (run {self.run_id}); budget {self.budget_s:g}s"
        if self.short:
            text += (": below it, so the next start is likely killed before it is ready (raise health_timeout_s, "
                     "or pass --health-timeout S)")
        return text


def last_times(runs_dir: Path, host_name: str, host: Host, newest: int = NEWEST) -> list[Timing]:
    """The last time to healthy of each of the host's services that one of its newest runs recorded."""
    if not runs_dir.is_dir():
        return []
    found: dict[str, Timing] = {}
    names = sorted((p.name for p in runs_dir.iterdir() if is_run_id(p.name) and (p / EVENTS).is_file()),
                   reverse=True)
    for name in names[:newest]:
        try:
            run = read_run(runs_dir, name)
        except DeployerError:
            continue  # a log that cannot be read is `runs verify`'s to report
        if run.start.get("host") != host_name:
            continue
        for event in reversed(run.all("service_healthy")):
            service, seconds = event.get("service"), event.get("seconds")
            # A log is input too: only a known service and a real number count.
            if (service in host.services and service not in found and isinstance(seconds, int | float)
                    and math.isfinite(seconds) and seconds >= 0):
                found[service] = Timing(service, float(seconds), name, host.services[service].health_timeout_s)
        if len(found) == len(host.services):
            break
    return [found[s] for s in host.services if s in found]
