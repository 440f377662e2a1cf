"""OpenTelemetry spans of the control plane: one per HTTP request Django serves (the API,
the pages; the child of the caller's ``traceparent`` when it sends one) and one per Celery
task a worker runs (the child of the span that sent it, through the task's
``traceparent`` header). Off unless the standard ``OTEL_*`` variables ask for traces, as
the router reads them (``router_worker.contract.tracing``): off, the middleware removes
itself at start-up (Django's ``MiddlewareNotUsed``), no signal is connected and nothing of
OpenTelemetry is imported. Set up once per process when the app is ready (the SDK restarts
its export thread in forked Celery workers)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import MiddlewareNotUsed
from django.http import HttpRequest, HttpResponse

from router_worker.contract import tracing as otel

TRACER: Any = None
_running: dict[str, Any] = {}  # Celery task id -> its span, from prerun to postrun


def setup(env: Mapping[str, str] = os.environ) -> Any:
    """The process's tracer when the variables ask for traces, else None."""
    global TRACER
    provider = otel.provider(env)
    if provider is not None:
        use(provider.get_tracer("switchyard.controlplane"))
    return TRACER


def use(tracer: Any) -> None:
    """Trace with ``tracer`` from now on: requests served by handlers loaded after this, and
    every Celery task."""
    global TRACER
    from celery.signals import before_task_publish, task_postrun, task_prerun

    TRACER = tracer
    before_task_publish.connect(_task_sent, weak=False, dispatch_uid="switchyard-tracing-sent")
    task_prerun.connect(_task_started, weak=False, dispatch_uid="switchyard-tracing-prerun")
    task_postrun.connect(_task_ended, weak=False, dispatch_uid="switchyard-tracing-postrun")


class TracingMiddleware:
    """A span per request: ``<method> <route>`` (the URL pattern, not the path's ids)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        if TRACER is None:
            raise MiddlewareNotUsed
        from opentelemetry import propagate, trace

        self.get_response, self.trace = get_response, trace
        self.propagator = propagate.get_global_textmap()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        parent = self.propagator.extract({"traceparent": request.headers.get("traceparent", "")})
        kind = self.trace.SpanKind.SERVER
        with TRACER.start_as_current_span(
            request.method or "HTTP", context=parent, kind=kind
        ) as span:
            response = self.get_response(request)
            match = request.resolver_match
            if match is not None:
                span.update_name(f"{request.method} /{match.route}")
            span.set_attributes(
                {
                    "http.request.method": request.method or "",
                    "url.path": request.path,
                    "http.route": f"/{match.route}" if match is not None else "",
                    "http.response.status_code": response.status_code,
                }
            )
            if response.status_code >= 500:
                span.set_status(self.trace.Status(self.trace.StatusCode.ERROR))
        return response


def _task_sent(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """A task sent while a span is current (a request's, a task's) carries its context."""
    if TRACER is None or headers is None:
        return
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if "traceparent" in carrier:
        headers["traceparent"] = carrier["traceparent"]


def _task_started(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if TRACER is None or task_id is None:
        return
    from opentelemetry import propagate, trace

    request = task.request  # a worker merges a message's headers into it; apply() does not
    sent_by = getattr(request, "traceparent", None) or (request.headers or {}).get("traceparent")
    parent = propagate.extract({"traceparent": sent_by}) if isinstance(sent_by, str) else None
    kind = trace.SpanKind.CONSUMER
    span = TRACER.start_span(f"celery {task.name}", context=parent, kind=kind)
    span.set_attributes({"celery.task_name": task.name, "celery.task_id": task_id})
    _running[task_id] = span


def _task_ended(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    span = _running.pop(task_id or "", None)
    if span is None:
        return
    span.set_attribute("celery.state", state or "")
    if state == "FAILURE":
        from opentelemetry import trace

        span.set_status(trace.Status(trace.StatusCode.ERROR))
    span.end()
