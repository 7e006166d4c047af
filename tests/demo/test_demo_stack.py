"""The embedded demo stack reproduces the KVPoll terminal-sticky bug, the fix removes it, and
the storm client that provokes it stays inside its limits.

The stack runs as real processes (prefill, decode, router) from a copy in a temp dir, exactly
as ``deployer demo`` runs it, so these tests also prove the copy is self-contained. Every wait
is a poll loop with a deadline; every process started is killed by a finalizer.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from polling import within
from ports import free_ports
from prometheus_client.parser import text_string_to_metric_families

from deployer.steps.loadgen import MAX_CONCURRENCY, MAX_REQUESTS, StormResult, run_storm

REPO = Path(__file__).resolve().parents[2]
STACK_SRC = REPO / "deployer" / "demo" / "stack"
FIX_DIR = REPO / "playbooks" / "kvpoll-fix"
DISAGG = Path("python/sglang/srt/disaggregation")
FIX_FILES = {
    FIX_DIR / "common_conn.py": DISAGG / "common" / "conn.py",
    FIX_DIR / "nixl_conn.py": DISAGG / "nixl" / "conn.py",
}

INFLIGHT = "sglang:num_prefill_inflight_queue_reqs"
ENGINE_LABELS = {"engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}
PREFILL_GAUGES = {
    INFLIGHT,
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
}
DECODE_GAUGES = {
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
}
# A short warm-up, and the race made near-certain even on a loaded 2-core box: the stale
# Transferring write comes 0.1 s after its chunk (after both abort paths have landed), and the
# prefill scheduler polls its inflight queue only once a second (so it rarely sees the Failed
# in between). The defaults reproduce the bug too, but with less margin under CPU contention.
TEST_ENV = {
    "SGLANG_DEMO_STARTUP_S": "0.1",
    "SGLANG_DEMO_RACE_DELAY_S": "0.1",
    "SGLANG_DEMO_INFLIGHT_POLL_S": "1.0",
    "PYTHONDONTWRITEBYTECODE": "1",
}
START_DEADLINE_S = 20.0
# No abort_all here: upstream's abort_all also releases rooms that are already stuck, which would
# hide the symptom; it has its own tests below.
STORM_REQUESTS = 150  # at concurrency 32, clients giving up after 0.2 s


# --- plumbing ---------------------------------------------------------------------------------


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, str, str] | None:
    """(status, content type, body), or None when nothing answered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def gauge_sum(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(sample.value for sample in family.samples)
    raise AssertionError(f"{name} missing from metrics:\n{text}")


class StartFailed(Exception):
    pass


@dataclass
class Stack:
    repo: Path
    prefill_port: int
    bootstrap_port: int
    decode_port: int
    router_port: int
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def ports(self) -> dict[str, int]:
        return {"prefill": self.prefill_port, "decode": self.decode_port, "router": self.router_port}

    def log(self, name: str) -> str:
        path = self.repo / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {name}.log ---\n{self.log(name)}" for name in ("prefill", "decode", "router"))

    def inflight(self) -> float:
        answer = http_get(self.prefill_port, "/metrics")
        assert answer is not None and answer[0] == 200, f"prefill /metrics failed: {answer}\n{self.logs()}"
        return gauge_sum(answer[2], INFLIGHT)

    def start(self, name: str, args: list[str], module: str) -> None:
        env = {**os.environ, **TEST_ENV, **self.env, "PYTHONPATH": str(self.repo / "python")}
        with open(self.repo / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=self.repo / "python",
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait_healthy(self, name: str, port: int) -> None:
        proc = self.procs[name]

        def healthy() -> bool:
            if proc.poll() is not None:
                raise StartFailed(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            answer = http_get(port, "/health", timeout=1.0)
            return answer is not None and answer[0] == 200

        if not within(healthy, START_DEADLINE_S, interval_s=0.05):
            raise StartFailed(f"{name} not healthy within {START_DEADLINE_S}s:\n{self.log(name)}")

    def stop(self) -> dict[str, int | None]:
        """SIGTERM everything, escalate to SIGKILL; returns each exit code."""
        codes: dict[str, int | None] = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
                codes[name] = None
        return codes


def start_stack(workdir: Path, *, fixed: bool) -> Stack:
    repo = workdir / "repo"
    shutil.copytree(STACK_SRC, repo, ignore=shutil.ignore_patterns("__pycache__"))
    if fixed:
        for src, dest in FIX_FILES.items():
            shutil.copyfile(src, repo / dest)
    last_error: StartFailed | None = None
    for _ in range(3):
        prefill, bootstrap, decode, router = free_ports(4)
        stack = Stack(repo, prefill, bootstrap, decode, router)
        try:
            stack.start(
                "prefill",
                ["--model-path", "demo-model", "--disaggregation-mode", "prefill", "--port", str(prefill),
                 "--disaggregation-transfer-backend", "nixl", "--disaggregation-bootstrap-port", str(bootstrap),
                 "--enable-metrics"],
                "sglang.launch_server",
            )
            stack.wait_healthy("prefill", prefill)
            stack.start(
                "decode",
                ["--model-path", "demo-model", "--disaggregation-mode", "decode", "--port", str(decode),
                 "--disaggregation-transfer-backend", "nixl", "--base-gpu-id", "1", "--enable-metrics"],
                "sglang.launch_server",
            )
            stack.wait_healthy("decode", decode)
            stack.start(
                "router",
                ["--pd-disaggregation", "--prefill", f"http://127.0.0.1:{prefill}", str(bootstrap),
                 "--decode", f"http://127.0.0.1:{decode}", "--port", str(router)],
                "sglang_router.launch_router",
            )
            stack.wait_healthy("router", router)
            return stack
        except BaseException as exc:
            stack.stop()
            if isinstance(exc, StartFailed) and "Address already in use" in str(exc):
                last_error = exc  # another process took a port between probe and bind
                continue
            raise
    raise AssertionError(f"could not start the demo stack: {last_error}")


@dataclass
class StormRun:
    result: StormResult
    health: list[tuple[str, int | None]]
    stack: Stack


def storm_with_health_probe(stack: Stack) -> StormRun:
    """Run the standard storm at the router while probing every /health until it ends."""
    outcome: list[StormResult] = []
    errors: list[BaseException] = []

    def storm() -> None:
        try:
            outcome.append(run_storm(f"{stack.router_url}/generate", requests=STORM_REQUESTS, concurrency=32,
                                     client_timeout_s=0.2, max_duration_s=20.0))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=storm)
    thread.start()
    health: list[tuple[str, int | None]] = []
    deadline = time.monotonic() + 30.0
    while thread.is_alive() and time.monotonic() < deadline:
        for name, port in stack.ports.items():
            answer = http_get(port, "/health", timeout=2.0)
            health.append((name, None if answer is None else answer[0]))
        time.sleep(0.05)
    thread.join(timeout=30.0)
    assert not thread.is_alive(), "storm did not end within its bounds"
    assert not errors, errors
    for name, port in stack.ports.items():
        answer = http_get(port, "/health", timeout=2.0)
        health.append((name, None if answer is None else answer[0]))
    return StormRun(outcome[0], health, stack)


@pytest.fixture(scope="class")
def buggy_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StormRun]:
    stack = start_stack(tmp_path_factory.mktemp("buggy"), fixed=False)
    try:
        yield storm_with_health_probe(stack)
    finally:
        stack.stop()


@pytest.fixture(scope="class")
def fixed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StormRun]:
    stack = start_stack(tmp_path_factory.mktemp("fixed"), fixed=True)
    try:
        yield storm_with_health_probe(stack)
    finally:
        stack.stop()


