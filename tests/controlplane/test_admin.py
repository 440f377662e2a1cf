"""The Django admin lists every model but writes none of them: each is owned by a service
(validation, audit row, config publishing), which a raw admin save would skip. Users and
groups stay editable there."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from controlplane import models

pytestmark = pytest.mark.django_db
SERVICE_OWNED = [getattr(models, name) for name in models.__all__]


@pytest.fixture
def superuser_client(world) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    return client


def admin_url(model, suffix: str) -> str:
    return f"/admin/controlplane/{model._meta.model_name}/{suffix}"


def test_every_model_is_registered() -> None:
    assert set(SERVICE_OWNED) <= set(admin.site._registry)


@pytest.mark.parametrize("model", SERVICE_OWNED, ids=lambda m: m.__name__)
def test_changelist_renders_without_an_add_button(superuser_client, model) -> None:
    response = superuser_client.get(admin_url(model, ""))
    assert response.status_code == 200
    assert admin_url(model, "add/") not in response.content.decode()


def _cluster_form(cluster: models.Cluster, **changes: str) -> dict[str, str]:
    """What the admin's change form posts for a cluster (a valid form before this fix)."""
    return {
        "name": cluster.name,
        "model": cluster.model,
        "gpu_type": cluster.gpu_type,
        "block_size": str(cluster.block_size),
        "active_policy": str(cluster.active_policy_id or ""),
        **changes,
    }


def test_an_admin_post_cannot_change_a_cluster(superuser_client, world) -> None:
    cluster = models.Cluster.objects.get(pk=world["alpha"])
    audit_rows = models.AuditEvent.objects.count()
    response = superuser_client.post(
        admin_url(models.Cluster, f"{cluster.pk}/change/"),
        _cluster_form(cluster, block_size="64", gpu_type="a100"),
    )
    assert response.status_code == 403
    cluster.refresh_from_db()
    assert (cluster.block_size, cluster.gpu_type) == (16, "h20")
    assert models.AuditEvent.objects.count() == audit_rows


def test_an_admin_post_cannot_add_or_delete(superuser_client, world) -> None:
    cluster = models.Cluster.objects.get(pk=world["alpha"])
    added = superuser_client.post(
        admin_url(models.Cluster, "add/"), _cluster_form(cluster, name="sneaky")
    )
    deleted = superuser_client.post(
        admin_url(models.Cluster, f"{cluster.pk}/delete/"), {"post": "yes"}
    )
    bulk = superuser_client.post(
        admin_url(models.Instance, ""),
        {"action": "delete_selected", "post": "yes", "_selected_action": [str(world["i0"])]},
    )
    assert (added.status_code, deleted.status_code) == (403, 403)
    assert not models.Cluster.objects.filter(name="sneaky").exists()
    assert models.Cluster.objects.filter(pk=cluster.pk).exists()
    assert bulk.status_code in (200, 302)  # the changelist ignores an action it does not offer
    assert models.Instance.objects.filter(pk=world["i0"]).exists()


@pytest.mark.parametrize(
    "model",
    [
        models.Policy,
        models.CanarySplit,
        models.RouterDeployment,
        models.ConfigVersion,
        models.AuditEvent,
        models.ReplayJob,
    ],
    ids=lambda m: m.__name__,
)
def test_no_service_owned_change_form_accepts_a_post(superuser_client, world, model) -> None:
    row = model.objects.first() or pytest.fail(f"the world has no {model.__name__}")
    response = superuser_client.post(admin_url(model, f"{row.pk}/change/"), {"name": "x"})
    assert response.status_code == 403


def test_an_admin_drain_goes_through_the_service(superuser_client, world) -> None:
    versions = models.ConfigVersion.objects.filter(cluster_id=world["alpha"]).count()
    response = superuser_client.post(
        admin_url(models.Instance, ""), {"action": "drain", "_selected_action": [str(world["i0"])]}
    )
    assert response.status_code == 302
    assert models.Instance.objects.get(pk=world["i0"]).state == "draining"
    audit = models.AuditEvent.objects.filter(target_id=str(world["i0"])).latest("at")
    assert (audit.actor_name, audit.reason) == ("root", "from the Django admin")
    assert models.ConfigVersion.objects.filter(cluster_id=world["alpha"]).count() == versions + 1


def test_users_and_groups_stay_editable(superuser_client, world) -> None:
    response = superuser_client.post("/admin/auth/group/add/", {"name": "auditors"})
    assert response.status_code == 302
    assert Group.objects.filter(name="auditors").exists()


def _json(snapshot: Any) -> dict[str, Any]:
    """An audit row's before or after, which these changes all record."""
    assert isinstance(snapshot, dict), snapshot
    return snapshot


def _user_form(user, groups: list[Group], **flags: bool) -> dict:
    """What the admin's user change form posts."""
    form = {
        "username": user.username,
        "groups": [str(g.pk) for g in groups],
        "date_joined_0": "2024-01-01",
        "date_joined_1": "00:00:00",
    }
    return {**form, **{name: "on" for name, on in flags.items() if on}}


def test_role_grants_and_superuser_changes_in_the_admin_are_audited(superuser_client) -> None:
    viewer, operator = (Group.objects.get_or_create(name=n)[0] for n in ("viewer", "operator"))
    alice = get_user_model().objects.create_user("alice", password=None)
    alice.groups.add(viewer)
    url = f"/admin/auth/user/{alice.pk}/change/"
    grant = _user_form(alice, [operator], is_active=True, is_superuser=True)
    assert superuser_client.post(url, grant).status_code == 302
    event = models.AuditEvent.objects.get(target_type="user", target_id=str(alice.pk))
    assert (event.action, event.actor_name) == ("user.access", "root")
    before, after = _json(event.before), _json(event.after)
    assert (before["role"], before["groups"]) == ("viewer", ["viewer"])
    assert (after["role"], after["is_superuser"]) == ("admin", True)
    assert superuser_client.post(url, grant).status_code == 302  # no change, no row
    revoke = _user_form(alice, [operator], is_active=False)
    assert superuser_client.post(url, revoke).status_code == 302
    rows = models.AuditEvent.objects.filter(target_type="user", target_id=str(alice.pk))
    rows = rows.order_by("id")
    assert [(e.action, _json(e.after)["role"]) for e in rows] == [
        ("user.access", "admin"),
        ("user.access", None),
    ]


def test_renaming_a_role_group_in_the_admin_is_audited(superuser_client) -> None:
    group = Group.objects.get_or_create(name="operator")[0]
    response = superuser_client.post(f"/admin/auth/group/{group.pk}/change/", {"name": "ops"})
    assert response.status_code == 302
    event = models.AuditEvent.objects.get(target_type="group")
    assert (_json(event.before)["name"], _json(event.after)["name"]) == ("operator", "ops")
