"""co_restart's plan, manager by manager (a command deployer starts, a systemd unit, a container), and around
them: the GPU wait before a start, a gang's one start of every rank, the order across services (observe in order,
stop in reverse, start in order), and the failure's reads last. PIDs only the run finds are placeholders."""

from __future__ import annotations

from typing import Any

import pytest
from planning import REPO, STATE, context, does, host, step

from deployer.errors import StepFailed
from deployer.steps.action import Action
from deployer.steps.services.co_restart import CoRestart
from deployer.steps.services.command import LAUNCH, SERVE, TAIL

HEALTH = "http://127.0.0.1:30000/health"
COMMAND = {"start": "python -m server --port 30000", "health": HEALTH}
INSPECT = ("docker", "inspect", "--type", "container", "--format", "{{json .State}}", "sgl")
MAIN_PID = ("systemctl", "show", "-p", "MainPID", "--value", "decode.service")
SMI_MEMORY = ("nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits")
SMI_APPS = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")


def restart(services: dict[str, dict[str, Any]], params: dict[str, Any] | None = None,
            **fields: Any) -> list[Action]:
    return step("co_restart", params).plan(context(host(services=services, **fields)))


def keys(actions: list[Action]) -> list[str]:
    return [a.key for a in actions]


def test_co_restart_command_observes_stops_the_tree_starts_detached_and_confirms_the_new_pid() -> None:
    tree = {"sessions": "<sessions of api>", "groups": "<groups of api>", "ports": "30000"}
    plan = restart({"api": {**COMMAND, "stop_grace_s": 30, "env": {"CUDA_VISIBLE_DEVICES": "0"}}},
                   env={"HF_HOME": "/data/hf"})
    assert does(plan) == does([
        Action.get("api.record", "read the pid and start time of api's process", f"{STATE}/api.proc"),
        Action.get("api.pidfile", "or, as an older deployer recorded them, its pid file", f"{STATE}/api.pid"),
        Action.get("api.started", "and the start time of the process it names", f"{STATE}/api.started"),
        Action.get("api.stat", "is <pid of api> running (and the process the pid file meant)",
                   "/proc/<pid of api>/stat", when="the pid file names a pid"),
        Action.procs("api.heir", "who listens on port 30000: api's when in the session <pid of api> led",
                     {"ports": "30000"}, when="the recorded process is gone"),
        Action.http("api.health", "is api answering", HEALTH),
        Action.procs("api.leader", "find <pid of api> and whoever listens on port 30000: the sessions and groups "
                     "they run in are api's tree", {"pids": "<pid of api>", "ports": "30000"},
                     when="<pid of api> is running"),
        Action.procs("api.tree", "list <tree of api>: every process of those sessions and groups and whoever "
                     "listens on port 30000", tree, when="<pid of api> is running"),
        Action.signal("api.term", "stop api: TERM every process of its tree", "TERM", "<tree of api>",
                      when="<pid of api> is running"),
        Action.procs("api.stopping", "wait up to 30s for <tree of api> to exit and port 30000 to be free", tree,
                     repeats=True, when="<pid of api> is running"),
        Action.signal("api.kill", "KILL every process of <tree of api> still alive", "KILL", "<tree of api>",
                      when="any still runs after 30s"),
        Action.procs("api.dying", "wait up to 10s for the KILLed to go", tree, repeats=True, when="it was KILLed"),
        Action.http("api.free", "after the stops nothing may answer for api (else another process serves it)",
                    HEALTH),
        Action.run("api.mkdir", "create deployer's state dir", ("mkdir", "-p", "--", STATE),
                   failure="cannot create deployer's state dir"),
        Action.run("api.launch", f"start api (log {STATE}/api.log)",
                   ("sh", "-c", LAUNCH, "deployer-launch", f"{STATE}/api.log", f"{STATE}/api.pid",
                    f"{STATE}/api.proc", "", f"{STATE}/api.from", SERVE, "python", "-m", "server", "--port", "30000"),
                   f"{REPO}/", env=(("HF_HOME", "/data/hf"), ("CUDA_VISIBLE_DEVICES", "0")),
                   failure="cannot start api"),
        Action.procs("api.up", "wait for <new pid of api> or its session to keep running and whoever listens on "
                     "port 30000", {"sessions": "<new pid of api>", "pids": "<new pid of api>", "ports": "30000"},
                     repeats=True),
        Action.http("api.up_health", "wait up to 60s for api to answer 200", HEALTH, repeats=True),
        Action.put("api.repoint", "record the process serving port 30000 (its pid and start time) as api",
                   f"{STATE}/api.proc", when="the launched process exited and another serves the port"),
        Action.put("api.repoint_pid", "and its pid in the pid file", f"{STATE}/api.pid",
                   when="the launched process exited and another serves the port"),
        Action.procs("api.reap_list", "list what <new pid of api> launched",
                     {"sessions": "<new pid of api>", "pids": "<new pid of api>"}, when="api never came up"),
        Action.signal("api.reap", "KILL what <new pid of api> launched", "KILL", "<launched by api>",
                      when="api never came up"),
        Action.get("api.still", "<new pid of api> still runs after every service started",
                   "/proc/<new pid of api>/stat"),
        Action.get("api.memory", "how much memory <new pid of api> holds", "/proc/<new pid of api>/status",
                   when="api runs but does not answer in time"),
        Action.run("api.log", f"the tail of {STATE}/api.log since api was started",
                   ("sh", "-c", TAIL, "deployer-log", "<log start of api>", f"{STATE}/api.log", "3000"),
                   when="api fails")])


