"""Rendering helpers shared by the page views."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render

from controlplane.services.errors import ServiceError

from .access import role_context


def page(request: HttpRequest, template: str, status: int = 200, **context: Any) -> HttpResponse:
    return render(request, template, {**role_context(request), **context}, status=status)


def service_error_response(
    request: HttpRequest, error: ServiceError, template: str, **context: Any
) -> HttpResponse:
    """Re-render a form with the service's message (and field) at the service's status."""
    return page(
        request,
        template,
        status=error.status,
        error=error.message,
        error_field=error.field,
        **context,
    )


def field_errors(error: ServiceError) -> dict[str, str]:
    """The error's message per field: every problem of invalid policy parameters, else the
    one field the service named (nothing when it named none)."""
    problems = error.details.get("problems") or []
    if problems:
        return {p["field"]: p["message"] for p in problems if p.get("field")}
    return {error.field: error.message} if error.field else {}


def expected_revision(data: QueryDict) -> int | None:
    """The cluster revision a form was rendered at (its hidden `expected_revision`)."""
    value = data.get("expected_revision", "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ServiceError(
            "expected_revision: reload the page and submit again", "expected_revision"
        ) from None


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"
