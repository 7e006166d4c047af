"""The live view as a person at a terminal sees it: deployer on a real pseudo-terminal, its output read by a
terminal emulator, the frames it redrew and the screen it left asserted on (rows, widths, redraws)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, init_repo
from fixtures_services import GAUGE, Stack
from terminal import on_a_terminal

HEADER = re.compile(r"step +status +time +detail")


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_drain_row_shows_its_reading_target_and_time_against_its_budget_and_rollback_rows_redraw_cleanly(
        stack: Stack) -> None:
    stack.start_services()  # the gauge reads 3: the drain to 0 fails, and the rollback's rows widen the table
    stack.project.playbook(steps=[{"baseline": {"metric": GAUGE, "interval_s": 0.1}}, "local_compile", "upload",
                                  "remote_compile", {"diff_bounds": {"files": 1}}, {"commit": {"message": "m"}},
                                  "co_restart", {"drain": {"metric": GAUGE, "to": 0, "interval_s": 0.2,
                                                           "within_s": 3}}], on_failure="rollback")
    shown = on_a_terminal(["apply", "fix.yaml", "--host", "box"], stack.project.root, stack.project.env(),
                          columns=160, lines=60)
    assert shown.exit_code == 5, "\n".join(shown.screen)
    polled = re.compile(rf"drain +running +\d+\.\ds +{re.escape(GAUGE)} = 3, target <= 0, \d+\.\ds of 3s")
    assert any(polled.fullmatch(line) for frame in shown.frames for line in frame), "\n".join(shown.frames[-1])
    steps = ["baseline", "local_compile", "upload", "remote_compile", "diff_bounds", "commit", "co_restart",
             "drain", "rollback:co_restart", "rollback:drain"]
    table = shown.screen[:shown.screen.index(next(line for line in shown.screen if line.startswith("run ")))]
    assert HEADER.fullmatch(table[0]) and not any(HEADER.match(line) for line in table[1:]), "\n".join(table)
    assert [line.split()[0] for line in table[1:] if not line.startswith(" ")] == steps, "\n".join(table)


@pytest.mark.parametrize("target", ["ssh"], indirect=True)
def test_a_notice_said_while_the_live_view_draws_goes_above_it_on_a_line_of_its_own(target: Project,
                                                                                    tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    target.write_inventory(known_hosts=str(empty))
    target.playbook()
    shown = on_a_terminal(["apply", "fix.yaml", "--host", "box", "--accept-new-host-key"], target.root,
                          target.env(), columns=200)
    assert shown.exit_code == 0, "\n".join(shown.screen)
    screen = shown.screen
    assert screen[0].startswith("notice: pinned a new host key for "), "\n".join(screen)
    assert [i for i, line in enumerate(screen) if HEADER.search(line)] == [1], "\n".join(screen)
    assert screen[2].startswith("local_compile "), "\n".join(screen)


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_run_that_shows_no_step_leaves_no_empty_header_above_its_report(target: Project) -> None:
    target.applied()
    shown = on_a_terminal(["rollback", "last"], target.root, target.env())  # reverts; no service to restart
    assert shown.exit_code == 0, "\n".join(shown.screen)
    assert shown.screen[0].startswith("run ") and "rolled_back" in shown.screen[0], "\n".join(shown.screen)
    assert not any(HEADER.search(line) for line in shown.screen), "\n".join(shown.screen)
    assert target.file("pkg/a.py") == ORIGINAL_A


def test_a_fleets_live_view_leaves_its_summary_and_no_empty_header_above_the_fleets_table(tmp_path: Path) -> None:
    hosts = {}
    for name in ("h1", "h2"):
        init_repo(tmp_path / name / "repo", {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
        hosts[name] = {"transport": "local", "repo": str(tmp_path / name / "repo"), "python": sys.executable}
    project = Project(root=tmp_path, repo=tmp_path / "h1" / "repo", host=hosts["h1"], host_name="h1")
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"all": list(hosts)}}))
    project.write("fix/a.py", FIXED_A)
    project.playbook()
    shown = on_a_terminal(["apply", "fix.yaml", "--host", "all"], project.root, project.env())
    assert shown.exit_code == 0, "\n".join(shown.screen)
    assert shown.screen[0].startswith("fleet: 2 hosts: 2 successful"), "\n".join(shown.screen)
    assert re.match(r"host +batch +state +run", shown.screen[1]), "\n".join(shown.screen)
    assert not any(re.match(r"host +status +step +time +detail", line) for line in shown.screen)
