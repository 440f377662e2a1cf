"""The Tenants page: operators create, change and remove tenants and move client keys from
the browser's forms; hostile values are refused next to their field; viewers only read."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent, ClientKey, Cluster, Tenant

pytestmark = pytest.mark.django_db


def _url(world, rest: str = "") -> str:
    return f"/clusters/{world['beta']}/tenants/{rest}"


def _document(world) -> dict:
    return Cluster.objects.get(pk=world["beta"]).versions.latest("number").document


def test_an_operator_creates_changes_and_removes_a_tenant_from_the_page(world, as_role):
    operator = as_role("operator")
    form = {"name": "team-a", "priority": "critical", "weight": "2", "requests_per_minute": ""}
    created = operator.post(_url(world, "create/"), {**form, "reason": "new team"})
    assert created.status_code == 302
    tenant = Tenant.objects.get(cluster_id=world["beta"], name="team-a")
    assert (tenant.priority, tenant.weight, tenant.requests_per_minute) == ("critical", 2.0, None)
    page = operator.get(_url(world)).content.decode()
    assert 'data-tenant="team-a"' in page and "Create a tenant" in page
    edit = {"priority": "sheddable", "weight": "1", "requests_per_minute": "90", "max_queued": "8"}
    assert operator.post(_url(world, f"{tenant.pk}/update/"), edit).status_code == 302
    tenant.refresh_from_db()
    assert (tenant.priority, tenant.requests_per_minute, tenant.max_queued) == ("sheddable", 90, 8)
    assert _document(world)["tenants"][0]["requests_per_minute"] == 90
    cleared = {**edit, "requests_per_minute": ""}
    assert operator.post(_url(world, f"{tenant.pk}/update/"), cleared).status_code == 302
    tenant.refresh_from_db()
    assert tenant.requests_per_minute is None
    assert operator.post(_url(world, f"{tenant.pk}/delete/"), {}).status_code == 302
    assert not Tenant.objects.filter(pk=tenant.pk).exists()
    actions = AuditEvent.objects.filter(target_type="tenant").values_list("action", flat=True)
    assert sorted(actions) == ["tenant.create", "tenant.delete", "tenant.update", "tenant.update"]


def test_hostile_values_are_refused_next_to_their_fields(world, as_role):
    operator = as_role("operator")
    form = {"name": "x", "priority": "vip", "weight": "NaN", "tokens_per_minute": "1e99"}
    refused = operator.post(_url(world, "create/"), form)
    assert refused.status_code == 400
    page = refused.content.decode()
    assert page.count('class="field-error"') == 3 and 'value="x"' in page
    assert not Tenant.objects.filter(cluster_id=world["beta"]).exists()


def test_a_key_is_moved_to_a_tenant_and_back_from_the_page(world, as_role):
    operator = as_role("operator")
    key = ClientKey.objects.create(
        cluster_id=world["beta"], name="k", prefix="k0000000", key_hash="1" * 64, created_by="t"
    )
    operator.post(_url(world, "create/"), {"name": "team-b"})
    tenant = Tenant.objects.get(cluster_id=world["beta"], name="team-b")
    moved = operator.post(
        f"/clusters/{world['beta']}/keys/{key.pk}/tenant/", {"tenant_id": tenant.pk}
    )
    assert moved.status_code == 302
    key.refresh_from_db()
    assert key.tenant == tenant
    entry = next(k for k in _document(world)["client_auth"]["keys"] if k["sha256"] == "1" * 64)
    assert entry["tenant"] == "team-b"
    bad = operator.post(f"/clusters/{world['beta']}/keys/{key.pk}/tenant/", {"tenant_id": "x"})
    assert bad.status_code == 400
    back = operator.post(f"/clusters/{world['beta']}/keys/{key.pk}/tenant/", {"tenant_id": ""})
    assert back.status_code == 302
    key.refresh_from_db()
    assert key.tenant is None


def test_a_viewer_reads_the_page_but_cannot_change_anything(world, as_role):
    viewer = as_role("viewer")
    page = viewer.get(_url(world))
    assert page.status_code == 200 and "Create a tenant" not in page.content.decode()
    assert viewer.post(_url(world, "create/"), {"name": "sneaky"}).status_code == 403
    assert not Tenant.objects.filter(name="sneaky").exists()