def assert_storm_accounted(result: StormResult) -> None:
    assert result.sent == STORM_REQUESTS, result
    assert result.sent == result.completed + result.aborted + result.errors, result
    assert result.errors == 0, result
    assert result.aborted > 0, result


def assert_health_stayed_200(run: StormRun) -> None:
    bad = [(name, status) for name, status in run.health if status != 200]
    assert not bad, f"/health not 200 during/after the storm: {bad[:10]}\n{run.stack.logs()}"
    assert {name for name, _ in run.health} == {"prefill", "decode", "router"}


# --- the buggy build ---------------------------------------------------------------------------


class TestBuggyBuild:
    def test_storm_is_accounted_for(self, buggy_run: StormRun) -> None:
        assert_storm_accounted(buggy_run.result)

    def test_health_stays_200_during_and_after_the_storm(self, buggy_run: StormRun) -> None:
        assert_health_stayed_200(buggy_run)

    def test_storm_leaves_prefill_rooms_stuck_for_good(self, buggy_run: StormRun) -> None:
        stack = buggy_run.stack
        samples: list[float] = []

        def settled() -> bool:
            # Rooms still mid-transfer when the storm ended conclude within ~2 s (longer on a loaded machine); the
            # rest never. Settled: the same for 3 s (a CI run saw 36 for 1.2 s, then 20 for good).
            samples.append(stack.inflight())
            return len(samples) >= 11 and len(set(samples[-11:])) == 1

        assert within(settled, 30.0, interval_s=0.3), f"inflight gauge never settled: {samples}"
        stuck = samples[-1]
        for _ in range(5):  # and it stays there
            time.sleep(0.3)
            samples.append(stack.inflight())
        assert min(samples) > 0, f"inflight gauge drained on the buggy build: {samples}\n{stack.logs()}"
        assert samples[-5:] == [stuck] * 5, samples

    def test_engine_metrics_show_the_stuck_rooms_per_worker(self, buggy_run: StormRun) -> None:
        stack = buggy_run.stack
        answer = http_get(stack.router_port, "/engine_metrics")
        assert answer is not None and answer[0] == 200
        families = {f.name: f for f in text_string_to_metric_families(answer[2])}
        samples = families[INFLIGHT].samples
        assert [s.labels["worker_addr"] for s in samples] == [f"127.0.0.1:{stack.prefill_port}"]
        assert samples[0].value == stack.inflight() > 0
        decode_samples = families["sglang:num_decode_transfer_queue_reqs"].samples
        assert [s.labels["worker_addr"] for s in decode_samples] == [f"127.0.0.1:{stack.decode_port}"]

    def test_metrics_use_the_real_names_labels_and_format(self, buggy_run: StormRun) -> None:
        stack = buggy_run.stack
        for port, engine_type, expected in (
            (stack.prefill_port, "prefill", PREFILL_GAUGES),
            (stack.decode_port, "decode", DECODE_GAUGES),
        ):
            answer = http_get(port, "/metrics")
            assert answer is not None
            status, content_type, text = answer
            assert status == 200
            assert content_type.startswith("text/plain; version=0.0.4")
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert expected <= set(families), sorted(families)
            for name in expected:
                family = families[name]
                assert family.type == "gauge"
                assert family.documentation
                (sample,) = family.samples
                assert set(sample.labels) == ENGINE_LABELS
                assert sample.labels["engine_type"] == engine_type
                assert sample.labels["model_name"] == "demo-model"
                assert math.isfinite(sample.value)
            sample_lines = [line for line in text.splitlines() if line and not line.startswith("#")]
            for line in sample_lines:
                label_part = line[line.index("{") + 1 : line.index("}")]
                keys = [kv.split("=", 1)[0] for kv in label_part.split(",")]
                assert keys == sorted(keys), line
                assert "." in line.rsplit(" ", 1)[1], f"value is not a float: {line}"

    def test_router_metrics_are_router_only(self, buggy_run: StormRun) -> None:
        answer = http_get(buggy_run.stack.router_port, "/metrics")
        assert answer is not None and answer[0] == 200
        names = {f.name for f in text_string_to_metric_families(answer[2])}
        assert names and not any(name.startswith("sglang:") for name in names), names

    def test_abort_all_releases_the_stuck_rooms(self, buggy_run: StormRun) -> None:
        # Runs last in this class: it clears the symptom the tests above observe. Upstream's
        # abort_all also fails every request the prefill scheduler holds, stuck ones included.
        stack = buggy_run.stack
        assert stack.inflight() > 0
        conn = http.client.HTTPConnection("127.0.0.1", stack.router_port, timeout=10)
        try:
            conn.request("POST", "/abort_request", body=json.dumps({"abort_all": True}))
            assert conn.getresponse().status == 200
        finally:
            conn.close()
        assert within(lambda: stack.inflight() == 0, 10.0, interval_s=0.1), stack.logs()


