"""`deployer logs --host H [SERVICE] [-f] [-n N] [--all]` shows a service's log through the same transport and
agent as every other command, escaped as all target text is (issue 34, item 13): a `start:` service's output
since this start, every service of the host under a heading, a follow until Ctrl-C, a clear refusal where the
host has no such service or no journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from fixtures_containers import Served
from fixtures_repo import Project
from fixtures_services import Stack
from polling import wait_for

# Each start prints its number, its secret and a terminal control (a clear-screen) a log must show, never obey,
# then serves.
COUNTED = ('n=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n >{count}; '
           'printf "start %s token=%s \\033[2J\\n" $n "$TOKEN"; exec "$@"')
SECRET = "s3cr3t-token"


def counted(stack: Stack, name: str) -> dict[str, Any]:
    served = stack.service(name)
    script = COUNTED.format(count=stack.project.root / f"{name}.count")
    return {**served, "start": ["sh", "-c", script, "counted", *served["start"]],
            "env": {"TOKEN": {"secret": True, "value": SECRET}}}


def started_twice(target: Project, stack: Stack) -> None:
    stack.configure(prefill=counted(stack, "prefill"), decode=counted(stack, "decode"))
    stack.start_services()
    again = target.deployer("restart", "--host", "box", "prefill")
    assert again.returncode == 0, again.stdout + again.stderr


def test_logs_shows_a_started_services_output_since_this_start_escaped(target: Project, stack: Stack) -> None:
    started_twice(target, stack)

    shown = target.deployer("logs", "--host", "box", "prefill")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "start 2 token=*** \\x1b[2J" in shown.stdout, shown.stdout
    assert "start 1" not in shown.stdout and "\x1b" not in shown.stdout and SECRET not in shown.stdout
    assert "==>" not in shown.stdout  # one log: no heading, as tail

    whole = target.deployer("logs", "--host", "box", "prefill", "--all")
    assert whole.stdout.index("start 1") < whole.stdout.index("start 2"), whole.stdout

    last = target.deployer("logs", "--host", "box", "prefill", "--all", "-n", "1")
    assert len(last.stdout.splitlines()) == 1 and "start 1" not in last.stdout, last.stdout

    document = json.loads(target.deployer("logs", "--host", "box", "prefill", "--json").stdout)
    [read] = document["logs"]
    assert (read["host"], read["service"], document["exit_code"]) == ("box", "prefill", 0)
    assert "start 2 token=*** \\x1b[2J" in read["text"] and "since this start" in read["source"], read


def test_logs_without_a_service_shows_every_service_of_the_host_under_a_heading(target: Project,
                                                                                  stack: Stack) -> None:
    started_twice(target, stack)

    shown = target.deployer("logs", "--host", "box")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    prefill, decode = shown.stdout.index("==> box prefill: "), shown.stdout.index("==> box decode: ")
    assert "start 2" in shown.stdout[prefill:decode] and "start 1" in shown.stdout[decode:], shown.stdout


def test_logs_of_a_group_shows_each_of_its_hosts_services(target: Project, stack: Stack) -> None:
    started_twice(target, stack)
    inventory = yaml.safe_load(target.inventory.read_text())
    target.inventory.write_text(yaml.safe_dump({**inventory, "groups": {"serving": ["box"]}}))

    shown = target.deployer("logs", "--host", "serving", "decode")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "start 1" in shown.stdout and "==>" not in shown.stdout, shown.stdout


def test_logs_of_a_service_the_host_lacks_is_exit_2_naming_the_hosts_services(target: Project,
                                                                             stack: Stack) -> None:
    missing = target.deployer("logs", "--host", "box", "web")
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "no service 'web' on box; the services are box: prefill, decode" in missing.stderr, missing.stderr


def test_logs_of_a_service_never_started_says_it_has_no_log_yet(target: Project, stack: Stack) -> None:
    shown = target.deployer("logs", "--host", "box", "prefill")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "no log on the host yet" in shown.stdout, shown.stdout


def lines_of(process: subprocess.Popen[str]) -> list[str]:
    """What process writes on stdout, line by line as it comes (read on a thread of its own)."""
    seen: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        seen.extend(iter(process.stdout.readline, ""))
    threading.Thread(target=read, daemon=True).start()
    return seen


def test_logs_follow_shows_what_the_service_writes_until_ctrl_c(target: Project, stack: Stack) -> None:
    started_twice(target, stack)
    following = target.popen("logs", "--host", "box", "prefill", "-f")
    seen = lines_of(following)
    try:
        wait_for(lambda: any("start 2" in line for line in seen), "this start's output", 60)
        # http.server logs each request it answers on stderr: its log, appended through the service itself.
        (stack.www / "followed-by-the-test").write_text("here\n")
        stack.fetch(f"http://127.0.0.1:{stack.ports['prefill']}/followed-by-the-test")
        wait_for(lambda: any("/followed-by-the-test" in line for line in seen), "the appended line", 30)
    finally:
        following.send_signal(signal.SIGINT)
        code = following.wait(30)
    assert code == 130
    assert following.stderr is not None and "Traceback" not in following.stderr.read()
    assert not any("start 1" in line for line in seen), seen


def test_logs_follow_ends_when_what_reads_it_is_gone(target: Project, stack: Stack) -> None:
    """`deployer logs -f ... | head -1`: the follow must end although the log stays quiet (nothing is written
    that would fail), as a pipe's writer ends when its reader does."""
    started_twice(target, stack)
    read_end, write_end = os.pipe()
    following = subprocess.Popen([sys.executable, "-m", "deployer", "logs", "--host", "box", "prefill", "-f"],
                                 cwd=target.root, env=target.env(), stdout=write_end, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, text=True)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as reader:
            assert reader.readline()  # its first line, as `head -1` reads it; then the reader is gone
        code = following.wait(30)
    finally:
        if following.poll() is None:
            following.kill()
            following.wait()
    assert code == 1
    assert following.stderr is not None and "Traceback" not in following.stderr.read()


