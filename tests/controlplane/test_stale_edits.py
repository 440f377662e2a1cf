"""Concurrent edits: an edit carries the cluster revision it was prepared against (API:
`expected_revision` or `If-Match`; forms: a hidden field); a stale one is refused with 409
and the current revision, and leaves no audit row and no config version."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent, ConfigVersion
from controlplane.services import canaries

from .helpers import SYSTEM, make_cluster, make_user, session_client, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def edit_world():
    cluster, parts = make_cluster("stale", ["i0", "i1", "i2", "i3"])
    cluster.refresh_from_db()
    return cluster, parts


@pytest.fixture
def operators():
    return token_client(make_user("operator", "op-a")), token_client(make_user("operator", "op-b"))


def revision_of(client, cluster) -> tuple[int, str]:
    response = client.get(f"/api/v1/clusters/{cluster.pk}")
    assert response.status_code == 200
    return response.json()["revision"], response["ETag"]


def drain(client, instance, **extra):
    return client.post(
        f"/api/v1/instances/{instance.pk}/drain",
        {"reason": "maintenance", **extra},
        content_type="application/json",
    )


def test_two_operators_drain_against_the_same_revision_one_wins(edit_world, operators):
    cluster, parts = edit_world
    alice, bob = operators
    revision, etag = revision_of(alice, cluster)
    assert etag == f'"r{revision}"'
    audits, versions = AuditEvent.objects.count(), ConfigVersion.objects.count()
    first = drain(alice, parts["instances"]["i0"], expected_revision=revision)
    second = drain(bob, parts["instances"]["i1"], expected_revision=revision)
    assert first.status_code == 200
    assert second.status_code == 409, second.content
    error = second.json()["error"]
    assert error["field"] == "expected_revision"
    assert error["current_revision"] == revision + 1
    assert "changed since" in error["message"]
    assert AuditEvent.objects.count() == audits + 1
    assert ConfigVersion.objects.count() == versions + 1
    retried = drain(bob, parts["instances"]["i1"], expected_revision=error["current_revision"])
    assert retried.status_code == 200


def test_if_match_guards_policy_activation(edit_world, operators):
    cluster, parts = edit_world
    alice, bob = operators
    _, etag = revision_of(alice, cluster)
    assert drain(alice, parts["instances"]["i0"]).status_code == 200  # no revision: applied
    stale = bob.post(
        f"/api/v1/clusters/{cluster.pk}/policies/{parts['rr'].pk}/activate",
        {"reason": "switch"},
        content_type="application/json",
        headers={"If-Match": etag},
    )
    assert stale.status_code == 409, stale.content
    assert stale.json()["error"]["current_revision"] == revision_of(bob, cluster)[0]
    bad = bob.post(
        f"/api/v1/clusters/{cluster.pk}/policies/{parts['rr'].pk}/activate",
        {"reason": "switch"},
        content_type="application/json",
        headers={"If-Match": "yesterday"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "If-Match"


def test_a_stale_canary_action_is_refused(edit_world, operators):
    cluster, parts = edit_world
    alice, bob = operators
    canary = canaries.create_canary(
        SYSTEM,
        cluster.pk,
        name="c1",
        baseline_policy_id=parts["lm"].pk,
        candidate_policy_id=parts["rr"].pk,
        baseline_instances=["i0", "i1"],
        candidate_instances=["i2", "i3"],
        weight_steps=[10, 50],
        reason="setup",
    )
    revision, _ = revision_of(alice, cluster)
    started = alice.post(
        f"/api/v1/canaries/{canary.pk}/start",
        {"reason": "go", "expected_revision": revision},
        content_type="application/json",
    )
    aborted = bob.post(
        f"/api/v1/canaries/{canary.pk}/abort",
        {"reason": "not now", "expected_revision": revision},
        content_type="application/json",
    )
    assert started.status_code == 200
    assert aborted.status_code == 409
    canary.refresh_from_db()
    assert canary.state == "progressing"


def test_a_stale_policy_form_shows_a_clear_error_with_the_current_revision(edit_world):
    cluster, parts = edit_world
    browser = session_client(make_user("operator", "op-form"))
    page = browser.get(f"/clusters/{cluster.pk}/policy/").content.decode()
    hidden = f'name="expected_revision" value="{cluster.revision}"'
    assert hidden in page
    drain(token_client(make_user("operator", "op-api")), parts["instances"]["i0"])
    response = browser.post(
        f"/clusters/{cluster.pk}/policy/apply/",
        {
            "policy": parts["rr"].pk,
            "reason": "switch",
            "confirm": "yes",
            "expected_revision": cluster.revision,
        },
    )
    assert response.status_code == 409
    body = response.content.decode()
    assert "changed since this edit was prepared" in body
    assert f'name="expected_revision" value="{cluster.revision + 1}"' in body
    cluster.refresh_from_db()
    assert cluster.active_policy_id == parts["lm"].pk


def test_a_stale_canary_form_action_shows_a_clear_error(edit_world):
    cluster, parts = edit_world
    canary = canaries.create_canary(
        SYSTEM,
        cluster.pk,
        name="c2",
        baseline_policy_id=parts["lm"].pk,
        candidate_policy_id=parts["rr"].pk,
        baseline_instances=["i0", "i1"],
        candidate_instances=["i2", "i3"],
        weight_steps=[10, 50],
        reason="setup",
    )
    browser = session_client(make_user("operator", "op-canary"))
    page = browser.get(f"/clusters/{cluster.pk}/canary/").content.decode()
    assert f'name="expected_revision" value="{cluster.revision}"' in page
    drain(token_client(make_user("operator", "op-api2")), parts["instances"]["i0"])
    response = browser.post(
        f"/clusters/{cluster.pk}/canary/{canary.pk}/start/",
        {"reason": "go", "expected_revision": cluster.revision},
    )
    assert response.status_code == 409
    assert f"it is now at revision {cluster.revision + 1}" in response.content.decode()
    canary.refresh_from_db()
    assert canary.state == "draft"
