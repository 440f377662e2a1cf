"""Instance roles (prefill/decode disaggregation): the pools' sizes are editable, audited,
published in the routers' config, and shown on the cluster page."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent, ConfigVersion, Instance
from router_worker.contract.config import parse_config

from .endpoints import REASON
from .helpers import assert_refused, session_client

pytestmark = pytest.mark.django_db


def set_role(client, instance_id: int, role: str):
    return client.post(
        f"/api/v1/instances/{instance_id}/role",
        {"role": role, **REASON},
        content_type="application/json",
    )


def newest_document(cluster_id: int) -> dict:
    return ConfigVersion.objects.filter(cluster_id=cluster_id).order_by("-number")[0].document


def test_a_role_change_is_audited_and_reaches_the_routers_config(world, users):
    client = session_client(users["operator"])
    response = set_role(client, world["i0"], "prefill")
    assert response.status_code == 200, response.content
    assert response.json()["role"] == "prefill"
    row = AuditEvent.objects.order_by("-id")[0]
    assert row.action == "instance.role" and row.reason == REASON["reason"]
    assert row.before is not None and row.after is not None
    assert row.before["role"] == "both" and row.after["role"] == "prefill"
    document = newest_document(world["alpha"])
    roles = {i["name"]: i.get("role", "both") for i in document["instances"]}
    assert roles["i0"] == "prefill" and roles["i1"] == "both"
    assert parse_config(document).disaggregated


def test_a_change_that_leaves_no_decode_pool_is_refused(world, users):
    client = session_client(users["admin"])
    alpha = Instance.objects.filter(cluster_id=world["alpha"]).exclude(pk=world["i0"])
    alpha.update(role="prefill")
    assert_refused(set_role(client, world["i0"], "prefill"), 400, "role", "no decode pool")
    assert Instance.objects.get(pk=world["i0"]).role == "both"


def test_an_unknown_role_is_refused_naming_the_field(world, users):
    response = set_role(session_client(users["operator"]), world["i0"], "middle")
    assert response.status_code == 422
    assert "role" in response.content.decode()


def test_the_cluster_page_shows_the_pools(world, users):
    client = session_client(users["viewer"])
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert 'data-testid="pools"' not in page  # every instance serves both halves
    assert 'data-testid="role-form"' not in page  # a viewer has no controls
    set_role(session_client(users["operator"]), world["i0"], "prefill")
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert 'data-testid="pools"' in page
    assert '<tr data-pool="prefill"><td>Prefill only</td><td class="num">1</td><td>i0</td>' in page


def test_an_operator_sets_a_role_from_the_cluster_page(world, users):
    client = session_client(users["operator"])
    url = f"/clusters/{world['alpha']}/role/"
    response = client.post(url, {"instance": "i0", "role": "decode", "reason": "more decode"})
    assert response.status_code == 302
    assert Instance.objects.get(pk=world["i0"]).role == "decode"
    assert AuditEvent.objects.order_by("-id")[0].action == "instance.role"
    refused = client.post(url, {"instance": "i0", "role": "decode", "reason": "again"})
    assert refused.status_code == 409
    assert "already decode" in refused.content.decode()
    unknown = client.post(url, {"instance": "nope", "role": "decode", "reason": "x"})
    assert unknown.status_code == 400 and "not in this cluster" in unknown.content.decode()
    viewer = session_client(users["viewer"]).post(url, {"instance": "i0", "role": "both"})
    assert viewer.status_code == 403