# --- the fixed build ---------------------------------------------------------------------------


class TestFixedBuild:
    def test_storm_is_accounted_for(self, fixed_run: StormRun) -> None:
        assert_storm_accounted(fixed_run.result)

    def test_health_stays_200_during_and_after_the_storm(self, fixed_run: StormRun) -> None:
        assert_health_stayed_200(fixed_run)

    def test_same_storm_drains_the_inflight_queue(self, fixed_run: StormRun) -> None:
        stack = fixed_run.stack
        zeros = 0
        samples: list[float] = []

        def drained_and_stable() -> bool:
            nonlocal zeros
            samples.append(stack.inflight())
            zeros = zeros + 1 if samples[-1] == 0 else 0
            return zeros >= 4

        assert within(drained_and_stable, 10.0, interval_s=0.2), (
            f"inflight gauge did not drain to a stable 0: {samples}\n{stack.logs()}"
        )

    def test_completed_requests_stream_to_the_end(self, fixed_run: StormRun) -> None:
        result = run_storm(
            f"{fixed_run.stack.router_url}/generate",
            requests=8,
            concurrency=4,
            client_timeout_s=10.0,
            payload={"sampling_params": {"max_new_tokens": 4}},
        )
        assert (result.sent, result.completed, result.aborted, result.errors) == (8, 8, 0, 0), result

    def test_storm_with_abort_all_is_accounted_for(self, fixed_run: StormRun) -> None:
        url = fixed_run.stack.router_url
        result = run_storm(f"{url}/generate", requests=40, concurrency=8, client_timeout_s=0.2,
                           abort_all_every=10, abort_url=f"{url}/abort_request")
        assert result.sent == 40 == result.completed + result.aborted + result.errors, result
        assert result.errors == 0, result
        # After the 10th, 20th and 30th request; never after the last one.
        assert result.abort_all_sent == 3, result

    def test_abort_request_by_rid_ends_the_stream_as_aborted(self, fixed_run: StormRun) -> None:
        port = fixed_run.stack.router_port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("POST", "/generate", body=json.dumps(
                {"text": "x", "rid": "rid-under-test", "stream": True, "sampling_params": {"max_new_tokens": 4000}}))
            resp = conn.getresponse()
            assert resp.status == 200
            assert resp.readline().startswith(b"data:")  # decoding has started
            abort = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            abort.request("POST", "/abort_request", body=json.dumps({"rid": "rid-under-test"}))
            assert abort.getresponse().status == 200
            abort.close()
            events = [line for line in resp.read().split(b"\n") if line.startswith(b"data: {")]
        finally:
            conn.close()
        assert json.loads(events[-1][6:])["meta_info"]["finish_reason"]["type"] == "abort"


