"""A rollout's events out (issue 37 item 4): real fleet and single-host applies over the real sshd (test_fleet's
four hosts) POST their events to real HTTP servers on 127.0.0.1; a webhook that fails is tried again within its
bound, one that never answers costs the rollout a bounded wait and nothing else, and a header's secret is never
shown. The spans go to a real OTLP/HTTP receiver on 127.0.0.1 that decodes the protobuf it is sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import test_fleet
import yaml
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, age_lock, git, staged_bytes
from test_fleet import as_json, repo

fleet = test_fleet.fleet
second_sshd = test_fleet.second_sshd
TOKEN = "s3cret-hook-token"


@dataclass
class Hook:
    """An HTTP server on 127.0.0.1 that records each POST; it answers 500 to the first `failing` ones, and
    never answers at all while `hang` is set."""

    failing: int = 0
    hang: bool = False
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    @property
    def documents(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.posts]


@pytest.fixture
def hook() -> Iterator[Hook]:
    state = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.posts.append((dict(self.headers), body))
            if state.hang:
                state.released.wait(60)
                return
            failed = len(state.posts) <= state.failing
            self.send_response(500 if failed else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/team?token=url-secret-xyz"
    yield state
    state.released.set()
    server.shutdown()
    server.server_close()


def notify(project: Project, **settings: Any) -> None:
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["notify"] = settings
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))


def webhook(hook: Hook, **more: Any) -> dict[str, Any]:
    return {"url": hook.url, "headers": {"Authorization": {"value_from_env": "HOOK_TOKEN"}}, **more}


def test_a_fleet_apply_posts_every_rollout_event_in_order_with_its_fields(fleet: Project, hook: Hook) -> None:
    fleet.extra_env["HOOK_TOKEN"] = TOKEN
    notify(fleet, webhooks=[webhook(hook)])
    fleet.playbook(steps=test_fleet.BOUNDED, rollout={"batches": [1, 3]})
    result = fleet.deployer("apply", "fix.yaml", "--host", "h*", "--json")
    report = as_json(result)
    assert result.returncode == 0, result.stderr
    docs = hook.documents  # delivered before the command ended: its end flushes them
    assert [d["type"] for d in docs] == ["rollout.start", "batch.start", "host.end", "batch.end", "batch.start",
                                         "host.end", "host.end", "host.end", "batch.end", "rollout.end"]
    assert all(d["schema"] == "deployer.event/1" and d["fleet"] == report["fleet_id"] and d["deployer"]
               for d in docs)
    assert docs[0]["data"]["hosts"] == list(test_fleet.HOSTS) and docs[0]["data"]["batches"] == [
        ["h1"], ["h2", "h3", "h4"]]
    assert [d["batch"] for d in docs[1:9]] == [0, 0, 0, 1, 1, 1, 1, 1]
    ended = {d["host"]: d for d in docs if d["type"] == "host.end"}
    assert set(ended) == set(test_fleet.HOSTS)
    assert all(ended[h]["status"] == "successful" and ended[h]["run"] == report["hosts"][h]["run_id"]
               and ended[h]["exit_code"] == 0 for h in ended)
    assert docs[8]["status"] == "successful" and docs[8]["data"]["hosts"] == dict.fromkeys(("h2", "h3", "h4"),
                                                                                             "successful")
    assert docs[-1]["status"] == "successful" and docs[-1]["exit_code"] == 0
    headers, _ = hook.posts[0]
    assert headers["Authorization"] == TOKEN and headers["Content-Type"] == "application/json"
    assert not (fleet.runs / ".notify.jsonl").exists()


def test_a_webhook_that_fails_twice_gets_each_event_on_its_third_try(fleet: Project, hook: Hook) -> None:
    hook.failing = 2
    fleet.extra_env["HOOK_TOKEN"] = TOKEN
    notify(fleet, webhooks=[webhook(hook, events=["run.start", "run.end"], retries=2)])
    fleet.playbook(steps=test_fleet.BOUNDED)
    result = fleet.deployer("apply", "fix.yaml", "--host", "h1")
    assert result.returncode == 0, result.stderr
    assert [d["type"] for d in hook.documents] == ["run.start"] * 3 + ["run.end"]
    end = hook.documents[-1]
    assert end["host"] == "h1" and end["status"] == "successful" and end["phase"] == "succeeded", end
    assert "not delivered" not in result.stderr + result.stdout
    assert not (fleet.runs / ".notify.jsonl").exists()


def test_a_single_host_runs_documents_each_name_its_run(fleet: Project, hook: Hook) -> None:
    fleet.extra_env["HOOK_TOKEN"] = TOKEN
    notify(fleet, webhooks=[webhook(hook)])
    fleet.playbook(steps=test_fleet.BOUNDED)
    result = fleet.deployer("apply", "fix.yaml", "--host", "h1", "--json")
    assert result.returncode == 0, result.stderr
    run_id = as_json(result)["run_id"]
    assert [(d["type"], d["run"]) for d in hook.documents] == [("run.start", run_id), ("run.end", run_id)]
    assert all(d["fleet"] is None and d["host"] == "h1" for d in hook.documents)


def test_a_webhook_that_never_answers_costs_a_bounded_wait_is_recorded_and_never_shows_its_secrets(
        fleet: Project, hook: Hook) -> None:
    hook.hang = True
    fleet.extra_env["HOOK_TOKEN"] = TOKEN
    notify(fleet, webhooks=[webhook(hook, timeout_s=0.5, retries=1)], flush_s=2)
    fleet.playbook(steps=test_fleet.BOUNDED)
    result = fleet.deployer("apply", "fix.yaml", "--host", "h1,h2")
    exited = datetime.now(timezone.utc)
    assert result.returncode == 0, result.stderr
    [record] = fleet.runs.glob("*/fleet.json")
    ended = datetime.fromisoformat(json.loads(record.read_text())["ended"].replace("Z", "+00:00"))
    # After the rollout ended, its end waited for the webhook no longer than flush_s (2 s), then gave up.
    assert (exited - ended).total_seconds() < 2 + 1.5, (ended, exited)
    said = result.stdout + result.stderr
    assert "webhook http://127.0.0.1:" in said and "were not delivered within 2s" in said, said
    [failed, *_] = [json.loads(line) for line in (fleet.runs / ".notify.jsonl").read_text().splitlines()]
    assert failed["type"] == "notify_failed" and failed["attempts"] == 2 and failed["event"] == "rollout.start"
    assert failed["url"].endswith("/***") and "timed out" in failed["error"]
    assert hook.posts[0][0]["Authorization"] == TOKEN  # it was sent, and only there
    logs = [p.read_text() for p in fleet.runs.rglob("*") if p.is_file()]
    for secret in (TOKEN, "url-secret-xyz"):
        assert secret not in said and not any(secret in text for text in logs)


def test_a_header_whose_environment_variable_is_unset_stops_the_apply_before_it_changes_anything(
        fleet: Project, hook: Hook) -> None:
    notify(fleet, webhooks=[webhook(hook)])
    fleet.playbook(steps=test_fleet.BOUNDED)
    head = git(repo(fleet, "h1"), "rev-parse", "HEAD")
    result = fleet.deployer("apply", "fix.yaml", "--host", "h1")
    assert result.returncode == 2 and "HOOK_TOKEN is not set" in result.stderr, result.stderr
    assert git(repo(fleet, "h1"), "rev-parse", "HEAD") == head and hook.posts == []


def test_a_fleet_apply_exports_its_spans_rollout_batch_host_step_to_an_otlp_receiver(fleet: Project) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[bytes] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        notify(fleet, otlp={"endpoint": f"http://127.0.0.1:{server.server_address[1]}/v1/traces"})
        fleet.playbook(steps=test_fleet.BOUNDED, rollout={"batches": [1, 1]})
        result = fleet.deployer("apply", "fix.yaml", "--host", "h1,h2")
        assert result.returncode == 0, result.stderr
    finally:
        server.shutdown()
        server.server_close()
    spans = []
    for body in received:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans += [s for r in request.resource_spans for scope in r.scope_spans for s in scope.spans]
    by_id = {s.span_id: s for s in spans}
    names = {s.name for s in spans}
    assert {"rollout", "batch 0", "batch 1", "host h1", "host h2", "step commit"} <= names, names

    def parents(span: Any) -> list[str]:
        found = []
        while span.parent_span_id:
            span = by_id[span.parent_span_id]
            found.append(span.name)
        return found

    commits = [s for s in spans if s.name == "step commit"]
    assert sorted(parents(s) for s in commits) == [["host h1", "batch 0", "rollout"],
                                                   ["host h2", "batch 1", "rollout"]]
    rollout = next(s for s in spans if s.name == "rollout")
    attributes = {a.key: a.value.string_value for a in rollout.attributes}
    assert attributes["deployer.status"] == "successful" and attributes["deployer.fleet"]


def test_an_analysis_verdict_is_a_document_and_its_gate_numbers_are_attributes_of_the_step_that_judged() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from deployer.fleet.notify import Documents
    from deployer.fleet.spans import Spans

    verdict = {"type": "analysis_verdict", "host": "h1", "metric": "ttft_p99", "verdict": "fail", "measured": 0.31,
               "threshold": 0.22, "method": "mann-whitney"}
    events = [{"type": "fleet_start", "fleet": "F1", "hosts": ["h1"], "batches": [["h1"]]},
              {"type": "batch_start", "fleet": "F1", "batch": 0, "hosts": ["h1"]},
              {"type": "host_status", "fleet": "F1", "host": "h1", "status": "running"},
              {"type": "step_start", "host": "h1", "step": "analysis", "kind": "analysis"}, verdict,
              {"type": "step_end", "host": "h1", "step": "analysis", "status": "failed"},
              {"type": "host_status", "fleet": "F1", "host": "h1", "status": "failed", "exit_code": 1},
              {"type": "fleet_end", "fleet": "F1", "status": "failed", "exit_code": 1}]
    documents = Documents("fleet", {"h1": "pd-1"})
    [judged] = [d for e in events for d in documents.of(e) if d["type"] == "analysis.verdict"]
    assert (judged["verdict"], judged["host"], judged["unit"], judged["batch"], judged["fleet"]) == (
        "fail", "h1", "pd-1", 0, "F1")
    assert judged["data"] == {"metric": "ttft_p99", "measured": 0.31, "threshold": 0.22, "method": "mann-whitney"}
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = Spans(provider, "fleet", 1.0)
    for event in events:
        spans(event)
    spans.close()
    step = next(s for s in exporter.get_finished_spans() if s.name == "step analysis")
    assert step.attributes is not None
    assert {k: step.attributes[k] for k in step.attributes if k.startswith("deployer.gate.")} == {
        "deployer.gate.ttft_p99.verdict": "fail", "deployer.gate.ttft_p99.measured": 0.31,
        "deployer.gate.ttft_p99.threshold": 0.22, "deployer.gate.ttft_p99.method": "mann-whitney"}
    assert not step.status.is_ok and [s.name for s in exporter.get_finished_spans()][-1] == "rollout"


def test_a_resumed_rollout_opens_its_own_rollout_span_naming_the_run_it_resumes_so_its_batches_have_a_parent(
) -> None:
    """`rollout resume` is another process than the apply that paused: it never sees fleet_start."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from deployer.fleet.spans import Spans

    def spans_of(events: list[dict[str, Any]]) -> list[Any]:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        spans = Spans(provider, "fleet", 1.0)
        for event in events:
            spans(event)
        spans.close()
        return list(exporter.get_finished_spans())

    def host(name: str, batch: int) -> list[dict[str, Any]]:
        return [{"type": "batch_start", "fleet": "F1", "batch": batch, "hosts": [name]},
                {"type": "host_status", "fleet": "F1", "host": name, "status": "running"},
                {"type": "step_start", "host": name, "step": "commit", "kind": "commit"},
                {"type": "step_end", "host": name, "step": "commit", "status": "ok"},
                {"type": "host_status", "fleet": "F1", "host": name, "status": "successful", "exit_code": 0}]

    batches = [["h1"], ["h2"]]
    applied = spans_of([{"type": "fleet_start", "fleet": "F1", "hosts": ["h1", "h2"], "batches": batches,
                         "kind": "apply"}, *host("h1", 0),
                        {"type": "fleet_paused", "fleet": "F1", "batch": 1, "reason": "the rollout pauses"},
                        {"type": "fleet_end", "fleet": "F1", "status": "paused", "exit_code": 8}])
    first = next(s for s in applied if s.name == "rollout")
    assert first.status.is_unset and [e.name for e in first.events] == ["paused"]  # a pause is no error
    resumed = spans_of([{"type": "fleet_resumed", "fleet": "F1", "batch": 1, "reason": "the rollout pauses",
                         "approved": [], "hosts": ["h1", "h2"], "batches": batches}, *host("h2", 1),
                        {"type": "fleet_end", "fleet": "F1", "status": "successful", "exit_code": 0}])
    by_id = {s.context.span_id: s for s in resumed}

    def parents(span: Any) -> list[str]:
        found = []
        while span.parent is not None:
            span = by_id[span.parent.span_id]
            found.append(span.name)
        return found

    [step] = [s for s in resumed if s.name == "step commit"]
    assert parents(step) == ["host h2", "batch 1", "rollout"]
    root = next(s for s in resumed if s.name == "rollout")
    assert root.attributes is not None and root.attributes["deployer.resume_of"] == "F1"
    assert root.attributes["deployer.status"] == "successful" and root.parent is None


