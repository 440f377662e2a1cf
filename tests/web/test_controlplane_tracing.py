"""The control plane's OpenTelemetry spans, with the SDK's in-memory exporter: a span per
request Django serves, named by its route and continuing the caller's trace, and one per
Celery task; untraced, the middleware takes itself out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.exceptions import MiddlewareNotUsed
from django.test import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane import tracing
from controlplane.tasks.maintenance import ping

pytestmark = pytest.mark.django_db
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider.get_tracer("test"))
    yield exporter
    tracing.TRACER = None


def test_a_request_is_a_span_named_by_its_route(exported, users, cluster) -> None:
    client = Client()  # its handler loads the middleware now, with tracing on
    client.force_login(users["viewer"])
    response = client.get(
        f"/api/v1/clusters/{cluster.pk}", HTTP_TRACEPARENT=f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
    )
    assert response.status_code == 200
    (span,) = exported.get_finished_spans()
    assert span.name == "GET /api/v1/clusters/<cluster_id>"  # the route, not the id
    assert format(span.context.trace_id, "032x") == CLIENT_TRACE
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["url.path"] == f"/api/v1/clusters/{cluster.pk}"


def test_a_celery_task_is_a_span(exported) -> None:
    assert ping.apply().get()["database"] == "ok"
    (span,) = exported.get_finished_spans()
    assert span.name == "celery switchyard.ping"
    assert span.attributes["celery.state"] == "SUCCESS"


def test_untraced_the_middleware_takes_itself_out(users) -> None:
    assert tracing.TRACER is None
    with pytest.raises(MiddlewareNotUsed):
        tracing.TracingMiddleware(lambda request: None)  # type: ignore[arg-type,return-value]
