"""An operator's grey-failure override: published to the routers in a new config version
(the document the router validates), audited, and refused with the field named."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent, ConfigVersion
from router_worker.contract.config import RouterConfig

from .endpoints import REASON
from .helpers import session_client


def _newest_document(cluster_id: int) -> dict:
    version = ConfigVersion.objects.filter(cluster_id=cluster_id).order_by("-number").first()
    assert version is not None
    return version.document


@pytest.mark.django_db
def test_override_reaches_the_routers_config_and_the_audit(world, users) -> None:
    client = session_client(users["operator"])
    path = f"/api/v1/instances/{world['i0']}/grey-override"
    response = client.post(path, {"mode": "drained", **REASON}, content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["grey_override"] == "drained"
    document = RouterConfig.model_validate(_newest_document(world["alpha"]))
    overridden = {i.name: i.grey_override for i in document.instances}
    assert overridden[response.json()["name"]] == "drained"
    entry = AuditEvent.objects.filter(action="instance.grey_override").get()
    assert entry.before is not None and entry.after is not None
    assert (entry.before["grey_override"], entry.after["grey_override"]) == ("auto", "drained")
    back = client.post(path, {"mode": "auto", **REASON}, content_type="application/json")
    assert back.status_code == 200
    again = {i["name"]: i for i in _newest_document(world["alpha"])["instances"]}
    assert "grey_override" not in again[response.json()["name"]]  # auto: as before


@pytest.mark.django_db
def test_bad_or_unchanged_override_is_refused(world, users) -> None:
    client = session_client(users["operator"])
    path = f"/api/v1/instances/{world['i0']}/grey-override"
    bad = client.post(path, {"mode": "maybe", **REASON}, content_type="application/json")
    assert bad.status_code == 422 and "mode" in bad.content.decode()
    same = client.post(path, {"mode": "auto", **REASON}, content_type="application/json")
    assert same.status_code == 409 and "already has grey override auto" in same.content.decode()
