"""Tenants in the control plane: created, changed and removed by operators through the API,
audited, published to the routers, hostile values refused field by field, and keys without
a tenant (or whose tenant was removed) in the default tenant."""

from __future__ import annotations

import hashlib

import pytest

from controlplane.models import AuditEvent, ClientKey, Cluster, Tenant
from router_worker.contract.config import parse_config

from .helpers import session_client

pytestmark = pytest.mark.django_db


def _document(cluster_id: int) -> dict:
    return Cluster.objects.get(pk=cluster_id).versions.latest("number").document


def _path(world, rest: str = "") -> str:
    return f"/api/v1/clusters/{world['beta']}/tenants{rest}"


def _post(client, path: str, body: dict):
    return client.post(path, body, content_type="application/json")


def test_an_operator_creates_a_tenant_published_to_the_routers_and_audited(world, as_role):
    operator = as_role("operator")
    created = _post(
        operator,
        _path(world),
        {"name": "batch", "priority": "sheddable", "weight": 0.5, "requests_per_minute": 600},
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["priority"] == "sheddable" and body["weight"] == 0.5
    assert body["tokens_per_minute"] is None and body["max_queued"] == 256
    document = _document(world["beta"])
    entry = next(t for t in document["tenants"] if t["name"] == "batch")
    assert entry["priority"] == "sheddable" and entry["requests_per_minute"] == 600
    assert parse_config(document).tenants[0].name == "batch"
    audit = AuditEvent.objects.get(action="tenant.create", target_id=str(body["id"]))
    assert audit.after is not None and audit.after["config_version"] == document["version"]
    listed = operator.get(_path(world)).json()
    assert [t["name"] for t in listed] == ["batch"]
    assert _post(operator, _path(world), {"name": "batch"}).status_code == 409


def test_a_viewer_cannot_create_change_or_remove_a_tenant(world, as_role):
    tenant = _post(as_role("operator"), _path(world), {"name": "team-a"}).json()
    viewer = as_role("viewer")
    assert _post(viewer, _path(world), {"name": "team-b"}).status_code == 403
    patch = viewer.patch(
        _path(world, f"/{tenant['id']}"), {"weight": 3}, content_type="application/json"
    )
    assert patch.status_code == 403
    assert viewer.delete(_path(world, f"/{tenant['id']}")).status_code == 403
    assert Tenant.objects.filter(pk=tenant["id"], weight=1.0).exists()


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"name": "x", "priority": "vip"}, {"priority"}),
        ({"name": "x", "weight": 0}, {"weight"}),
        ({"name": "x", "weight": -2, "requests_per_minute": 0}, {"weight", "requests_per_minute"}),
        ({"name": "x", "weight": 1e9}, {"weight"}),
        (
            {"name": "x", "tokens_per_minute": -5, "token_budget": 0},
            {"tokens_per_minute", "token_budget"},
        ),
        ({"name": "x", "budget_period": "month"}, {"budget_period"}),
        ({"name": "x", "max_queued": 10**9}, {"max_queued"}),
        ({"name": "../etc"}, {"name"}),
        ({"name": "x y"}, {"name"}),
    ],
)
def test_hostile_values_are_refused_naming_each_field(world, as_role, body, fields):
    before = _document(world["beta"])["version"]
    refused = _post(as_role("operator"), _path(world), body)
    assert refused.status_code == 400, refused.content
    problems = refused.json()["error"]["problems"]
    assert {p["field"] for p in problems} == fields
    assert not Tenant.objects.filter(cluster_id=world["beta"]).exists()
    assert _document(world["beta"])["version"] == before


def test_non_finite_and_mistyped_values_get_a_4xx(world, as_role):
    operator = as_role("operator")
    for weight in ("NaN", "Infinity", "heavy"):
        raw = '{"name": "x", "weight": %s}' % (f'"{weight}"' if weight == "heavy" else weight)
        answer = operator.post(_path(world), raw, content_type="application/json")
        assert 400 <= answer.status_code < 500, (weight, answer.content)
    assert not Tenant.objects.filter(cluster_id=world["beta"]).exists()