# -- rollbacks and recovers are events too (issue 37 item 4) ------------------------------------------------------


def test_deployer_rollback_of_a_fleet_run_and_of_one_run_each_tell_the_webhook(fleet: Project, hook: Hook) -> None:
    fleet.playbook(steps=test_fleet.BOUNDED)
    applied = as_json(fleet.deployer("apply", "fix.yaml", "--host", "h1,h2", "--json"))
    single = as_json(fleet.deployer("apply", "fix.yaml", "--host", "h3", "--json"))
    notify(fleet, webhooks=[{"url": hook.url}])  # heard from here on: the rollbacks only

    rolled = fleet.deployer("rollback", applied["fleet_id"], "--json")
    report = as_json(rolled)
    assert rolled.returncode == 0, rolled.stderr
    docs = hook.documents
    assert [d["type"] for d in docs] == ["rollout.start", "rollout.rollback", "batch.start", "host.end", "host.end",
                                         "batch.end", "rollout.end"], docs
    assert docs[0]["data"]["kind"] == "rollback" and all(d["fleet"] == report["fleet_id"] for d in docs)
    assert docs[1]["data"] == {"hosts": ["h1", "h2"], "of_fleet": applied["fleet_id"]}
    assert docs[-1]["status"] == "successful"

    del hook.posts[:]
    undone = fleet.deployer("rollback", single["run_id"], "--json")
    assert undone.returncode == 0, undone.stderr
    docs = hook.documents
    assert [d["type"] for d in docs] == ["run.start", "run.rollback", "run.end"], docs
    run_id = as_json(undone)["run_id"]
    assert all(d["run"] == run_id and d["host"] == "h3" for d in docs)
    assert docs[0]["data"]["kind"] == "rollback" and docs[1]["data"]["of_run"] == single["run_id"]
    assert docs[2]["status"] == "successful" and (repo(fleet, "h3") / "pkg/a.py").read_text() == ORIGINAL_A


