"""Session sources per cluster: switched from the API, published to the routers as the
routing document's ``session_sources`` (which the router's contract reads), audited."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent, ConfigVersion
from router_worker.contract.config import parse_config

from .endpoints import REASON
from .helpers import session_client

pytestmark = pytest.mark.django_db


def _newest(cluster_id: int) -> ConfigVersion:
    version = ConfigVersion.objects.filter(cluster_id=cluster_id).order_by("-number").first()
    assert version is not None
    return version


def test_switching_a_source_off_reaches_the_routers_document(world, users) -> None:
    client = session_client(users["operator"])
    url = f"/api/v1/clusters/{world['alpha']}/session-sources"
    assert client.get(url).json()["sources"] == ["header", "harness", "response_chain", "user"]
    assert "session_sources" not in _newest(world["alpha"]).document  # the routers' default

    answer = client.put(
        url, {"sources": ["user", "header"], **REASON}, content_type="application/json"
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["sources"] == ["header", "user"]  # in the order they are read
    document = _newest(world["alpha"]).document
    assert document["session_sources"] == ["header", "user"]
    assert parse_config(document).session_sources == ["header", "user"]
    event = AuditEvent.objects.filter(action="cluster.session_sources").latest("pk")
    assert event.before == {"session_sources": ["header", "harness", "response_chain", "user"]}

    again = client.put(
        url, {"sources": ["header", "user"], **REASON}, content_type="application/json"
    )
    assert again.status_code == 409


@pytest.mark.parametrize("sources", [["cookie"], ["user", "user"], "user"])
def test_bad_sources_are_refused_naming_the_field(world, users, sources) -> None:
    client = session_client(users["operator"])
    answer = client.put(
        f"/api/v1/clusters/{world['alpha']}/session-sources",
        {"sources": sources, **REASON},
        content_type="application/json",
    )
    assert answer.status_code in (400, 422), answer.content
    assert "sources" in answer.content.decode()