def test_a_change_is_checked_whole_and_a_limit_can_be_cleared(world, as_role):
    operator = as_role("operator")
    tenant = _post(operator, _path(world), {"name": "team-a", "tokens_per_minute": 5000}).json()
    path = _path(world, f"/{tenant['id']}")
    bad = operator.patch(path, {"weight": 0, "priority": "top"}, content_type="application/json")
    assert bad.status_code == 400
    assert {p["field"] for p in bad.json()["error"]["problems"]} == {"weight", "priority"}
    renamed = operator.patch(path, {"name": "other"}, content_type="application/json")
    assert renamed.status_code in (400, 422)
    changed = operator.patch(
        path,
        {"priority": "critical", "tokens_per_minute": None, "reason": "on call"},
        content_type="application/json",
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["priority"] == "critical" and changed.json()["tokens_per_minute"] is None
    entry = _document(world["beta"])["tenants"][0]
    assert entry["priority"] == "critical" and entry["tokens_per_minute"] is None
    audit = AuditEvent.objects.get(action="tenant.update", target_id=str(tenant["id"]))
    assert (
        audit.before is not None
        and audit.before["tokens_per_minute"] == 5000
        and audit.reason == "on call"
    )


def test_keys_belong_to_a_tenant_and_fall_back_to_default_when_it_is_removed(world, users):
    admin = session_client(users["admin"])
    secret = _post(admin, f"/api/v1/clusters/{world['beta']}/client-keys", {"name": "k1"}).json()[
        "secret"
    ]
    sha = hashlib.sha256(secret.encode()).hexdigest()
    key = ClientKey.objects.get(key_hash=sha)
    entry = next(k for k in _document(world["beta"])["client_auth"]["keys"] if k["sha256"] == sha)
    assert "tenant" not in entry  # the default tenant
    assert parse_config(_document(world["beta"])).client_auth.keys[0].tenant == "default"
    tenant = _post(admin, _path(world), {"name": "team-a", "priority": "critical"}).json()
    moved = admin.put(
        f"/api/v1/clusters/{world['beta']}/client-keys/{key.pk}/tenant",
        {"tenant_id": tenant["id"], "reason": "team a's key"},
        content_type="application/json",
    )
    assert moved.status_code == 200 and moved.json()["tenant"] == "team-a"
    entry = next(k for k in _document(world["beta"])["client_auth"]["keys"] if k["sha256"] == sha)
    assert entry["tenant"] == "team-a"
    assert admin.get(_path(world)).json()[0]["active_keys"] == 1
    removed = admin.delete(_path(world, f"/{tenant['id']}?reason=team%20left"))
    assert removed.status_code == 204
    document = _document(world["beta"])
    assert "tenants" not in document
    entry = next(k for k in document["client_auth"]["keys"] if k["sha256"] == sha)
    assert "tenant" not in entry and parse_config(document)
    key.refresh_from_db()
    assert key.tenant is None
    audit = AuditEvent.objects.get(action="tenant.delete", target_id=str(tenant["id"]))
    assert audit.before is not None and audit.after is not None
    assert audit.before["keys"] == ["k1"] and audit.after["config_version"] == document["version"]


def test_a_key_cannot_be_moved_to_another_clusters_tenant(world, users):
    admin = session_client(users["admin"])
    other = Cluster.objects.get(pk=world["alpha"])
    assert other is not None
    foreign = _post(admin, f"/api/v1/clusters/{other.pk}/tenants", {"name": "theirs"}).json()
    secret = _post(admin, f"/api/v1/clusters/{world['beta']}/client-keys", {"name": "k2"}).json()[
        "secret"
    ]
    key = ClientKey.objects.get(key_hash=hashlib.sha256(secret.encode()).hexdigest())
    answer = admin.put(
        f"/api/v1/clusters/{world['beta']}/client-keys/{key.pk}/tenant",
        {"tenant_id": foreign["id"]},
        content_type="application/json",
    )
    assert answer.status_code == 404 and answer.json()["error"]["field"] == "tenant_id"
