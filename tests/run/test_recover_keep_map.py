"""What recover keeps of a cut run's services is read from that run's log, which is input: only a process its
rollback's steps started (after the revert commit) is taken as serving the revert, never one its log also names as
started on the commit, and a record without a service name or an integer pid is no process at all."""

from __future__ import annotations

import json
from pathlib import Path

from deployer.run import serving

RUN = "20261204T000000.000Z-abcdef"


def logged(runs: Path, *events: dict[str, object]) -> None:
    (runs / RUN).mkdir(parents=True)
    (runs / RUN / "events.jsonl").write_text("".join(json.dumps({"seq": i, **e}) + "\n" for i, e in enumerate(events)))


def test_the_revert_keeps_only_what_the_rollbacks_steps_started_and_never_a_pid_started_on_the_commit(
        tmp_path: Path) -> None:
    logged(tmp_path,
           {"type": "run_start", "host": "box"},
           {"type": "service_started", "step": "co_restart", "service": "prefill", "pid": 100},
           {"type": "service_started", "step": "co_restart", "service": "decode", "pid": 101},
           {"type": "service_started", "step": "rollback:co_restart", "service": "prefill", "pid": 200},
           {"type": "service_started", "step": "rollback:co_restart", "service": "decode", "pid": 100},  # the fix's
           {"type": "service_started", "step": "rollback:co_restart", "service": "router", "pid": "7"},
           {"type": "service_started", "step": "rollback:co_restart", "pid": 300})
    assert serving.started(serving.logged(tmp_path, RUN), True) == {"prefill": 200}
    assert serving.started(serving.logged(tmp_path, RUN), False) == {"prefill": 100, "decode": 101}
    no_log = serving.logged(tmp_path, "20261204T000000.000Z-000000")
    assert serving.started(no_log, True) == {}  # no log here: nothing kept


def test_a_service_is_known_started_by_its_health_answer_and_never_by_a_pid_the_run_stopped(tmp_path: Path) -> None:
    logged(tmp_path,
           {"type": "run_start", "host": "box"},
           {"type": "service_phase", "step": "co_restart", "service": "prefill", "phase": "stopping", "pid": 50},
           {"type": "service_phase", "step": "co_restart", "service": "decode", "phase": "stopping", "pid": 51},
           {"type": "service_phase", "step": "co_restart", "service": "router", "phase": "stopping", "pid": 52},
           {"type": "service_healthy", "step": "co_restart", "service": "prefill", "pid": 100},
           {"type": "service_started", "step": "co_restart", "service": "prefill", "pid": 100},
           {"type": "service_healthy", "step": "co_restart", "service": "decode", "pid": 101},  # killed here
           {"type": "service_started", "step": "co_restart", "service": "router", "pid": 52},  # "started": the old
           {"type": "service_phase", "step": "rollback:co_restart", "service": "prefill", "phase": "loading",
            "pid": 200},
           {"type": "service_phase", "step": "rollback:co_restart", "service": "decode", "phase": "healthy",
            "pid": 201})  # killed right behind the live view's `healthy` line
    assert serving.started(serving.logged(tmp_path, RUN), False) == {"prefill": 100, "decode": 101}
    assert serving.started(serving.logged(tmp_path, RUN), True) == {"decode": 201}
