"""Every error is JSON: {"error": {"message": ..., "field": ...}} with a fitting status."""

from __future__ import annotations

import logging
from typing import Any

from django.db.utils import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from controlplane.services.errors import ServiceError

log = logging.getLogger(__name__)

# Where ninja says a bad value came from; the body's own parameter name is dropped from paths.
SOURCES = ("body", "query", "path", "header", "cookie", "form", "file")


def error_body(message: str, field: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "field": field, **extra}}


def field_path(loc: list[Any] | tuple[Any, ...]) -> str:
    parts = [str(part) for part in loc]
    if parts and parts[0] == "body" and len(parts) > 2:
        parts = parts[2:]  # ("body", "payload", "name") -> "name"
    elif parts and parts[0] in SOURCES and len(parts) > 1:
        parts = parts[1:]
    return ".".join(parts)


def install_error_handlers(api: NinjaAPI) -> None:
    def respond(request: HttpRequest, status: int, body: dict[str, Any]) -> HttpResponse:
        return api.create_response(request, body, status=status)

    @api.exception_handler(ServiceError)
    def service_error(request: HttpRequest, exc: ServiceError) -> HttpResponse:
        return respond(request, exc.status, error_body(exc.message, exc.field, **exc.details))

    @api.exception_handler(ValidationError)
    def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        problems = [
            {"field": field_path(e.get("loc", ())), "message": e.get("msg", "invalid")}
            for e in exc.errors
        ]
        first = problems[0] if problems else {"field": None, "message": "invalid request"}
        message = "; ".join(f"{p['field']}: {p['message']}" for p in problems) or "invalid"
        return respond(request, 422, error_body(message, first["field"], problems=problems))

    @api.exception_handler(AuthenticationError)
    def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return respond(
            request,
            401,
            error_body("authentication required: log in, or send 'Authorization: Bearer <token>'"),
        )

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        return respond(request, exc.status_code, error_body(str(exc)))

    @api.exception_handler(Http404)
    def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return respond(request, 404, error_body(str(exc) or "not found"))

    @api.exception_handler(OperationalError)
    @api.exception_handler(InterfaceError)
    def database_down(request: HttpRequest, exc: Exception) -> HttpResponse:
        log.warning("database unavailable during %s %s: %s", request.method, request.path, exc)
        return respond(
            request,
            503,
            error_body(
                "database unavailable; retry shortly (routers keep serving their last config)"
            ),
        )

    @api.exception_handler(DataError)
    def unstorable_value(request: HttpRequest, exc: DataError) -> HttpResponse:
        first_line = (str(exc).strip().splitlines() or ["invalid value"])[0]
        log.warning(
            "database refused a value in %s %s: %s", request.method, request.path, first_line
        )
        return respond(request, 400, error_body(f"the database refused a value: {first_line}"))
