"""What a run starts on the target ends with it: the target's python, and whatever that python left behind
(a wrapper's background child), locally and over sshd, whether the agent ran or never answered.

A `python:` may be a wrapper script; these record the pids they start in a file, so the test can see them go."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import textwrap
from pathlib import Path

from fixtures_repo import FIXED_A, ORIGINAL_A, Project
from fixtures_services import wait_dead
from polling import within

# The wrapper's own sh runs the agent (exec): its background sleep is the agent python's child.
BACKGROUNDS = textwrap.dedent("""\
    #!/bin/sh
    case "$*" in *AGENT_SOURCE*)
        sleep 300 </dev/null >/dev/null 2>&1 &
        echo $! >> {pids} ;;
    esac
    exec {python} "$@"
""")

# A python that starts, greets on stdout as no agent does, and never answers nor exits. It drains its stdin (one
# that does not fails the same way, once the client's first write gives up on it: a minute later); a background
# command's stdin is /dev/null unless it names another.
NEVER_ANSWERS = textwrap.dedent("""\
    #!/bin/sh
    echo $$ >> {pids}
    sleep 300 </dev/null >/dev/null 2>&1 &
    echo $! >> {pids}
    exec 3<&0
    cat <&3 >/dev/null &
    echo "Python wrapper 1.0 ready"
    wait
""")

# Polled: the group goes when the python exits, or when the run gives up on it, at no moment the test knows.
GONE_WITHIN_S = 30.0


def wrapper(project: Project, body: str) -> tuple[str, Path]:
    pids = project.root / "wrapper.pids"
    path = project.write("wrapper/python", body.format(python=sys.executable, pids=pids))
    path.chmod(0o755)
    return str(path), pids


def recorded(pids: Path, count: int) -> list[int]:
    assert within(lambda: pids.exists() and len(pids.read_text().split()) >= count, GONE_WITHIN_S), \
        f"the wrapper did not record {count} pids"
    return [int(word) for word in pids.read_text().split()]


def kill_left(pids: Path) -> None:
    for pid in [int(word) for word in pids.read_text().split()] if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_background_child_of_the_targets_python_ends_when_a_successful_apply_ends(target: Project) -> None:
    python, pids = wrapper(target, BACKGROUNDS)
    target.write_inventory(python=python)
    target.playbook()
    try:
        result = target.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode == 0, result.stdout + result.stderr
        assert target.file("pkg/a.py") == FIXED_A
        [child] = recorded(pids, 1)
        assert wait_dead(child, GONE_WITHIN_S), f"the python's child {child} outlived the run"
    finally:
        kill_left(pids)


def test_a_python_that_never_answers_ends_with_its_child_when_the_failed_apply_ends(target: Project) -> None:
    python, pids = wrapper(target, NEVER_ANSWERS)
    target.write_inventory(python=python)
    target.playbook()
    head = target.head()
    try:
        result = target.deployer("apply", "fix.yaml", "--host", "box")
        assert result.returncode != 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert target.file("pkg/a.py") == ORIGINAL_A and target.head() == head
        started = recorded(pids, 2)
        left = [pid for pid in started if not wait_dead(pid, GONE_WITHIN_S)]
        assert not left, f"{left} of the python {started[0]} and its child outlived the run"
    finally:
        kill_left(pids)
