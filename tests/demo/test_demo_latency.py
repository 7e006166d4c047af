"""The demo servers export SGLang's latency histograms (TTFT, inter-token, end-to-end) and its aborted-request
counter as real Prometheus text, the analysis parses them, their buckets move with each generation, and
SGLANG_DEMO_SLOWDOWN gives a server a latency regression that the analysis fails against an unslowed sibling. A PD
request through the router is observed on both sides, the prefill's time to first token included (what
`deployer demo --fleet` judges), and a client that leaves after its whole answer aborts nothing."""

from __future__ import annotations

import http.client
import json
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from polling import within
from ports import free_ports
from test_demo_stack import STACK_SRC, Stack, http_get, start_stack

from deployer.analysis import LatencyCheck, Scrape, canary_vs_baseline, parse_scrape, sglang_checks
from deployer.analysis.window import counter_windows, histogram_windows

TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"
E2E = "sglang:e2e_request_latency_seconds"
ABORTED = "sglang:num_aborted_requests_total"
LOADED = {"SGLANG_DEMO_TTFT_S": "0.25", "SGLANG_DEMO_TOKEN_S": "0.002"}  # TTFTs spread over SGLang's buckets


def start_server(workdir: Path, name: str, env: dict[str, str]) -> Stack:
    repo = workdir / name
    shutil.copytree(STACK_SRC, repo, ignore=shutil.ignore_patterns("__pycache__"))
    (port,) = free_ports(1)
    server = Stack(repo, 0, 0, port, 0, env=env)
    server.start("decode", ["--disaggregation-mode", "decode", "--port", str(port), "--enable-metrics"],
                 "sglang.launch_server")
    server.wait_healthy("decode", port)
    return server


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Stack]]:
    started: list[Stack] = []
    yield started
    for server in started:
        server.stop()


def read(server: Stack) -> Scrape:
    answer = http_get(server.decode_port, "/metrics")
    assert answer is not None and answer[0] == 200, server.log("decode")
    return parse_scrape(answer[2], time.time())


def generate(port: int, body: dict[str, object], path: str = "/generate") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_each_generation_moves_the_latency_buckets_of_real_prometheus_text(tmp_path: Path,
                                                                          servers: list[Stack]) -> None:
    servers.append(server := start_server(tmp_path, "server", LOADED))
    before = read(server)
    streamed = {"text": "hello there", "stream": True, "sampling_params": {"max_new_tokens": 5}}
    assert [generate(server.decode_port, streamed) for _ in range(3)] == [200] * 3
    assert generate(server.decode_port, {"text": "hi", "sampling_params": {"max_new_tokens": 3}}) == 200
    assert generate(server.decode_port, {"prompt": "hi", "max_tokens": 2, "stream": True}, "/v1/completions") == 200
    # A request's end-to-end latency is observed when its handler returns, which may be just after the client read
    # its last byte: read until all 5 are in (a deadline, never a sleep); the counts are asserted below all the same.
    reads: list[Scrape] = []

    def all_ended() -> bool:
        reads.append(read(server))
        return histogram_windows([before, reads[-1]], E2E, {})[0].count >= 5

    within(all_ended, 10)
    after = reads[-1]

    (ttft,) = histogram_windows([before, after], TTFT, {"engine_type": "decode"})
    (itl,) = histogram_windows([before, after], ITL, {})
    (e2e,) = histogram_windows([before, after], E2E, {})
    assert (ttft.count, itl.count, e2e.count) == (5, 3 * 4 + 1, 5)  # 5 first tokens; 4 gaps a stream of 5, 1 of 2
    assert not ttft.reset and ttft.cumulative[0] < ttft.count  # not all within SGLang's first bucket (0.1 s)
    assert ttft.sum > 5 * 0.02 and e2e.sum >= ttft.sum
    (aborted,) = counter_windows([before, after], ABORTED, {})
    assert aborted.increase == 0
    histogram = after.histogram(TTFT, {})
    assert histogram is not None and histogram.created is not None  # a restart shows by it


def test_a_slowed_server_fails_the_analysis_against_its_unslowed_sibling(tmp_path: Path,
                                                                         servers: list[Stack]) -> None:
    servers.append(baseline := start_server(tmp_path, "baseline", LOADED))
    servers.append(canary := start_server(tmp_path, "canary", {**LOADED, "SGLANG_DEMO_SLOWDOWN": "1.0"}))
    body = {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 2}}
    reads: dict[str, list[Scrape]] = {"baseline": [], "canary": []}
    ports = [baseline.decode_port, canary.decode_port] * 40
    with ThreadPoolExecutor(max_workers=32) as pool:
        for _ in range(3):  # three windows of 40 requests a server, both servers under the same load
            reads["baseline"].append(read(baseline))
            reads["canary"].append(read(canary))
            assert list(pool.map(lambda port: generate(port, body), ports)) == [200] * 80
        reads["baseline"].append(read(baseline))
        reads["canary"].append(read(canary))
    checks = [LatencyCheck(name="p99 TTFT", metric=TTFT), *[c for c in sglang_checks() if c.kind == "critical"]]
    report = canary_vs_baseline(checks, reads["canary"], reads["baseline"])
    ttft = report.verdicts[0]
    assert [w.count for w in ttft.canary_windows] == [40, 40, 40], ttft
    assert ttft.outcome == "fail" and ttft.method == "mann-whitney", ttft.why
    assert ttft.change is not None and ttft.change > 0.10, ttft.why
    assert {v.check: v.outcome for v in report.verdicts[1:]} == {
        "aborted requests": "pass", "KV transfer failures": "pass", "KV bootstrap failures": "pass"}


def test_a_pd_request_through_the_router_is_observed_on_both_sides_and_a_client_leaving_after_it_aborts_nothing(
        tmp_path: Path, servers: list[Stack]) -> None:
    servers.append(stack := start_stack(tmp_path, fixed=True))
    prefill = Stack(stack.repo, 0, 0, stack.prefill_port, 0)  # read() reads a Stack's decode_port
    before = {"prefill": read(prefill), "decode": read(stack)}
    body = {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 3}}
    # Each client reads its whole stream and closes at once, before the prefill's answer (one scheduler poll later).
    assert [generate(stack.router_port, body) for _ in range(6)] == [200] * 6
    reads: dict[str, Scrape] = {}

    def observed() -> bool:
        reads.update(prefill=read(prefill), decode=read(stack))
        return all(histogram_windows([before[side], reads[side]], E2E, {})[0].count >= 6 for side in reads)

    assert within(observed, 10, interval_s=0.2), reads
    for side in ("prefill", "decode"):
        (ttft,) = histogram_windows([before[side], reads[side]], TTFT, {"engine_type": side})
        (aborted,) = counter_windows([before[side], reads[side]], ABORTED, {})
        assert (side, ttft.count, aborted.increase) == (side, 6, 0)
