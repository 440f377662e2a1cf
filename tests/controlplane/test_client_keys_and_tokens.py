"""Client API keys (hashed, published to routers with the config, revocable, audited) and
API tokens (expiry, revocation through the API by their owner or an admin)."""

from __future__ import annotations

import datetime
import hashlib
import json

import pytest
from django.test import Client
from django.utils import timezone

from controlplane.models import ApiToken, AuditEvent, ClientKey, Cluster
from controlplane.services import tokens
from router_worker.contract.config import parse_config

from .helpers import SYSTEM, make_user, session_client

pytestmark = pytest.mark.django_db


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _document(cluster_id: int) -> dict:
    return Cluster.objects.get(pk=cluster_id).versions.latest("number").document


def test_a_client_key_is_shown_once_stored_hashed_and_published_as_a_hash(world, users):
    admin = session_client(users["admin"])
    created = admin.post(
        f"/api/v1/clusters/{world['alpha']}/client-keys",
        {"name": "batch-jobs", "debug": True},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    secret = created.json()["secret"]
    assert secret.startswith("syk_") and len(secret) > 40
    key = ClientKey.objects.get(pk=created.json()["key"]["id"])
    stored = json.dumps([getattr(key, f.attname) for f in ClientKey._meta.fields], default=str)
    assert secret not in stored and key.key_hash == _sha(secret)
    document = _document(world["alpha"])
    assert {"sha256": _sha(secret), "rights": ["debug"]} in document["client_auth"]["keys"]
    assert document["client_auth"]["required"] is False
    assert secret not in json.dumps(document)
    parse_config(document)  # what the routers will accept
    listed = admin.get(f"/api/v1/clusters/{world['alpha']}/client-keys").content.decode()
    assert secret not in listed and key.key_hash not in listed and "batch-jobs" in listed
    audit = AuditEvent.objects.get(action="client_key.create", target_id=str(key.pk))
    assert audit.after is not None
    assert secret not in json.dumps(audit.after) and audit.after["config_version"]


def test_revoking_a_key_publishes_a_version_without_it(world, users):
    admin = session_client(users["admin"])
    path = f"/api/v1/clusters/{world['alpha']}/client-keys"
    secret = admin.post(path, {"name": "to-revoke"}, content_type="application/json").json()[
        "secret"
    ]
    key = ClientKey.objects.get(key_hash=_sha(secret))
    before = _document(world["alpha"])["version"]
    revoked = admin.post(
        f"{path}/{key.pk}/revoke", {"reason": "leaked in a log"}, content_type="application/json"
    )
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    document = _document(world["alpha"])
    assert document["version"] == before + 1
    assert _sha(secret) not in json.dumps(document)
    again = admin.post(f"{path}/{key.pk}/revoke", {}, content_type="application/json")
    assert again.status_code == 409
    # The name is free again once the old key is revoked.
    assert (
        admin.post(path, {"name": "to-revoke"}, content_type="application/json").status_code == 201
    )


def test_requiring_keys_is_published_audited_and_needs_a_reason(world, users):
    admin = session_client(users["admin"])
    path = f"/api/v1/clusters/{world['alpha']}/client-auth"
    refused = admin.put(path, {"required": True, "reason": " "}, content_type="application/json")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "reason"
    switched = admin.put(
        path, {"required": True, "reason": "public endpoint"}, content_type="application/json"
    )
    assert switched.status_code == 200 and switched.json()["required"] is True
    assert _document(world["alpha"])["client_auth"]["required"] is True
    operator = session_client(users["operator"])
    assert (
        operator.put(
            path, {"required": False, "reason": "x"}, content_type="application/json"
        ).status_code
        == 403
    )


def test_duplicate_active_key_names_are_refused_clearly(world, users):
    admin = session_client(users["admin"])
    path = f"/api/v1/clusters/{world['alpha']}/client-keys"
    assert admin.post(path, {"name": "dup"}, content_type="application/json").status_code == 201
    second = admin.post(path, {"name": "dup"}, content_type="application/json")
    assert second.status_code == 409 and second.json()["error"]["field"] == "name"


def _bearer(secret: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {secret}"})


def test_api_tokens_expire(world, users):
    secret, token = tokens.create_api_token(SYSTEM, users["operator"], "short", valid_days=1)
    assert token.expires_at - timezone.now() <= datetime.timedelta(days=1)
    assert _bearer(secret).get("/api/v1/me").status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(
        expires_at=timezone.now() - datetime.timedelta(seconds=1)
    )
    assert _bearer(secret).get("/api/v1/me").status_code == 401
    with pytest.raises(tokens.ServiceError):
        tokens.create_api_token(SYSTEM, users["operator"], "forever", valid_days=10_000)


def _days_valid(token_id: int) -> datetime.timedelta:
    token = ApiToken.objects.get(pk=token_id)
    return token.expires_at - token.created_at


def test_tokens_last_90_days_by_default_and_at_most_365(world, users):
    """The README: a token expires 90 days by default, at most 365 (API, service, UI)."""
    viewer = session_client(users["viewer"])
    day = datetime.timedelta(days=1)
    created = viewer.post("/api/v1/tokens", {"name": "default"}, content_type="application/json")
    assert created.status_code == 201, created.content
    assert abs(_days_valid(created.json()["token"]["id"]) - 90 * day) < datetime.timedelta(
        seconds=5
    )
    longest = viewer.post(
        "/api/v1/tokens", {"name": "year", "valid_days": 365}, content_type="application/json"
    )
    assert longest.status_code == 201, longest.content
    assert abs(_days_valid(longest.json()["token"]["id"]) - 365 * day) < datetime.timedelta(
        seconds=5
    )
    too_long = viewer.post(
        "/api/v1/tokens", {"name": "longer", "valid_days": 366}, content_type="application/json"
    )
    assert too_long.status_code in (400, 422), too_long.content
    _, token = tokens.create_api_token(SYSTEM, users["operator"], "service default")
    assert abs((token.expires_at - token.created_at) - 90 * day) < datetime.timedelta(seconds=5)
    tokens.create_api_token(SYSTEM, users["operator"], "a year", valid_days=365)
    with pytest.raises(tokens.ServiceError, match="1-365"):
        tokens.create_api_token(SYSTEM, users["operator"], "longer", valid_days=366)
    assert ApiToken.objects.filter(name__in=["longer"]).count() == 0


def test_tokens_are_created_listed_and_revoked_through_the_api(world, users):
    viewer = session_client(users["viewer"])
    created = viewer.post(
        "/api/v1/tokens", {"name": "laptop", "valid_days": 7}, content_type="application/json"
    )
    assert created.status_code == 201, created.content
    secret, token_id = created.json()["secret"], created.json()["token"]["id"]
    assert _bearer(secret).get("/api/v1/me").json()["role"] == "viewer"
    listed = viewer.get("/api/v1/tokens").json()
    assert [t["id"] for t in listed] == [token_id] and secret not in json.dumps(listed)
    # Someone else's token: neither listed nor revocable, unless one is an admin.
    operator = session_client(users["operator"])
    assert token_id not in [t["id"] for t in operator.get("/api/v1/tokens").json()]
    revoke = f"/api/v1/tokens/{token_id}/revoke"
    assert operator.post(revoke, {}, content_type="application/json").status_code == 403
    revoked = _bearer(secret).post(revoke, {}, content_type="application/json")
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert _bearer(secret).get("/api/v1/me").status_code == 401
    assert (
        AuditEvent.objects.filter(action="api_token.revoke", target_id=str(token_id)).count() == 1
    )


def test_an_admin_sees_and_revokes_anyones_token(world, users):
    owner = make_user("operator", "ci-owner")
    secret, token = tokens.create_api_token(SYSTEM, owner, "ci")
    admin = session_client(users["admin"])
    assert token.pk in [t["id"] for t in admin.get("/api/v1/tokens").json()]
    assert (
        admin.post(
            f"/api/v1/tokens/{token.pk}/revoke",
            {"reason": "left the team"},
            content_type="application/json",
        ).status_code
        == 200
    )
    assert _bearer(secret).get("/api/v1/me").status_code == 401