def without_journalctl(project: Project) -> str:
    """A python for the target whose PATH holds only sh and git: a host without systemd's tools."""
    tools = project.root / "tools"
    tools.mkdir()
    for tool in ("sh", "git"):
        os.symlink(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True,
                                  check=True).stdout.strip(), tools / tool)
    return str(project.write("nosystemd/python", f'#!/bin/sh\nPATH={tools} exec {sys.executable} "$@"\n'))


def test_logs_of_a_systemd_unit_on_a_host_without_journalctl_is_a_clear_exit_2(target: Project) -> None:
    python = Path(without_journalctl(target))
    python.chmod(0o755)
    target.write_inventory(python=str(python), services={"web": {"systemd": "web.service"}})

    refused = target.deployer("logs", "--host", "box")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert ("box: cannot read web's log (the journal of web.service since this start): journalctl (systemd's "
            "journal, where a unit's output goes) is not on the host's PATH") in refused.stderr, refused.stderr


def test_logs_of_a_container_service_shows_its_output_since_this_start(
        target: Project, serving_container: Callable[..., Served]) -> None:
    served = serving_container(init=True)
    target.write_inventory(services={"prefill": {"container": {"engine": "podman", "name": served.box.name},
                                                 "health": served.health}})
    fetch(served.health + "?before-this-start")  # http.server logs each request it answers on stderr
    target.playbook(steps=[{"co_restart": {}}])
    assert target.deployer("apply", "fix.yaml", "--host", "box").returncode == 0
    fetch(served.health + "?after-this-start")

    shown = target.deployer("logs", "--host", "box", "prefill")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "after-this-start" in shown.stdout and "before-this-start" not in shown.stdout, shown.stdout
    whole = target.deployer("logs", "--host", "box", "prefill", "--all", "-n", "1000")
    assert whole.stdout.index("before-this-start") < whole.stdout.index("after-this-start"), whole.stdout


def fetch(url: str) -> None:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as reply:
        assert reply.status == 200


# systemd does not run here. As the systemd tests of tests/steps/test_services_metrics.py stand in for systemctl with
# a script on the PATH, these stand in for journalctl: the journal is a file of entries, one a line, each
# "INVOCATION MESSAGE"; an entry's cursor is its line number (printed after the entries, as --show-cursor does), and
# `systemctl show -p InvocationID --value` says the current start's invocation.
FAKE_JOURNALCTL = """#!/bin/sh
inv=; after=0; n=
while [ $# -gt 0 ]; do
  case "$1" in
    --after-cursor) after=$2; shift ;;
    -n) n=$2; shift ;;
    _SYSTEMD_INVOCATION_ID=*) inv=${1#*=} ;;
  esac
  shift
done
exec awk -v inv="$inv" -v after="$after" -v n="$n" '
  NR > after && (inv == "" || $1 == inv) { k++; keep[k] = $0; at[k] = NR }
  END { first = (n != "" && k > n + 0) ? k - n + 1 : 1
        for (i = first; i <= k; i++) { m = keep[i]; sub(/^[^ ]* /, "", m); print "2026-01-01T00:00 web[7]: " m }
        if (k > 0) print "-- cursor: " at[k] }' {journal}
"""
FAKE_SYSTEMCTL = """#!/bin/sh
[ "$1" = show ] && exec cat {invocation}
exit 1
"""