def test_co_restart_command_with_a_stop_command_runs_it_instead_of_term_and_kills_after_its_grace() -> None:
    plan = restart({"api": {**COMMAND, "stop": "serverctl stop --drain", "cwd": "serving", "stop_grace_s": 45}})
    stops = [a for a in plan if a.key in ("api.stop", "api.term", "api.kill")]
    assert does(stops) == does([
        Action.run("api.stop", "stop api", ("serverctl", "stop", "--drain"), f"{REPO}/serving",
                   failure="the stop command of api failed"),
        Action.signal("api.kill", "KILL every process of <tree of api> still alive", "KILL", "<tree of api>",
                      when="any still runs after 45s")])
    assert keys(plan)[6:12] == ["api.leader", "api.tree", "api.stop", "api.stopping", "api.kill", "api.dying"]


def test_co_restart_command_adopts_its_own_pid_file_then_the_port_when_deployer_has_no_record() -> None:
    plan = restart({"api": {**COMMAND, "adopt": "port", "pidfile": "/run/server.pid"}})
    observe = [a for a in plan if a.key in ("api.their_pidfile", "api.their_stat", "api.listener")]
    assert does(observe) == does([
        Action.get("api.their_pidfile", "read the pid api writes itself", "/run/server.pid",
                   when="deployer's pid file names no live process"),
        Action.get("api.their_stat", "is <pid in the own pid file of api> running: adopted as api",
                   "/proc/<pid in the own pid file of api>/stat", when="its own pid file names a pid"),
        Action.procs("api.listener", "who listens on port 30000: adopted as api", {"ports": "30000"},
                     when="the pid file names no live process")])
    assert keys(plan)[:9] == ["api.record", "api.pidfile", "api.started", "api.stat", "api.heir",
                              "api.their_pidfile", "api.their_stat", "api.listener", "api.health"]


def test_co_restart_command_with_its_own_log_tails_that_log_and_passes_it_to_the_launch() -> None:
    plan = {a.key: a for a in restart({"api": {**COMMAND, "log": "/var/log/server.log", "detaches": True}})}
    assert plan["api.launch"].argv[4:9] == (f"{STATE}/api.log", f"{STATE}/api.pid", f"{STATE}/api.proc",
                                            "/var/log/server.log", f"{STATE}/api.from")
    assert plan["api.log"].argv == ("sh", "-c", TAIL, "deployer-log", "<log start of api>", "/var/log/server.log",
                                    "3000")
    assert plan["api.log"].what == "the tail of /var/log/server.log since api was started"


def test_co_restart_command_without_health_has_no_port_no_health_and_no_free_check() -> None:
    plan = restart({"worker": {"start": "python -m worker"}})
    assert keys(plan) == ["worker.record", "worker.pidfile", "worker.started", "worker.stat",
                          "worker.leader", "worker.tree", "worker.term", "worker.stopping", "worker.kill",
                          "worker.dying", "worker.mkdir", "worker.launch", "worker.up", "worker.repoint",
                          "worker.repoint_pid", "worker.reap_list", "worker.reap", "worker.still", "worker.memory",
                          "worker.log"]
    up = next(a for a in plan if a.key == "worker.up")
    assert up.argv == ("sessions=<new pid of worker>", "pids=<new pid of worker>")