def test_rollout_abort_tells_the_webhook_of_its_rollback_then_of_the_abort(fleet: Project, hook: Hook) -> None:
    notify(fleet, webhooks=[{"url": hook.url, "events": ["rollout.rollback", "rollout.aborted", "rollout.end"]}])
    fleet.playbook(steps=test_fleet.BOUNDED, rollout={"batches": [1, "100%"], "steps": ["batch", {"pause": {}}]})
    paused = as_json(fleet.deployer("apply", "fix.yaml", "--host", "h1,h2", "--json"))
    assert paused["status"] == "paused"
    del hook.posts[:]
    aborted = fleet.deployer("rollout", "abort", paused["fleet_id"], "--json")
    report = as_json(aborted)
    assert aborted.returncode == 0, aborted.stderr
    docs = hook.documents
    assert [d["type"] for d in docs] == ["rollout.rollback", "rollout.end", "rollout.aborted"], docs
    rollback_id = report["rollback"]["fleet_id"]
    assert docs[0]["data"] == {"hosts": ["h1"], "of_fleet": paused["fleet_id"]} and docs[0]["fleet"] == rollback_id
    assert docs[2]["fleet"] == paused["fleet_id"] and docs[2]["status"] == "aborted"
    assert docs[2]["data"]["rolled_back_by"] == rollback_id