def marked_python(project: Project, tools: dict[str, str]) -> tuple[str, str]:
    """A python for the target with `tools` (name: script) first on its PATH, and a mark in its environment that
    every process of deployer's on the target inherits (the agent, what it runs): the python, and the mark."""
    bin_dir = project.root / "tools"
    bin_dir.mkdir(exist_ok=True)
    for name, script in tools.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    mark = f"DEPLOYER_TEST_MARK={project.root.name}"
    python = project.write("marked/python", f'#!/bin/sh\n{mark} PATH={bin_dir}:$PATH exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return str(python), mark


def marked_processes(mark: str) -> list[int]:
    """Every process whose environment holds the mark: deployer's, on the target (this machine, under either
    transport)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark.encode() in environ:
                found.append(int(entry.name))
    return found


def journaled(target: Project) -> tuple[Path, str]:
    """Service web, a systemd unit whose journal holds two starts' entries, the second the current one; the
    journal file (append to it to log), and the mark of deployer's processes on the target."""
    journal, invocation = target.root / "journal", target.root / "invocation"
    journal.write_text("inv-1 first start \x1b[2J token\ninv-1 first start ends\ninv-2 second start\n")
    invocation.write_text("inv-2\n")
    python, mark = marked_python(target, {
        "journalctl": FAKE_JOURNALCTL.replace("{journal}", str(journal)),
        "systemctl": FAKE_SYSTEMCTL.replace("{invocation}", str(invocation))})
    target.write_inventory(python=python, services={"web": {"systemd": "web.service"}})
    return journal, mark


def test_logs_of_a_systemd_unit_shows_its_journal_since_this_start_escaped(target: Project) -> None:
    journaled(target)

    shown = target.deployer("logs", "--host", "box", "web")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "second start" in shown.stdout and "first start" not in shown.stdout, shown.stdout
    assert "-- cursor" not in shown.stdout, shown.stdout

    whole = target.deployer("logs", "--host", "box", "web", "--all")
    assert whole.stdout.index("first start \\x1b[2J token") < whole.stdout.index("second start"), whole.stdout
    assert "\x1b" not in whole.stdout

    last = target.deployer("logs", "--host", "box", "web", "--all", "-n", "2")
    assert "first start ends" in last.stdout and "second start" in last.stdout, last.stdout
    assert "first start \\x1b" not in last.stdout, last.stdout

    [read] = json.loads(target.deployer("logs", "--host", "box", "web", "--json").stdout)["logs"]
    assert read["source"] == "the journal of web.service since this start" and "second start" in read["text"], read


def followed(target: Project, mark: str, args: list[str], append: Callable[[], None], first: str,
             appended: str) -> list[str]:
    """`deployer logs -f`: the first line shown, then a line written after it started; then Ctrl-C ends it with
    exit 130 (as its --help says), no traceback, and no process of deployer's left on the target."""
    following = target.popen("logs", "--host", "box", *args, "-f")
    seen = lines_of(following)
    try:
        wait_for(lambda: any(first in line for line in seen), "the log shown before following", 60)
        assert marked_processes(mark), "no agent of deployer's on the target while following"
        append()
        wait_for(lambda: any(appended in line for line in seen), "the line written after the follow started", 30)
    finally:
        following.send_signal(signal.SIGINT)
        try:
            code = following.wait(30)
        except subprocess.TimeoutExpired:
            following.kill()
            following.wait()
            raise AssertionError("logs -f did not end within 30s of its Ctrl-C") from None
    assert code == 130, following.stderr.read() if following.stderr else code
    assert following.stderr is not None and "Traceback" not in following.stderr.read()
    wait_for(lambda: not marked_processes(mark), "every process of deployer's on the target ended", 30)
    return seen


def test_logs_follow_of_a_systemd_unit_shows_new_journal_entries_until_ctrl_c(target: Project) -> None:
    journal, mark = journaled(target)

    def log() -> None:
        with journal.open("a") as entries:
            entries.write("inv-2 written after the follow started\n")
    seen = followed(target, mark, ["web"], log, "second start", "written after the follow started")
    assert not any("first start" in line for line in seen), seen
    assert sum("second start" in line for line in seen) == 1, seen  # each entry once: read on from its cursor


def test_logs_follow_of_a_container_service_shows_its_new_output_until_ctrl_c(
        target: Project, serving_container: Callable[..., Served]) -> None:
    served = serving_container(init=True)
    python, mark = marked_python(target, {})
    target.write_inventory(python=python, services={
        "prefill": {"container": {"engine": "podman", "name": served.box.name}, "health": served.health}})
    fetch(served.health + "?before-the-follow")  # http.server logs each request it answers on stderr

    seen = followed(target, mark, ["prefill", "--all"], lambda: fetch(served.health + "?after-the-follow-started"),
                    "before-the-follow", "after-the-follow-started")
    assert sum("before-the-follow" in line for line in seen) == 1, seen
