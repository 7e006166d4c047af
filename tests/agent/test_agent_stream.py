"""A hostile or broken agent stream fails the run at once, with a clear message, and memory stays bounded.

The stand-in agent is a real process in the target python's place: it runs the real agent and relays its
replies, but puts a crafted frame (or the end of its output) in place of one of them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, git, wait_until_lock_stale

# A correctness bound, not a performance target: today's reply timeouts are 35 s and more.
FAST_S = 10.0
RSS_LIMIT_KB = 200 * 1024
HUGE = 250 << 20  # under the client's absolute cap of 256 MiB, far over what any request of a run may get

STAND_IN = textwrap.dedent('''\
    #!{python}
    import json, os, struct, subprocess, sys, threading
    REAL, MODE, AFTER, UNTIL = {python!r}, {mode!r}, {after!r}, {until!r}
    if len(sys.argv) < 5 or "AGENT_SOURCE" not in sys.argv[4]:  # a step's own python: the real one
        os.execv(REAL, [REAL, *sys.argv[1:]])
    HEADER = struct.Struct(">I")
    # stdin: ours, untouched; stderr relayed, so that closing ours ends all the output the target sends
    agent = subprocess.Popen([REAL, *sys.argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = sys.stdout.buffer
    threading.Thread(target=lambda: [os.write(2, line) for line in agent.stderr], daemon=True).start()

    def crafted(real):
        if MODE == "list":
            return b"[1, 2, 3]"
        if MODE == "deep":  # far deeper than any parser's recursion limit
            return b'{{"id": %d, "ok": true, "result": ' % real["id"] + b"[" * 200000 + b"]" * 200000 + b"}}"
        raise AssertionError(MODE)

    def relay():
        armed, hello = AFTER is None, False
        while True:
            head = agent.stdout.read(4)
            if len(head) < 4:
                return
            body = agent.stdout.read(HEADER.unpack(head)[0])
            if not (armed and hello):  # the hello always goes through (and an ask for the source before it)
                out.write(head + body)
                out.flush()
                hello = hello or b'"sha256"' in body
                armed = armed or AFTER.encode() in body
                continue
            while UNTIL is not None:  # the agent answered it: the client had sent it before it read the break
                later = agent.stdout.read(4)
                if len(later) < 4 or UNTIL.encode() in agent.stdout.read(HEADER.unpack(later)[0]):
                    break
            if MODE == "close":  # both streams: sshd sends no end of output while stderr stays open
                out.close()
                os.close(1)
                os.close(2)
                return stop()
            if MODE == "huge":
                lead = b'{{"id": %d, "ok": true, "result": {{"stdout": "' % json.loads(body)["id"]
                out.write(HEADER.pack({huge}) + lead)
                out.flush()
                stop()
                while True:  # until the reader gives up on it and the pipe closes
                    out.write(b"A" * (1 << 20))
            bad = crafted(json.loads(body))
            out.write(HEADER.pack(len(bad)) + bad)
            out.flush()
            return stop()

    def stop():
        # Past a change, the agent goes with its stream: left running, it would go on with what was pipelined
        # behind the broken reply (a commit sent ahead) until the client's close reached it, and whether that
        # commit landed would be a race, not what the test is about.
        if AFTER is not None:
            agent.kill()

    threading.Thread(target=relay, daemon=True).start()
    agent.wait()  # the real agent exits when its stdin closes: so do we, even with the relay stuck in a write
    os._exit(0)
''')

# Reports the peak RSS of the deployer it runs (its own children are counted in, when it waited for them).
MEASURED = textwrap.dedent("""\
    import resource, subprocess, sys
    done = subprocess.run([sys.executable, "-m", "deployer", *sys.argv[2:]])
    open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
    sys.exit(done.returncode)
