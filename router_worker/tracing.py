"""OpenTelemetry spans of a request's way through the router (README, "Tracing").

Off unless the standard ``OTEL_*`` variables ask for traces (``router_worker.contract.
tracing``, shared with the control plane). Off, nothing of OpenTelemetry is imported (it is
the ``tracing`` extra) and a request pays one test of :data:`TRACER`. On, the SDK exports in
batches off the event loop, configured by the other ``OTEL_*`` variables as it reads them
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER``, ...).

Each request routed is one span, ``switchyard.request`` (server kind; the child of the
client's ``traceparent`` when it sends one), and the engine receives that span's context as
its ``traceparent``, so vLLM's own spans hang under it. Its stages are child spans, made
when the request closes from the stamps its :class:`~router_worker.stages.StageClock`
already takes (two more are taken, when tracing, as the request is admitted and as flow
control lets it through): ``admission`` (the client key, the declared size, the wait for a
concurrency slot), ``intake`` (body read, parse, render, tokenize, hash), ``flow_control``
(the tenant's wait at flow control, :mod:`router_worker.flow_gate`), ``decide`` (the canary
arm and the policy), ``upstream`` (connection, send, the engine's time to its response head
and first event), ``relay`` (that event written to the client), and one ``continuation``
per attempt that continued a broken answer on another instance (from its routing to its
end, naming the instance). The request span carries the arm, policy, instance, the
decision's reason, attempts, status, tokens and TTFT.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from router_worker.contract import tracing as otel
from router_worker.stages import StageClock

# Stages as spans: (name, start stamp, end stamp) of a StageClock
SPANS = (
    ("admission", "started", "admitted"),
    ("intake", "admitted", "intake"),
    ("flow_control", "intake", "released"),
    ("decide", "released", "decided"),
    ("upstream", "decided", "event"),
    ("relay", "event", "relayed"),
)


class RequestTracer:
    """Spans for requests, from a tracer of the OpenTelemetry API."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import propagate, trace

        self.tracer = tracer
        self.trace = trace
        self.propagator = propagate.get_global_textmap()
        # perf_counter seconds (the stage stamps) to the epoch nanoseconds spans take
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def ns(self, perf_counter: float) -> int:
        return int(perf_counter * 1e9) + self.offset_ns

    def start(self, headers: Mapping[str, str], started: float) -> Any:
        """The request's span, begun at ``started`` (perf_counter)."""
        parent = self.propagator.extract(dict(headers))
        return self.tracer.start_span(
            "switchyard.request",
            context=parent,
            kind=self.trace.SpanKind.SERVER,
            start_time=self.ns(started),
        )

    def traceparent(self, span: Any) -> str | None:
        """What the engine is sent: the request span's W3C trace context."""
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self.trace.set_span_in_context(span))
        return carrier.get("traceparent")

    def finish(
        self,
        span: Any,
        clock: StageClock | None,
        attributes: Mapping[str, Any],
        error: bool,
        continuations: Sequence[tuple[str, float, float]] = (),
    ) -> None:
        """The stages' spans from ``clock``'s stamps (those reached), a span for each of
        ``continuations`` (instance, start and end in epoch seconds), then the request's;
        nothing for a request the sampler left out."""
        if not span.is_recording():
            return
        context = self.trace.set_span_in_context(span)
        if clock is not None:
            self._stages(context, clock)
        for instance, start, end in continuations:
            child = self.tracer.start_span(
                "continuation",
                context=context,
                start_time=int(start * 1e9),
                attributes={"switchyard.instance": instance},
            )
            child.end(end_time=int(max(start, end) * 1e9))
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error:
            span.set_status(self.trace.Status(self.trace.StatusCode.ERROR))
        span.end()

    def _stages(self, context: Any, clock: StageClock) -> None:
        for name, begin, end in SPANS:
            start_s, end_s = getattr(clock, begin) or clock.started, getattr(clock, end)
            if start_s and end_s:
                child = self.tracer.start_span(name, context=context, start_time=self.ns(start_s))
                child.end(end_time=self.ns(max(end_s, start_s)))


TRACER: RequestTracer | None = None


def setup(env: Mapping[str, str] = os.environ) -> RequestTracer | None:
    """Start exporting when the variables ask for it (``contract.tracing.wanted``); the
    process's :data:`TRACER`, or None."""
    global TRACER
    provider = otel.provider(env)
    if provider is not None:
        TRACER = RequestTracer(provider.get_tracer("switchyard.router"))
    return TRACER


def shutdown() -> None:
    """Flush what is batched (at the process's exit)."""
    if TRACER is not None:
        otel.shutdown()
