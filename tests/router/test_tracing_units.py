"""The router's OpenTelemetry spans, with the SDK's in-memory exporter: one request span
(the client's trace continued), its stages as children timed by the stage clock's stamps,
the engine's traceparent naming the request span; and when the OTEL_* variables ask for
traces at all."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from router_worker.contract.tracing import wanted
from router_worker.stages import StageClock
from router_worker.tracing import RequestTracer

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> tuple[RequestTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return RequestTracer(provider.get_tracer("test")), exporter


def _clock() -> StageClock:
    started = time.perf_counter()
    clock = StageClock(started)
    clock.admitted = started + 0.0005
    clock.body, clock.intake = started + 0.001, started + 0.002
    clock.released, clock.decided = started + 0.0025, started + 0.003
    clock.connected, clock.sent, clock.head = started + 0.004, started + 0.005, started + 0.050
    clock.event, clock.relayed = started + 0.060, started + 0.061
    return clock


def test_a_request_span_continues_the_clients_trace_with_its_stages(spans) -> None:
    tracer, exporter = spans
    clock = _clock()
    span = tracer.start({"traceparent": CLIENT_PARENT}, clock.started)
    sent = tracer.traceparent(span)
    tracer.finish(span, clock, {"switchyard.instance": "i1", "switchyard.ttft_s": None}, False)
    finished = {s.name: s for s in exporter.get_finished_spans()}
    stages = ("admission", "intake", "flow_control", "decide", "upstream", "relay")
    assert set(finished) == {"switchyard.request", *stages}
    request = finished["switchyard.request"]
    assert format(request.context.trace_id, "032x") == CLIENT_TRACE
    assert format(request.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert sent == f"00-{CLIENT_TRACE}-{request.context.span_id:016x}-01"  # to the engine
    assert request.attributes == {"switchyard.instance": "i1"}  # None values left out
    for name in stages:
        assert finished[name].parent.span_id == request.context.span_id
    upstream = finished["upstream"]
    assert upstream.end_time - upstream.start_time == pytest.approx(57e6, abs=1e3)  # ns
    assert finished["admission"].start_time == request.start_time
    assert finished["intake"].start_time == finished["admission"].end_time
    assert finished["flow_control"].end_time - finished["flow_control"].start_time == (
        pytest.approx(0.5e6, abs=1e3)
    )
    order = [finished[n].start_time for n in stages]
    assert order == sorted(order)


def test_each_continuation_is_a_child_span_on_its_instance(spans) -> None:
    tracer, exporter = spans
    clock = _clock()
    span = tracer.start({}, clock.started)
    now = time.time()
    continued = [("i2", now + 0.1, now + 0.4), ("i3", now + 0.5, now + 0.5)]
    tracer.finish(span, clock, {}, False, continuations=continued)
    finished = exporter.get_finished_spans()
    request = next(s for s in finished if s.name == "switchyard.request")
    children = sorted((s for s in finished if s.name == "continuation"), key=lambda s: s.start_time)
    assert [c.attributes["switchyard.instance"] for c in children] == ["i2", "i3"]
    assert all(c.parent.span_id == request.context.span_id for c in children)
    assert children[0].end_time - children[0].start_time == pytest.approx(0.3e9, abs=1e3)


def test_without_a_client_trace_the_request_starts_one_and_errors_are_marked(spans) -> None:
    tracer, exporter = spans
    clock = StageClock(time.perf_counter())  # failed before any stage was stamped
    span = tracer.start({}, clock.started)
    tracer.finish(span, clock, {"http.response.status_code": 502}, error=True)
    (request,) = exporter.get_finished_spans()
    assert request.parent is None and request.status.is_ok is False


def test_a_request_the_sampler_leaves_out_makes_no_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = RequestTracer(provider.get_tracer("test"))
    clock = _clock()
    span = tracer.start({}, clock.started)
    sent = tracer.traceparent(span)
    assert sent is not None and int(sent.split("-")[3], 16) & 1 == 0  # the engine: unsampled
    tracer.finish(span, clock, {"switchyard.instance": "i1"}, False)
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_traces_are_off_unless_the_standard_variables_ask(env, on) -> None:
    assert wanted(env) is on


def test_untraced_a_router_imports_nothing_of_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from router_worker import cli, tracing\n"
        "from router_worker.service import Service, ServiceOptions\n"
        "assert tracing.setup({}) is None\n"
        "Service(ServiceOptions(name='untraced'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_router_asked_for_an_unknown_exporter_refuses_to_start(tmp_path) -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"}
    done = subprocess.run(
        [sys.executable, "-m", "router_worker", "--config", str(tmp_path / "absent.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "OTEL_TRACES_EXPORTER: unknown exporter 'zipkin'" in done.stderr