def test_co_restart_systemd_stops_and_starts_the_unit_and_reads_its_main_pid_and_journal() -> None:
    plan = restart({"decode": {"systemd": "decode.service", "health": "http://127.0.0.1:30001/health",
                               "health_timeout_s": 600, "stop_grace_s": 20}})
    health = "http://127.0.0.1:30001/health"
    assert does(plan) == does([
        Action.run("decode.mainpid", "read decode.service's main pid", MAIN_PID),
        Action.http("decode.health", "is decode answering", health),
        Action.run("decode.stop", "stop decode", ("systemctl", "stop", "decode.service"),
                   failure="systemctl stop decode.service failed"),
        Action.procs("decode.port_free", "wait up to 20s for port 30001 to be free", {"ports": "30001"},
                     repeats=True),
        Action.http("decode.free", "after the stops nothing may answer for decode (else another process serves it)",
                    health),
        Action.run("decode.start", "start decode", ("systemctl", "start", "decode.service"),
                   failure="systemctl start decode.service failed"),
        Action.run("decode.up", "wait for decode.service to have a main pid", MAIN_PID, repeats=True),
        Action.http("decode.up_health", "wait up to 600s for decode to answer 200", health, repeats=True),
        Action.run("decode.still", "its main pid after every service started", MAIN_PID),
        Action.get("decode.memory", "how much memory <new pid of decode> holds", "/proc/<new pid of decode>/status",
                   when="decode runs but does not answer in time"),
        Action.run("decode.log", "the end of decode.service's journal",
                   ("journalctl", "-u", "decode.service", "-n", "40", "--no-pager"), when="decode fails")])


def test_co_restart_container_stops_with_its_grace_in_whole_seconds_and_proves_the_restart_by_inspect() -> None:
    plan = restart({"box": {"container": "sgl", "health": "http://127.0.0.1:30002/health", "stop_grace_s": 12.5}})
    health = "http://127.0.0.1:30002/health"
    assert does(plan) == does([
        Action.run("box.inspect", "read container sgl's main pid and start time", INSPECT),
        Action.get("box.cmdline", "what <pid of box> runs (an init, or a bare interpreter)",
                   "/proc/<pid of box>/cmdline", when="the container runs"),
        Action.http("box.health", "is box answering", health),
        Action.run("box.stop", "stop box: TERM, KILL after 13s", ("docker", "stop", "-t", "13", "sgl"),
                   failure="docker stop sgl failed"),
        Action.http("box.free", "after the stops nothing may answer for box (else another process serves it)",
                    health),
        Action.run("box.start", "start box", ("docker", "start", "sgl"), failure="docker start sgl failed"),
        Action.run("box.up", "wait for container sgl to run", INSPECT, repeats=True),
        Action.http("box.up_health", "wait up to 60s for box to answer 200", health, repeats=True),
        Action.run("box.still", "container sgl still runs the same process", INSPECT),
        Action.get("box.memory", "how much memory <new pid of box> holds", "/proc/<new pid of box>/status",
                   when="box runs but does not answer in time"),
        Action.run("box.log", "the end of container sgl's output (stdout and stderr)",
                   ("sh", "-c", 'exec "$0" logs --tail 40 "$1" 2>&1', "docker", "sgl"), when="box fails")])


def test_co_restart_container_of_podman_at_its_own_path_calls_that_engine() -> None:
    plan = {a.key: a for a in restart({"box": {"container": {"engine": "podman", "name": "sgl",
                                                             "engine_path": "/opt/bin/podman"}}})}
    assert plan["box.stop"].argv == ("/opt/bin/podman", "stop", "-t", "10", "sgl")
    assert plan["box.start"].argv == ("/opt/bin/podman", "start", "sgl")
    assert plan["box.inspect"].argv[0] == "/opt/bin/podman"