""")


def stand_in(project: Project, mode: str, after: str | None = None, until: str | None = None) -> str:
    """A target python whose agent breaks its stream the reply after one holding `after` (None: the first
    reply after the hello, before anything changed); with `until`, the break waits for a later reply holding
    that, and the replies in between are never seen."""
    path = project.write("standin/python", STAND_IN.format(python=sys.executable, mode=mode, after=after, huge=HUGE,
                                                           until=until))
    path.chmod(0o755)
    return str(path)


def apply_measured(project: Project, *extra: str) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """apply, its wall time and its peak RSS in KiB."""
    rss = project.root / "rss_kb"
    env = project.env()
    started = time.monotonic()
    argv = [sys.executable, "-c", MEASURED, str(rss), "apply", "fix.yaml", "--host", "box", *extra]
    # A session of its own: on a timeout the deployer under the wrapper (and its agent) go too.
    with subprocess.Popen(argv, cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    return done, time.monotonic() - started, int(rss.read_text())


SAID = {"close": "the agent closed its output",
        "list": "a reply that is a JSON list, not an object: the stream is broken",
        "deep": "a reply nested too deeply to read: the stream is broken",
        "huge": f"a reply of {HUGE} bytes where at most"}


@pytest.mark.parametrize("mode", ["huge", "list", "deep", "close"])
def test_a_broken_agent_stream_before_any_change_fails_the_run_at_once_with_exit_4(target: Project,
                                                                                   mode: str) -> None:
    target.write_inventory(python=stand_in(target, mode))
    target.playbook()
    head = target.head()
    # --allow-dirty: the changes wait for preflight's answers (a chain sent whole does not: the next test).
    result, elapsed, rss_kb = apply_measured(target, "--allow-dirty")
    assert result.returncode == 4, result.stdout + result.stderr
    assert elapsed < FAST_S, f"took {elapsed:.1f}s"
    assert f"box: agent lost during 'run': {SAID[mode]}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr  # no reader thread died on it
    assert rss_kb < RSS_LIMIT_KB, f"deployer peaked at {rss_kb // 1024} MiB"
    assert target.file("pkg/a.py") == ORIGINAL_A and target.head() == head


@pytest.mark.parametrize("mode", ["list", "close"])
def test_a_broken_stream_before_any_answer_to_a_chain_sent_whole_says_what_it_may_have_done_and_recover_ends_it(
        target: Project, mode: str) -> None:
    # The agent runs on behind its broken stream until the client's close reaches it: the chain sent with the lock
    # may have run in part, or to its commit and release. The run cannot know; it says so, and recover reads it.
    # The break waits for the premise's answer (its files' new_blob): a client that read it before sending the
    # chain sent nothing of it, and rightly says that instead (exit 4), which is not what this test is about.
    target.write_inventory(python=stand_in(target, mode, until='"new_blob"'), lock_ttl_s=2)
    target.playbook()
    head = target.head()
    result, elapsed, rss_kb = apply_measured(target)
    assert result.returncode == 6, result.stdout + result.stderr
    assert elapsed < FAST_S, f"took {elapsed:.1f}s"
    assert rss_kb < RSS_LIMIT_KB, f"deployer peaked at {rss_kb // 1024} MiB"
    assert SAID[mode] in result.stderr and "its premise's answer was lost" in result.stderr, result.stderr
    run_id = next(Path(target.runs).iterdir()).name
    assert f"deployer recover {run_id}" in result.stderr and "Traceback" not in result.stderr
    target.write_inventory()  # a sound agent again
    wait_until_lock_stale(target.repo, 2)
    recovered = target.deployer("recover", run_id)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    if target.head() == head:
        assert target.file("pkg/a.py") == ORIGINAL_A, "no commit, yet the file was not restored"
    else:
        assert git(target.repo, "rev-parse", "HEAD~1").strip() == head and target.file("pkg/a.py") == FIXED_A
    assert git(target.repo, "status", "--porcelain") == ""
    assert not (target.repo / ".git" / "deployer" / "inflight.json").exists()
    verified = target.deployer("runs", "verify", run_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("mode", ["huge", "list", "close"])
def test_a_broken_agent_stream_after_the_upload_fails_at_once_and_recover_restores(target: Project,
                                                                                   mode: str) -> None:
    # The reply after the upload's put of pkg/a.py (staged beside it for remote_compile): remote_compile's.
    # A short lock TTL: recover takes the lock over once the cut run's heartbeat is that old.
    target.write_inventory(python=stand_in(target, mode, after='/pkg/.a.py.deployer-staged-'), lock_ttl_s=2)
    target.playbook()
    result, elapsed, rss_kb = apply_measured(target)
    # The usual restore is tried over the same, broken, stream: it cannot run, and the message says how to end it.
    assert result.returncode == 6, result.stdout + result.stderr
    assert elapsed < FAST_S, f"took {elapsed:.1f}s"
    assert SAID[mode] in result.stderr and "deployer recover" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert rss_kb < RSS_LIMIT_KB, f"deployer peaked at {rss_kb // 1024} MiB"
    run_id = next(Path(target.runs).iterdir()).name
    target.write_inventory()  # a sound agent again
    wait_until_lock_stale(target.repo, 2)
    recovered = target.deployer("recover", run_id)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert target.file("pkg/a.py") == ORIGINAL_A