def test_deployer_recover_of_a_cut_run_tells_the_webhook_what_it_found(fleet: Project, hook: Hook) -> None:
    fleet.playbook(steps=test_fleet.BOUNDED)
    inventory = fleet.inventory.read_text()
    test_fleet.slow_remote_compile(fleet, 30)
    proc = fleet.popen("apply", "fix.yaml", "--host", "h1")
    try:
        deadline = time.monotonic() + 30
        while staged_bytes(repo(fleet, "h1"), "pkg/a.py") != FIXED_A:
            assert time.monotonic() < deadline and proc.poll() is None, "the upload was never staged"
            time.sleep(0.05)
    finally:
        proc.kill()  # cut in the compile: the staged bytes, a lock and an intent record left on h1
        proc.communicate(timeout=30)
    age_lock(repo(fleet, "h1"))
    fleet.inventory.write_text(inventory)  # the recover's own python does not sleep
    notify(fleet, webhooks=[{"url": hook.url, "events": ["run.recover", "run.end"]}])
    [cut] = [p.name for p in fleet.runs.iterdir() if (p / "events.jsonl").is_file()]
    recovered = fleet.deployer("recover", cut, "--json")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    docs = hook.documents
    assert [d["type"] for d in docs] == ["run.recover", "run.end"], docs
    assert docs[0]["host"] == "h1" and docs[0]["data"]["of_run"] == cut and docs[0]["data"]["outcome"], docs[0]
    assert docs[1]["status"] == "successful" and docs[0]["run"] == docs[1]["run"] == as_json(recovered)["run_id"]
    assert docs[0]["run"] != cut  # the recover's own run, which names the cut one
