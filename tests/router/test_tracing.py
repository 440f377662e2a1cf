"""A live router traced through the standard OTEL_* variables: its spans reach an OTLP/HTTP
collector (a small one in the test, decoding the protobuf export), the client's trace is
continued, and the engine receives the request span's traceparent (enginesim records it,
as vLLM parents its own spans on it). Without the variables, the client's traceparent
passes through untouched and nothing is exported."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from devharness import Fleet, free_port, wait_until
from tests.fleets import fast_fleet
from tests.router.helpers import MODEL, router_config

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, by name."""

    def __init__(self) -> None:
        self.spans: list = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                export = ExportTraceServiceRequest.FromString(body)
                for resource in export.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, name: str) -> list:
        return [span for span in self.spans if span.name == name]


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.server.shutdown()


@pytest.fixture
def logged_fleet(tmp_path: Path) -> Iterator[tuple[Fleet, Path]]:
    log = tmp_path / "engine-requests.jsonl"
    with fast_fleet(1, extra=["--request-log", str(log)]) as fleet:
        yield fleet, log


def _ask(url: str) -> None:
    response = httpx.post(
        url + "/v1/chat/completions",
        timeout=10,
        headers={"traceparent": CLIENT_PARENT},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    response.raise_for_status()


def _engine_saw(log: Path) -> list[str | None]:
    return [json.loads(line)["traceparent"] for line in log.read_text().splitlines()]


def test_spans_reach_the_collector_and_the_engine_gets_the_request_span(
    logged_fleet, collector, router_factory
) -> None:
    fleet, log = logged_fleet
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url + "/v1/traces",
           "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "router-under-test"}  # fmt: skip
    router = router_factory(router_config(fleet, "round_robin"), env=env)
    _ask(router.url)
    wait_until(lambda: collector.named("relay"), 15, "the router's spans exported")
    (request,) = collector.named("switchyard.request")
    assert request.trace_id.hex() == CLIENT_TRACE
    assert request.parent_span_id.hex() == "00f067aa0ba902b7"
    for stage in ("admission", "intake", "flow_control", "decide", "upstream", "relay"):
        (span,) = collector.named(stage)
        assert span.parent_span_id == request.span_id and span.trace_id == request.trace_id
    attributes = {a.key: a.value for a in request.attributes}
    assert attributes["switchyard.instance"].string_value == "i0"
    assert attributes["http.response.status_code"].int_value == 200
    wait_until(lambda: log.exists() and log.read_text(), 5, "the engine's request log")
    assert _engine_saw(log) == [f"00-{CLIENT_TRACE}-{request.span_id.hex()}-01"]


def test_untraced_the_clients_traceparent_passes_through(logged_fleet, router_factory) -> None:
    fleet, log = logged_fleet
    router = router_factory(router_config(fleet, "round_robin"))
    _ask(router.url)
    wait_until(lambda: log.exists() and log.read_text(), 5, "the engine's request log")
    assert _engine_saw(log) == [CLIENT_PARENT]


def test_a_continued_stream_has_a_continuation_span_on_the_instance_that_finished_it(
    collector, router_factory
) -> None:
    """i0 breaks every stream after 3 events; round robin sends one of two requests there,
    and the router continues it on i1: that request's trace has a ``continuation`` span."""
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url + "/v1/traces",
           "OTEL_BSP_SCHEDULE_DELAY": "100"}  # fmt: skip
    with fast_fleet(2) as fleet:
        fleet.fault(0, "drop_midstream", after_chunks=3)
        router = router_factory(router_config(fleet, "round_robin"), env=env)
        body = {"model": MODEL, "prompt": "a b c d e f", "max_tokens": 12, "stream": True}
        for _ in range(2):
            answer = httpx.post(router.url + "/v1/completions", json=body, timeout=30)
            assert answer.status_code == 200 and answer.text.rstrip().endswith("[DONE]")
        wait_until(lambda: len(collector.named("relay")) >= 2, 15, "both requests' spans")
        wait_until(lambda: collector.named("continuation"), 5, "the continuation's span")
    (continuation,) = collector.named("continuation")
    parent = next(
        s for s in collector.named("switchyard.request") if s.span_id == continuation.parent_span_id
    )
    attributes = {a.key: a.value.string_value for a in continuation.attributes}
    assert attributes == {"switchyard.instance": "i1"}
    assert continuation.start_time_unix_nano >= parent.start_time_unix_nano
