"""Flow control's TPOT SLO per cluster: set from the API or the Tenants page, audited,
published to the routers (flow control on, tenants or not), refused field by field."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent, Cluster, ConfigVersion
from router_worker.contract.config import parse_config

from .endpoints import REASON
from .helpers import assert_refused, session_client

pytestmark = pytest.mark.django_db


def set_slo(client, cluster_id: int, value):
    return client.put(
        f"/api/v1/clusters/{cluster_id}/flow",
        {"tpot_slo_ms": value, **REASON},
        content_type="application/json",
    )


def newest(cluster_id: int) -> dict:
    return ConfigVersion.objects.filter(cluster_id=cluster_id).order_by("-number")[0].document


def test_a_tpot_slo_turns_the_leg_on_for_the_routers_and_clearing_it_off(world, users):
    client = session_client(users["operator"])
    beta = world["beta"]  # a cluster without tenants: flow control is off by default
    assert not parse_config(newest(beta)).flow.enabled
    response = set_slo(client, beta, 80)
    assert response.status_code == 200, response.content
    assert response.json()["tpot_slo_ms"] == 80
    row = AuditEvent.objects.order_by("-id")[0]
    assert row.action == "cluster.flow_tpot_slo" and row.before == {"flow_tpot_slo_ms": None}
    flow = parse_config(newest(beta)).flow
    assert flow.enabled and flow.tpot_slo_s == 0.08
    assert client.get(f"/api/v1/clusters/{beta}/flow").json()["tpot_slo_ms"] == 80
    cleared = set_slo(client, beta, None)
    assert cleared.status_code == 200 and cleared.json()["tpot_slo_ms"] is None
    flow = parse_config(newest(beta)).flow
    assert not flow.enabled and flow.tpot_slo_s is None


def test_hostile_or_unchanged_tpot_slos_are_refused(world, users):
    client = session_client(users["operator"])
    for hostile in (0, -1, 60_001, "100", True, 1.5, 10**30):
        assert set_slo(client, world["beta"], hostile).status_code == 422, hostile
    assert_refused(set_slo(client, world["beta"], None), 409, "tpot_slo_ms", "already off")
    assert set_slo(session_client(users["viewer"]), world["beta"], 50).status_code == 403
    assert Cluster.objects.get(pk=world["beta"]).flow_tpot_slo_ms is None


def test_an_operator_sets_the_tpot_slo_from_the_tenants_page(world, users):
    client = session_client(users["operator"])
    url = f"/clusters/{world['beta']}/flow/"
    page = client.get(f"/clusters/{world['beta']}/tenants/").content.decode()
    assert 'data-testid="flow-tpot-form"' in page
    assert '<strong data-field="tpot_slo_ms">off</strong>' in page
    assert client.post(url, {"tpot_slo_ms": "250", "reason": "TPOT first"}).status_code == 302
    page = client.get(f"/clusters/{world['beta']}/tenants/").content.decode()
    assert '<strong data-field="tpot_slo_ms">250 ms</strong>' in page
    for hostile in ("fast", "0", "1e3", "70000"):
        refused = client.post(url, {"tpot_slo_ms": hostile, "reason": "x"})
        text = refused.content.decode()
        assert refused.status_code == 400 and 'data-error="tpot_slo_ms"' in text, hostile
        assert f'value="{hostile}"' in text  # kept as typed
    assert client.post(url, {"tpot_slo_ms": "", "reason": "off again"}).status_code == 302
    assert Cluster.objects.get(pk=world["beta"]).flow_tpot_slo_ms is None
    viewer = session_client(users["viewer"]).get(f"/clusters/{world['beta']}/tenants/")
    assert 'data-testid="flow-tpot-form"' not in viewer.content.decode()
