"""What a unit's drain reads of a worker: the sum of its in-flight gauges on its /metrics, fetched by the agent on the
worker's host (local and over sshd), whatever else that page holds: histograms, a gauge's _created twin, a line of
another exporter that does not parse."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures_services import served

from deployer.config.routers import RouterWorker
from deployer.demo.run import DEMO_INFLIGHT
from deployer.fleet.router import Worker, inflight
from deployer.steps.context import Context

RUNNING, QUEUED = DEMO_INFLIGHT[0], DEMO_INFLIGHT[1]
GAUGES = f"""# HELP {RUNNING} The number of running requests.
# TYPE {RUNNING} gauge
{RUNNING}{{engine_type="decode",tp_rank="0"}} 2.0
{RUNNING}{{engine_type="decode",tp_rank="1"}} 1.0
# TYPE {QUEUED} gauge
{QUEUED}{{engine_type="decode"}} 4.0
# TYPE {RUNNING}_created gauge
{RUNNING}_created{{engine_type="decode"}} 1796318027.8
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{le="0.1"}} 3.0
sglang:time_to_first_token_seconds_bucket{{le="+Inf"}} 9.0
sglang:time_to_first_token_seconds_count 9.0
sglang:time_to_first_token_seconds_sum 4.5
"""
IN_FLIGHT = 7.0  # 2 + 1 running, 4 queued; the other gauges of DEMO_INFLIGHT are not exported (0)


@pytest.fixture
def page() -> Iterator[list[str]]:
    """An HTTP server on the loopback answering /metrics with page[0]; page[1] is its URL."""
    body = [GAUGES]
    with served(lambda path: body[0].encode()) as server:
        body.append(f"http://127.0.0.1:{server.port}")
        yield body


def worker_of(page: list[str], context: Context) -> Worker:
    return Worker(RouterWorker(service=f"{context.host_name}:decode", worker_type="decode"), page[1],
                  page[1] + "/metrics", context)


def test_a_worker_s_in_flight_count_sums_every_series_of_its_gauges_and_nothing_else_on_its_page(
        page: list[str], context: Context) -> None:
    assert inflight(worker_of(page, context), list(DEMO_INFLIGHT)) == IN_FLIGHT


def test_a_line_of_another_metric_that_does_not_parse_leaves_a_busy_worker_read_as_busy(
        page: list[str], context: Context) -> None:
    # A version string where a number belongs: the whole page did not parse, and the worker read 0 in flight, drained.
    page[0] = GAUGES + '# TYPE vendor_build gauge\nvendor_build{commit="abc"} 1.2.3\n'
    assert inflight(worker_of(page, context), list(DEMO_INFLIGHT)) == IN_FLIGHT


def test_a_gauge_line_that_does_not_parse_is_no_reading_never_drained(page: list[str], context: Context) -> None:
    # One of the gauges themselves garbled (a proxy's truncation, another exporter's value syntax): the worker's
    # in-flight count is not known, so the drain goes on waiting (and fails at its deadline saying unreadable), never 0.
    page[0] = GAUGES.replace(f'{QUEUED}{{engine_type="decode"}} 4.0', f'{QUEUED}{{engine_type="decode"}} 4.0.1')
    assert inflight(worker_of(page, context), list(DEMO_INFLIGHT)) is None
