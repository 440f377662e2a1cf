"""A task sent while a span is current carries its trace to a real Celery worker, which
(traced through the standard OTEL_* variables) exports the task's span as the sender's
child to an OTLP/HTTP collector."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

from controlplane import tracing
from controlplane.tasks.maintenance import ping
from devharness import control_plane as cp
from devharness import free_port, stop_process, wait_until
from devharness import start_process as harness_start
from tests.router.test_tracing import Collector

from .helpers import ROOT, subprocess_env

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    yield found
    found.server.shutdown()


@pytest.fixture
def traced_worker(collector: Collector, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    queue = f"tracing-{free_port()}"
    args = cp.worker_command(queue, queue, solo=True, log_level="WARNING")
    env = {**subprocess_env(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url + "/v1/traces",
           "OTEL_BSP_SCHEDULE_DELAY": "100"}  # fmt: skip
    log = tmp_path / "worker.log"
    process = harness_start(args, cwd=ROOT, env=env, log=log, stdin=None)
    yield queue, log
    stop_process(process)


def test_a_task_continues_the_trace_that_sent_it(collector, traced_worker) -> None:
    queue, log = traced_worker
    sender = TracerProvider().get_tracer("test")  # spans not exported: only their context
    tracing.use(sender)
    try:
        with sender.start_as_current_span("sender") as span:
            result = ping.apply_async(queue=queue)
        assert result.get(timeout=60)["database"] == "ok"
    finally:
        tracing.TRACER = None
    wait_until(lambda: collector.named("celery switchyard.ping"), 30, "the task's span", log=log)
    (task,) = collector.named("celery switchyard.ping")
    assert task.trace_id == span.get_span_context().trace_id.to_bytes(16, "big")
    assert task.parent_span_id == span.get_span_context().span_id.to_bytes(8, "big")