def test_co_restart_gpu_waits_for_its_gpus_after_the_stops_and_before_its_start_under_the_hosts_env() -> None:
    plan = restart({"api": {**COMMAND, "gpus": [0, 1], "gpu_wait_s": 90, "gpu_free_mib": 2048}},
                   env={"PATH": "/usr/local/nvidia/bin:/usr/bin"})
    env = (("PATH", "/usr/local/nvidia/bin:/usr/bin"),)
    at = keys(plan).index("api.gpu_memory")
    assert does(plan[at:at + 2]) == does([
        Action.run("api.gpu_memory", "wait up to 90s for GPUs 0, 1 to be released: their memory", SMI_MEMORY,
                   env=env, repeats=True),
        Action.run("api.gpu_apps", "and the processes that hold them", SMI_APPS, env=env, repeats=True)])
    assert keys(plan)[at - 1:at + 3] == ["api.free", "api.gpu_memory", "api.gpu_apps", "api.mkdir"]


def test_co_restart_gpu_of_one_gpu_says_its_default_budget() -> None:
    plan = restart({"decode": {"systemd": "decode.service", "gpus": [3]}})
    [wait] = [a for a in plan if a.key == "decode.gpu_memory"]
    assert wait.what == "wait up to 120s for GPU 3 to be released: their memory"
    assert wait.env == ()


def test_co_restart_orders_observe_forward_stop_reverse_start_forward_and_failure_reads_last() -> None:
    plan = restart({"prefill": {"systemd": "prefill.service"}, "decode": {"systemd": "decode.service"},
                    "router": {"container": "router"}})
    assert keys(plan) == [
        "prefill.mainpid", "decode.mainpid", "router.inspect", "router.cmdline",
        "router.stop", "decode.stop", "prefill.stop",
        "prefill.start", "prefill.up", "decode.start", "decode.up", "router.start", "router.up",
        "prefill.still", "decode.still", "router.still",
        "prefill.memory", "prefill.log", "decode.memory", "decode.log", "router.memory", "router.log"]


def test_co_restart_services_param_picks_and_orders_them() -> None:
    services = {"prefill": {"systemd": "prefill.service"}, "decode": {"systemd": "decode.service"},
                "router": {"systemd": "router.service"}}
    plan = restart(services, {"services": ["decode", "prefill"]})
    assert [k for k in keys(plan) if k.endswith(".start")] == ["decode.start", "prefill.start"]
    assert [k for k in keys(plan) if k.endswith(".stop")] == ["prefill.stop", "decode.stop"]


def test_co_restart_of_a_service_the_host_lacks_cannot_plan() -> None:
    with pytest.raises(StepFailed, match=r"host gpu-1 defines no service cache \(it has: decode\)"):
        restart({"decode": {"systemd": "decode.service"}}, {"services": ["cache"]})


def test_co_restart_part_of_a_unit_plans_only_this_hosts_services() -> None:
    made = step("co_restart")
    part = made.part(["decode"])
    plan = part.plan(context(host(services={"prefill": {"systemd": "prefill.service"},
                                            "decode": {"systemd": "decode.service"}})))
    assert [k for k in keys(plan) if k.endswith(".start")] == ["decode.start"]


def test_co_restart_gang_waits_for_every_ranks_gpus_then_starts_every_rank_in_one_stage() -> None:
    rank0 = context(host(services={"rank0": {**COMMAND, "gpus": [0]}}), host_name="node-0")
    rank1 = context(host(services={"rank1": {"start": "python -m server --node-rank 1", "gpus": [0]}}),
                    host_name="node-1")
    made = step("co_restart")
    assert isinstance(made, CoRestart)
    plan = made.restart([(rank0, "rank0"), (rank1, "rank1")], "co_restart", {"unit": "pair"},
                        leader=("node-0", "rank0")).plan()
    starts = ["mkdir", "launch", "up"]
    assert [k for k in keys(plan) if k.split(".")[1] in ("stop", "term", "gpu_memory", *starts, "up_health")] == [
        "rank1.term", "rank0.term", "rank0.gpu_memory", "rank1.gpu_memory",
        *(f"rank0.{k}" for k in starts), "rank0.up_health", *(f"rank1.{k}" for k in starts)]


def test_co_restart_gang_plans_no_health_wait_for_a_follower_as_its_run_does_none() -> None:
    rank0 = context(host(services={"rank0": COMMAND}), host_name="node-0")
    rank1 = context(host(services={"rank1": {**COMMAND, "health": "http://127.0.0.1:30100/health"}}),
                    host_name="node-1")
    made = step("co_restart")
    assert isinstance(made, CoRestart)
    plan = made.restart([(rank0, "rank0"), (rank1, "rank1")], "co_restart", {}, leader=("node-0", "rank0")).plan()
    assert "rank1.up_health" not in keys(plan)
