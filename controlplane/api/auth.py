"""Who is calling: a browser session (CSRF-checked for unsafe methods), an API token
(`Authorization: Bearer sy_...`), or a router with its own token (`Bearer syr_...`).

`role(minimum)` is the auth of an endpoint: it authenticates (else 401) and then requires
the minimum role (else 403). Roles are checked on every call, never cached in the token."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja.errors import AuthorizationError, HttpError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from controlplane.models import RouterDeployment
from controlplane.services.audit import Actor
from controlplane.services.roles import has_role, role_of
from controlplane.services.router_deployments import router_for_token
from controlplane.services.tokens import user_for_api_token

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def _authorised(user: User, minimum: str) -> User:
    if not has_role(user, minimum):
        held = role_of(user)
        raise AuthorizationError(
            message=f"this needs the {minimum} role; {user.get_username()} has {held or 'no role'}"
        )
    return user


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer sy_<prefix>_<secret>`, for scripts."""

    def __init__(self, minimum_role: str) -> None:
        super().__init__()
        self.minimum_role = minimum_role

    def authenticate(self, request: HttpRequest, token: str) -> User | None:
        user = user_for_api_token(token)
        return _authorised(user, self.minimum_role) if user is not None else None


class SessionRoleAuth(APIKeyCookie):
    """The browser's Django session; unsafe methods also need the CSRF token."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, minimum_role: str) -> None:
        super().__init__(csrf=False)  # checked below, only once a session is present
        self.minimum_role = minimum_role

    def authenticate(self, request: HttpRequest, key: str | None) -> User | None:
        user = request.user
        if not user.is_authenticated:
            return None
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise HttpError(
                403,
                "CSRF check failed: send the csrftoken cookie's value in the X-CSRFToken header",
            )
        return _authorised(user, self.minimum_role)


class RouterTokenAuth(HttpBearer):
    """`Authorization: Bearer syr_<secret>`: only the token of the router in the path."""

    def authenticate(self, request: HttpRequest, token: str) -> RouterDeployment | None:
        match = request.resolver_match
        if match is None:
            return None
        try:
            router_id = int(match.kwargs["router_id"])
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return router_for_token(router_id, token)


def role(minimum: str) -> list[Any]:
    return [ApiTokenAuth(minimum), SessionRoleAuth(minimum)]


def auth_user(request: HttpRequest) -> User:
    """The user an endpoint's ``role(...)`` auth let through."""
    user = request.auth  # type: ignore[attr-defined]  # set by django-ninja; not in the stubs
    assert isinstance(user, User), "only behind role(...)"
    return user


def auth_router(request: HttpRequest) -> RouterDeployment:
    """The router a ``RouterTokenAuth`` endpoint let through."""
    router = request.auth  # type: ignore[attr-defined]  # set by django-ninja; not in the stubs
    assert isinstance(router, RouterDeployment), "only behind RouterTokenAuth"
    return router


def actor_of(request: HttpRequest) -> Actor:
    request_id = request.headers.get("X-Request-ID", "")[:64] or uuid.uuid4().hex
    return Actor.of(auth_user(request), request_id=request_id)
