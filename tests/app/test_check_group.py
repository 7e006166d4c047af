"""`deployer check --host GROUP`: one row per host over a real sshd; the exit code is the first problem's."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_repo import ORIGINAL_A, ORIGINAL_B, Project, init_repo, tree_snapshot
from fixtures_services import free_port
from fixtures_ssh import SSHD

HOSTS = ("h1", "h2", "h3", "h4")
HOLDER = "20260101T000000.000Z-abcdef"


@pytest.fixture
def group(tmp_path: Path, sshd: SSHD) -> Project:
    """Four inventory hosts behind one sshd, each its own repo: h2's lock is held, h3's shipped file is dirty."""
    hosts: dict[str, Any] = {}
    for name in HOSTS:
        repo = tmp_path / name / "repo"
        init_repo(repo, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A, "pkg/b.py": ORIGINAL_B})
        hosts[name] = {"transport": "ssh", "address": sshd.host, "port": sshd.port, "user": sshd.user,
                       "identity_file": str(sshd.client_key), "known_hosts": str(sshd.known_hosts),
                       "ssh_config": "/dev/null", "repo": str(repo), "python": sys.executable}
    lock = tmp_path / "h2" / "repo" / ".git" / "deployer.run.lock"
    lock.mkdir()
    (lock / "info.json").write_text(json.dumps({"run_id": HOLDER, "operator": "alice@ops", "pid": 4242,
                                                "ttl_s": 600}))
    (lock / "heartbeat").write_text("")
    (tmp_path / "h3" / "repo" / "pkg" / "a.py").write_text("local edit\n")
    project = Project(root=tmp_path, repo=tmp_path / "h1" / "repo", host=hosts["h1"], host_name="h1")
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"all": list(HOSTS)}}, sort_keys=False))
    project.write("fix/a.py", "def answer():\n    return 42\n")
    project.playbook()
    return project


def rows(stdout: str) -> dict[str, str]:
    return {line.split()[0]: line for line in stdout.splitlines() if line.split() and line.split()[0] in HOSTS}


def test_check_over_a_group_reports_each_host_and_exits_with_the_first_problems_code(group: Project) -> None:
    before = {h: tree_snapshot(group.root / h / "repo") for h in HOSTS}
    result = group.deployer("check", "fix.yaml", "--host", "all", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 3 == report["exit_code"], result.stdout + result.stderr
    assert list(report["hosts"]) == list(HOSTS)
    found = {host: {c["name"]: c for c in one["checks"]} for host, one in report["hosts"].items()}
    assert [report["hosts"][h]["exit_code"] for h in HOSTS] == [0, 3, 1, 0]
    assert found["h2"]["lock"]["status"] == "fail" and HOLDER in found["h2"]["lock"]["detail"]
    assert found["h3"]["dirty files"]["status"] == "fail" and "pkg/a.py" in found["h3"]["dirty files"]["detail"]
    assert all(c["status"] != "fail" for h in ("h1", "h4") for c in found[h].values())
    assert report["error"].startswith(f"h2: lock: held by run {HOLDER}")
    assert {h: tree_snapshot(group.root / h / "repo") for h in HOSTS} == before  # read-only on every host

    shown = group.deployer("check", "fix.yaml", "--host", "all")
    assert shown.returncode == 3, shown.stdout + shown.stderr
    table = rows(shown.stdout)
    assert list(table) == list(HOSTS)  # one row per host
    assert [table[h].split()[1:3] for h in HOSTS] == [["ready", "0"], ["FAIL", "3"], ["FAIL", "1"], ["ready", "0"]]
    assert f"lock: held by run {HOLDER}" in table["h2"]
    assert "dirty files: uncommitted changes in the playbook's files: pkg/a.py" in table["h3"]
    assert "2 of 4 hosts ready to deploy; first problem: h2: lock (exit 3)" in shown.stdout


def test_check_over_a_glob_or_a_comma_list_exits_with_the_problem_of_its_own_hosts(group: Project) -> None:
    dirty = group.deployer("check", "fix.yaml", "--host", "h[34]", "--json")
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    assert json.loads(dirty.stdout)["error"].startswith("h3: dirty files:")
    ready = group.deployer("check", "fix.yaml", "--host", "h1,h4")
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert set(rows(ready.stdout)) == {"h1", "h4"} and "2 of 2 hosts ready to deploy" in ready.stdout


def test_check_over_a_unit_checks_each_host_against_its_part_of_the_playbook(group: Project) -> None:
    inventory = yaml.safe_load(group.inventory.read_text())
    closed = free_port()  # nothing listens: the services are down, which check reports (exit 1)
    for host, service in (("h1", "prefill"), ("h4", "decode")):
        inventory["hosts"][host]["services"] = {service: {"start": [sys.executable, "-c", "pass"],
                                                          "health": f"http://127.0.0.1:{closed}/health"}}
    inventory["hosts"]["h1"]["metrics"] = f"http://127.0.0.1:{closed}/metrics"
    inventory["units"] = {"pd": {"services": ["h1:prefill", "h4:decode"], "metrics": "h1"}}
    group.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    group.playbook(steps=["local_compile", "upload", {"commit": {"message": "fix"}},
                          {"co_restart": {"services": ["prefill", "decode"]}},
                          {"drain": {"metric": "sglang:num_prefill_inflight_queue_reqs", "to": 0}}])
    result = group.deployer("check", "fix.yaml", "--host", "pd", "--json")
    report = json.loads(result.stdout)
    assert list(report.get("hosts", {})) == ["h1", "h4"], result.stdout + result.stderr
    for host, service in (("h1", "prefill"), ("h4", "decode")):
        found = {c["name"]: c for c in report["hosts"][host]["checks"]}
        # Each host restarts its own service of the unit; the drain is read once, on the unit's metrics host.
        assert found["playbook"]["status"] == "ok", found["playbook"]
        assert found[f"service {service}"]["status"] == "fail"
    assert "metric (drain)" in {c["name"] for c in report["hosts"]["h1"]["checks"]}
    assert result.returncode == 1 == report["exit_code"]
