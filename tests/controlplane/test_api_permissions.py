"""Permission matrix: every endpoint × {anonymous, viewer, operator, admin}."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from .endpoints import ENDPOINTS, ROUTER_AGENT, WRITES, call
from .helpers import ROLES, make_user, session_client, token_client

pytestmark = pytest.mark.django_db
CALLERS = (None, *ROLES)


def expected_status(endpoint, caller: str | None) -> int:
    if caller is None:
        return 401
    if ROLES.index(caller) < ROLES.index(endpoint.min_role):
        return 403
    return endpoint.success


@pytest.mark.parametrize("caller", CALLERS, ids=lambda c: c or "anonymous")
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.id)
def test_session_permission_matrix(world, as_role, replay_dispatches, endpoint, caller) -> None:
    response = call(as_role(caller), endpoint, world.ids)
    assert response.status_code == expected_status(endpoint, caller), response.content
    if response.status_code in (401, 403):
        assert response.json()["error"]["message"]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("endpoint", [WRITES[0], WRITES[2], ENDPOINTS[1]], ids=lambda e: e.id)
def test_api_tokens_carry_their_users_role(world, users, replay_dispatches, endpoint, role) -> None:
    response = call(token_client(users[role]), endpoint, world.ids)
    assert response.status_code == expected_status(endpoint, role), response.content


def test_user_without_role_is_refused_everything(world) -> None:
    nobody = session_client(make_user(None, "nobody"))
    for endpoint in ENDPOINTS:
        response = call(nobody, endpoint, world.ids)
        assert response.status_code == 403, endpoint.id


def test_superuser_counts_as_admin(world, replay_dispatches) -> None:
    root = get_superuser()
    response = call(session_client(root), WRITES[0], world.ids)
    assert response.status_code == 201


def get_superuser():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_superuser("root", password=None)


@pytest.mark.parametrize("header", ["Bearer sy_deadbeef_wrong", "Bearer ", "Basic abc"])
def test_bad_api_token_is_401(world, header: str) -> None:
    response = Client(headers={"Authorization": header}).get("/api/v1/clusters")
    assert response.status_code == 401
    assert "authentication required" in response.json()["error"]["message"]


def test_revoked_token_is_401(world, users) -> None:
    client = token_client(users["admin"])
    users["admin"].api_tokens.update(revoked=True)
    assert client.get("/api/v1/clusters").status_code == 401


def test_session_writes_need_the_csrf_token(world, users) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["admin"])
    body = {"name": "csrf", "model": "qwen2-7b", "gpu_type": "h20", "reason": "r"}
    refused = client.post("/api/v1/clusters", body, content_type="application/json")
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["error"]["message"]
    client.get("/admin/login/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    accepted = client.post(
        "/api/v1/clusters", body, content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert accepted.status_code == 201, accepted.content


@pytest.mark.parametrize("caller", CALLERS, ids=lambda c: c or "anonymous")
@pytest.mark.parametrize("endpoint", ROUTER_AGENT, ids=lambda e: e.id)
def test_router_endpoints_refuse_every_user(world, as_role, endpoint, caller) -> None:
    assert call(as_role(caller), endpoint, world.ids).status_code == 401


@pytest.mark.parametrize("endpoint", ROUTER_AGENT, ids=lambda e: e.id)
def test_router_endpoints_accept_only_their_own_routers_token(world, endpoint) -> None:
    from controlplane.services.router_deployments import create_router_deployment

    from .helpers import SYSTEM

    other_token, _ = create_router_deployment(
        SYSTEM, world["beta"], name="other", host="127.0.0.1", port=8300
    )
    own = Client(headers={"Authorization": f"Bearer {world.router_token}"})
    other = Client(headers={"Authorization": f"Bearer {other_token}"})
    assert call(own, endpoint, world.ids).status_code == 200
    assert call(other, endpoint, world.ids).status_code == 401


def test_docs_and_schema_are_served(client) -> None:
    assert client.get("/api/v1/openapi.json").status_code == 200
    assert client.get("/api/v1/docs").status_code == 200
    redirect = client.get("/api/docs")
    assert redirect.status_code == 302 and redirect.url == "/api/v1/docs"


def shape(path: str) -> str:
    """/api/v1/clusters/{alpha}/config-versions/1?x=y -> /api/v1/clusters/{}/config-versions/{}"""
    return re.sub(r"/(\{[^}]+\}|\d+)(?=/|$)", "/{}", path.split("?")[0])


def test_the_matrix_covers_every_operation_in_the_schema() -> None:
    from controlplane.api.api import api

    operations = {
        (method.upper(), shape(path))
        for path, methods in api.get_openapi_schema()["paths"].items()
        for method in methods
    }
    tabled = {(e.method, shape(e.path)) for e in ENDPOINTS + ROUTER_AGENT}
    assert operations == tabled