# --- process behaviour ---------------------------------------------------------------------------


def test_server_answers_503_while_warming_up_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(STACK_SRC, repo, ignore=shutil.ignore_patterns("__pycache__"))
    (port,) = free_ports(1)
    stack = Stack(repo, 0, 0, port, 0, env={"SGLANG_DEMO_STARTUP_S": "1.0"})
    try:
        stack.start("decode", ["--disaggregation-mode", "decode", "--port", str(port), "--enable-metrics"],
                    "sglang.launch_server")
        statuses: list[int] = []

        def answered_200() -> bool:
            answer = http_get(port, "/health", timeout=1.0)
            if answer is not None:
                statuses.append(answer[0])
            return bool(statuses) and statuses[-1] == 200

        assert within(answered_200, START_DEADLINE_S, interval_s=0.05), f"{statuses}\n{stack.log('decode')}"
        assert statuses[0] == 503, statuses
        started = time.monotonic()
        codes = stack.stop()
        assert codes == {"decode": 0}, stack.log("decode")
        assert time.monotonic() - started < 3.0
    finally:
        stack.stop()


# --- the fix files -------------------------------------------------------------------------------


def test_fix_files_differ_from_the_stack_only_by_a_bounded_diff() -> None:
    insertions = deletions = 0
    for fixed, dest in FIX_FILES.items():
        out = subprocess.run(
            ["git", "diff", "--no-index", "--numstat", str(STACK_SRC / dest), str(fixed)],
            capture_output=True, text=True, check=False,
        )
        assert out.returncode == 1, out.stderr  # 1: the files differ
        added, removed, _ = out.stdout.split("\t", 2)
        insertions += int(added)
        deletions += int(removed)
    assert 20 <= insertions <= 40 and 0 <= deletions <= 5, (insertions, deletions)


