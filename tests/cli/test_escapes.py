"""Text from the target never drives the operator's terminal: control characters are shown, not obeyed.

A hostile target answers with OSC 0 (window title), CSI 2J (clear screen) and OSC 52 (clipboard write),
and with rich markup; deployer must print them as visible escapes (`\\x1b`) and literal brackets, on a
pipe and on a terminal (a real pty)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

from fixtures_repo import Project, git, target_python
from ports import free_port

# The octal form goes into shell commands (printf), so the config files themselves hold no control bytes.
HOSTILE_PRINTF = r"\033]0;pwned\007\033[2J\033]52;c;cHduZWQ=\007[bold]loud[/bold]"
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07[bold]loud[/bold]"
C1 = {chr(c) for c in range(0x80, 0xA0)}


def on_pty(project: Project, *args: str, timeout: float = 120) -> tuple[int, str]:
    """The CLI run with stdout and stderr on a pseudo-terminal (rich sees a terminal); its exit code and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {**project.env(), "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    env.pop("CI", None)  # rich treats CI as "not interactive"; this test wants the terminal path
    proc = subprocess.Popen([sys.executable, "-m", "deployer", *args], cwd=project.root, env=env,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def assert_shown_not_obeyed(output: str, *, terminal: bool) -> None:
    if terminal:  # rich's own styling and cursor moves are ESC sequences too; the target's are not among them
        assert "\x1b]" not in output and "\x1b[2J" not in output
    else:
        assert "\x1b" not in output
    assert "\x07" not in output and not C1 & set(output)
    assert "\\x1b]0;pwned" in output and "\\x1b[2J" in output and "\\x1b]52;c;" in output


def both_ways(project: Project, *args: str, code: int) -> None:
    piped = project.deployer(*args)
    assert piped.returncode == code, piped.stdout + piped.stderr
    assert_shown_not_obeyed(piped.stdout + piped.stderr, terminal=False)
    assert "[bold]loud[/bold]" in piped.stdout + piped.stderr  # markup in the text stays text
    returned, output = on_pty(project, *args)
    assert returned == code, output
    assert_shown_not_obeyed(output, terminal=True)


def test_a_remote_compile_error_from_the_target_is_shown_escaped_in_apply_and_runs_show(target: Project) -> None:
    target.write_inventory(python=target_python(target, f"printf '{HOSTILE_PRINTF}\\n' >&2; exit 1"))
    target.playbook(steps=["local_compile", "upload", "remote_compile"])
    both_ways(target, "apply", "fix.yaml", "--host", "box", code=1)
    both_ways(target, "runs", "show", target.newest_run(), code=0)


def test_a_service_log_tail_from_the_target_is_shown_escaped(target: Project) -> None:
    port = free_port()
    target.write_inventory(services={"prefill": {
        "start": ["sh", "-c", f"printf '{HOSTILE_PRINTF}\\n'; exit 3"],
        "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 5}})
    target.playbook(steps=[{"co_restart": {"services": ["prefill"]}}])
    both_ways(target, "apply", "fix.yaml", "--host", "box", code=1)  # no commit yet: restored


def test_a_commit_subject_from_the_target_is_shown_escaped_in_check_and_rollback_list(target: Project) -> None:
    (target.repo / "README").write_text("changed by hand\n")
    git(target.repo, "commit", "-q", "-am", f"{HOSTILE}\n\nDeployer-Run: 20990101-000000-hostile")
    both_ways(target, "check", "--host", "box", code=0)
    both_ways(target, "rollback", "--host", "box", "--list", code=0)
