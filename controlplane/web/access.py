"""Who may see and change what in the web UI. Pages need any role (viewer or above); every
POST view needs operator and answers 403 otherwise, whatever the page showed."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.views import redirect_to_login
from django.http import (
    HttpRequest,
    HttpResponseBadRequest,
    HttpResponseForbidden,
)
from django.http.response import HttpResponseBase

from controlplane.services.audit import Actor
from controlplane.services.roles import has_role, role_of

View = Callable[..., HttpResponseBase]


def _require(minimum: str, view: View) -> View:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not has_role(request.user, minimum):
            return HttpResponseForbidden(f"this needs the {minimum} role")
        if has_nul(request):
            return HttpResponseBadRequest("form and query values cannot contain NUL characters")
        return view(request, *args, **kwargs)

    return wrapped


def has_nul(request: HttpRequest) -> bool:
    """Whether a query or form value (or name) holds a NUL character, which no Postgres
    text can store or be compared with."""
    return any(
        "\x00" in key or any("\x00" in value for value in values)
        for data in (request.GET, request.POST)
        for key, values in data.lists()
    )


def viewer_required(view: View) -> View:
    return _require("viewer", view)


def operator_required(view: View) -> View:
    return _require("operator", view)


def admin_required(view: View) -> View:
    return _require("admin", view)


def can_operate(request: HttpRequest) -> bool:
    return has_role(request.user, "operator")


def signed_in_user(request: HttpRequest) -> User:
    """The user of a request the role decorators let through: always signed in."""
    assert isinstance(request.user, User), "only behind viewer_required and above"
    return request.user


def actor(request: HttpRequest) -> Actor:
    return Actor.of(request.user, request.headers.get("X-Request-ID", ""))


def role_context(request: HttpRequest) -> dict[str, Any]:
    """Template context processor-like helper: the user's role and whether to show controls."""
    return {
        "role": role_of(request.user),
        "can_operate": can_operate(request),
        "can_administer": has_role(request.user, "admin"),
    }
