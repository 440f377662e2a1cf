"""Credentials in the UI: a cluster's client API keys (admins create, revoke and require
them) and each user's API tokens (create, revoke; an admin sees everyone's). A new secret is
shown once, in the answer to its creation, and is never stored or shown again."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import Cluster
from controlplane.selectors import access as access_selectors
from controlplane.services import client_keys as key_service
from controlplane.services import numbers
from controlplane.services import tokens as token_service
from controlplane.services.errors import ServiceError

from .access import actor, admin_required, signed_in_user, viewer_required
from .clusters import get_cluster
from .pages import page, service_error_response

KEYS_TEMPLATE = "web/client_keys.html"
TOKENS_TEMPLATE = "web/tokens.html"


def _keys_context(cluster: Cluster) -> dict[str, Any]:
    keys = list(access_selectors.client_keys(cluster.pk))
    return {
        "cluster": cluster,
        "tab": "keys",
        "keys": keys,
        "active_keys": sum(1 for key in keys if key.revoked_at is None),
    }


@viewer_required
@require_GET
def client_keys_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    return page(request, KEYS_TEMPLATE, **_keys_context(get_cluster(cluster_id)))


@admin_required
@require_POST
def client_key_create(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        secret, key = key_service.create_client_key(
            actor(request),
            cluster.pk,
            name=request.POST.get("name", ""),
            debug=request.POST.get("debug") == "on",
            reason=request.POST.get("reason", ""),
        )
    except ServiceError as error:
        return service_error_response(
            request, error, KEYS_TEMPLATE, **_keys_context(cluster), form=request.POST
        )
    return _showing_secret_once(
        page(
            request,
            KEYS_TEMPLATE,
            status=201,
            new_secret=secret,
            new_key=key,
            **_keys_context(cluster),
        )
    )


@admin_required
@require_POST
def client_key_revoke(request: HttpRequest, cluster_id: int, key_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        key_service.revoke_client_key(
            actor(request), cluster.pk, key_id, reason=request.POST.get("reason", "")
        )
    except ServiceError as error:
        return service_error_response(request, error, KEYS_TEMPLATE, **_keys_context(cluster))
    return redirect(reverse("web:client_keys", args=[cluster.pk]))


@admin_required
@require_POST
def client_auth_set(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        key_service.set_client_keys_required(
            actor(request),
            cluster.pk,
            request.POST.get("required") == "on",
            reason=request.POST.get("reason", ""),
        )
    except ServiceError as error:
        return service_error_response(request, error, KEYS_TEMPLATE, **_keys_context(cluster))
    return redirect(reverse("web:client_keys", args=[cluster.pk]))


def _tokens_context(request: HttpRequest) -> dict[str, Any]:
    return {
        "tab": "tokens",
        "tokens": token_service.visible_tokens(signed_in_user(request)),
        "now": timezone.now(),
        "default_days": token_service.DEFAULT_VALID_DAYS,
        "max_days": token_service.MAX_VALID_DAYS,
    }


@viewer_required
@require_GET
def tokens_page(request: HttpRequest) -> HttpResponse:
    return page(request, TOKENS_TEMPLATE, **_tokens_context(request))


@viewer_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    try:
        days = _days(request.POST.get("valid_days", ""))
        secret, token = token_service.create_api_token(
            actor(request), signed_in_user(request), request.POST.get("name", ""), days
        )
    except ServiceError as error:
        return service_error_response(
            request, error, TOKENS_TEMPLATE, **_tokens_context(request), form=request.POST
        )
    return _showing_secret_once(
        page(
            request,
            TOKENS_TEMPLATE,
            status=201,
            new_secret=secret,
            new_token=token,
            **_tokens_context(request),
        )
    )


def _showing_secret_once(response: HttpResponse) -> HttpResponse:
    """The page with a new secret is rendered, not redirected to (the secret must not pass
    through the session or a URL), and no cache may keep it."""
    response["Cache-Control"] = "no-store"
    return response


@viewer_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token_service.revoke_api_token(actor(request), token_id)
    except ServiceError as error:
        return service_error_response(request, error, TOKENS_TEMPLATE, **_tokens_context(request))
    return redirect(reverse("web:tokens"))


def _days(value: str) -> int:
    """Blank: the default validity."""
    if not value.strip():
        return token_service.DEFAULT_VALID_DAYS
    return numbers.whole_number(value, "valid_days")