# --- the storm client's limits -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8000/generate",
        "http://gpu-node-1.example.internal:8000/generate",
        "http://127.0.0.2:8000/generate",
        "http://0.0.0.0:8000/generate",
        "https://127.0.0.1:8000/generate",
        "127.0.0.1:8000/generate",
    ],
)
def test_run_storm_refuses_anything_but_loopback_http(url: str) -> None:
    with pytest.raises(ValueError):
        run_storm(url, requests=1, concurrency=1, client_timeout_s=0.1)


def test_run_storm_refuses_a_non_loopback_abort_url() -> None:
    with pytest.raises(ValueError, match="abort_url"):
        run_storm("http://127.0.0.1:1/generate", requests=1, concurrency=1, client_timeout_s=0.1,
                  abort_all_every=1, abort_url="http://192.168.1.10:8000/abort_request")


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/g", "http://localhost:1/g", "http://[::1]:1/g"])
def test_run_storm_accepts_every_loopback_spelling(url: str) -> None:
    assert run_storm(url, requests=0, concurrency=1, client_timeout_s=0.1).sent == 0


@pytest.mark.parametrize(
    "overrides",
    [
        {"requests": MAX_REQUESTS + 1},
        {"requests": -1},
        {"concurrency": MAX_CONCURRENCY + 1},
        {"concurrency": 0},
        {"client_timeout_s": 0.0},
        {"client_timeout_s": float("nan")},
        {"max_duration_s": float("inf")},
        {"max_duration_s": -1.0},
        {"abort_all_every": 0},
    ],
)
def test_run_storm_refuses_values_outside_its_caps(overrides: dict[str, float]) -> None:
    kwargs: dict[str, Any] = {"requests": 1, "concurrency": 1, "client_timeout_s": 0.1, **overrides}
    with pytest.raises(ValueError):
        run_storm("http://127.0.0.1:1/generate", **kwargs)


def test_run_storm_counts_refused_connections_as_errors() -> None:
    (port,) = free_ports(1)  # nothing listens there
    result = run_storm(f"http://127.0.0.1:{port}/generate", requests=20, concurrency=5, client_timeout_s=1.0)
    assert (result.sent, result.completed, result.aborted, result.errors) == (20, 0, 0, 20), result


def test_run_storm_gives_up_on_a_silent_server_and_stops_at_max_duration() -> None:
    # A listener that never accepts: connections complete in the kernel backlog, answers never come.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    try:
        port = listener.getsockname()[1]
        started = time.monotonic()
        result = run_storm(f"http://127.0.0.1:{port}/generate", requests=1000, concurrency=10,
                           client_timeout_s=0.2, max_duration_s=0.5)
        elapsed = time.monotonic() - started
    finally:
        listener.close()
    assert 0 < result.sent < 1000, result
    assert result.sent == result.aborted + result.errors and result.completed == 0, result
    assert result.aborted > 0, result
    # Ignoring max_duration_s would take 1000 / 10 * 0.2 = 20 s; a busy machine stretches 0.7 s, not 7x.
    assert elapsed < 10.0, elapsed
