"""How the router and the control plane read the standard ``OTEL_*`` variables: both trace
only when these ask for it, and export the same way (README, "Tracing").

Traces are wanted when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``),
or, without it, when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and ``OTEL_SDK_DISABLED`` is not ``true``.
OpenTelemetry (the ``tracing`` extra) is imported only then; the SDK reads the rest of the
variables itself (service name, resource attributes, OTLP headers, batching, sampler).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

EXPORTERS = "OTEL_TRACES_EXPORTER"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _names(env.get(EXPORTERS, ""))
    if exporters:
        return exporters != {"none"}
    return any(env.get(name) for name in ENDPOINTS)


def provider(env: Mapping[str, str] = os.environ) -> Any:
    """The process's tracer provider, exporting in batches as the variables say, set as
    OpenTelemetry's global one; None when traces are not wanted. ImportError without the
    ``tracing`` extra, ValueError for an exporter it does not know."""
    if not wanted(env):
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    made = TracerProvider()
    for exporter in _exporters(_names(env.get(EXPORTERS, "")) or {"otlp"}):
        made.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(made)
    return made


def shutdown() -> None:
    """Flush what is batched and stop the exporters (at the process's exit)."""
    from opentelemetry import trace

    current = trace.get_tracer_provider()
    if hasattr(current, "shutdown"):
        current.shutdown()


def _names(value: str) -> set[str]:
    return {name.strip() for name in value.split(",") if name.strip()}


def _exporters(names: set[str]) -> list[Any]:
    found: list[Any] = []
    for name in sorted(names - {"none"}):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            found.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            found.append(ConsoleSpanExporter())
        else:
            raise ValueError(f"{EXPORTERS}: unknown exporter {name!r} (otlp, console, none)")
    return found
