"""A gang's start: every rank of one server launched at once, healthy when its leader is.

The ranks of a multi-node server wait for each other at the rendezvous, so starting them one after the other,
each waiting to be healthy, would never finish: they are launched concurrently, each on its own host's
connection. Only the leader (rank 0) serves HTTP; the others are up once their process runs, and from then on
the leader's wait asks, each round, whether they still run. When a rank exits during the start, rank 0 does not
(sglang#3099: it waits on at the rendezvous): so every member is stopped and the failure names the one that
died.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from deployer.errors import StepFailed
from deployer.steps.services.manager import Manager
from deployer.waiting import joined


def member(m: Manager) -> str:
    return f"{m.ctx.host_name}:{m.name}"


class GangStart:
    def __init__(self, members: list[Manager], leader: Manager, tags: Mapping[str, str]) -> None:
        self.members, self.leader, self.tags = members, leader, tags
        self.new: dict[Manager, int] = {}
        self.failures: list[tuple[Manager, StepFailed]] = []  # the first is what the gang's failure names
        self.lock = threading.Lock()

    def failed(self, m: Manager, failure: StepFailed) -> StepFailed:
        with self.lock:
            if not self.failures:
                self.failures.append((m, failure))
            return self.failures[0][1]

    def watch(self) -> None:
        """Each round of the leader's wait: end it when another member failed or no longer runs."""
        if self.failures:
            raise self.failures[0][1]
        for m, pid in list(self.new.items()):
            if m is not self.leader and not m.still_runs(pid):
                raise self.failed(m, m.fail(f"exited during the gang's start (pid {pid}; its peers wait at the "
                                            "rendezvous for it)"))

    def start(self, m: Manager) -> None:
        try:
            m.ctx.cancel.check()
            pid = m.start()
        except StepFailed as exc:
            self.failed(m, exc)
            return
        with self.lock:
            self.new[m] = pid
        m.ctx.emit("service_started", service=m.name, pid=pid, **self.tags)

    def run(self) -> dict[Manager, int]:
        """Start every member at once; each one's new pid, or StepFailed naming the member that failed, once
        every member was stopped again."""
        self.leader.watch = self.watch
        threads = [threading.Thread(target=self.start, args=(m,), name=f"deployer-gang-{member(m)}")
                   for m in self.members]
        for thread in threads:
            thread.start()
        for thread in threads:
            joined(thread)
        self.leader.watch = None
        if not self.failures:
            return self.new
        for m, pid in self.new.items():  # a leader that failed was already reaped by its own start
            m.stop(pid)
        dead, failure = self.failures[0]
        cause = str(failure).split("\n", 1)[0].partition(" failed: ")[2]
        raise StepFailed(failure.step, f"gang member {member(dead)} failed: {cause}; stopped every member of the "
                         f"gang ({', '.join(member(m) for m in self.members)})", stderr_tail=failure.stderr_tail,
                         tail_label=failure.tail_label)
