"""The REST API gives what the pages give: a replay's recommendation, cells and canaries
as its page shows them, a canary started from a replay, the live view's merged state and its
per-tenant lanes, and the cluster's sampled routing decisions as a stream a client pages
through with a cursor (real Postgres and Redis)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.models import ReplayJob
from controlplane.selectors.replays import recommendation
from router_worker.contract.telemetry import TenantLane, decisions_stream
from tests.web.test_decision_stream import decision, write_decision

from .helpers import finished_job, instance, snapshot, write_state

pytestmark = pytest.mark.django_db

WINNING = {"lm": [[5.0, 5.1, 4.9], [6.0, 6.1, 5.9]], "rr": [[5.0, 5.05, 4.95], [8.0, 8.1, 7.9]]}


def test_a_replay_gives_its_recommendation_cells_and_canaries(as_role, cluster):
    job = finished_job(cluster, WINNING)
    rr, lm = cluster.policies.get(name="rr"), cluster.policies.get(name="lm")
    viewer = as_role("viewer")
    body = viewer.get(f"/api/v1/replays/{job.pk}").json()
    verdict = body["recommendation"]
    assert verdict == recommendation(job)  # the page's own reading
    assert verdict["why"] == "wins"
    assert (verdict["active"], verdict["candidate"]) == (lm.pk, rr.pk)
    assert [round(load["diff"], 6) for load in verdict["loads"]] == [0.0, 2.0]
    assert len(body["cells"]) == 2 * 2 * 3  # policies × loads × seeds
    assert {cell["kind"] for cell in body["cells"]} == {"lmetric", "round_robin"}
    assert {cell["state"] for cell in body["cells"]} == {"succeeded"}
    assert body["canaries"] == []
    listed = viewer.get("/api/v1/replays", {"cluster": cluster.pk}).json()
    assert [row["recommendation"]["candidate"] for row in listed] == [rr.pk]

    instances = list(cluster.instances.order_by("name").values_list("name", flat=True))
    created = as_role("operator").post(
        f"/api/v1/clusters/{cluster.pk}/canaries",
        {
            "name": "from-api",
            "baseline_policy_id": verdict["active"],
            "candidate_policy_id": verdict["candidate"],
            "baseline_instances": instances[:1],
            "candidate_instances": instances[1:],
            "source_replay_id": job.pk,
            "reason": "the replay says so",
        },
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["source_replay_id"] == job.pk
    again = viewer.get(f"/api/v1/replays/{job.pk}").json()
    assert again["canaries"] == [created.json()["id"]]
    page = viewer.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()
    assert "from-api" in page  # the page lists the same canary


def test_a_replay_without_results_or_without_the_active_policy_recommends_nothing(as_role, cluster):
    queued = ReplayJob.objects.create(cluster=cluster, inputs={})
    assert as_role("viewer").get(f"/api/v1/replays/{queued.pk}").json()["recommendation"] is None
    noisy = finished_job(cluster, {"lm": [[5.0, 4.0, 6.0], [6.0, 5.0, 7.0]],
                                   "rr": [[5.5, 4.5, 6.5], [6.5, 5.5, 7.5]]})  # fmt: skip
    verdict = as_role("viewer").get(f"/api/v1/replays/{noisy.pk}").json()["recommendation"]
    assert (verdict["candidate"], verdict["why"]) == (None, "no winner")


def test_a_canary_cannot_claim_another_clusters_replay_through_the_api(as_role, cluster):
    from tests.web.helpers import make_cluster

    other = ReplayJob.objects.create(cluster=make_cluster(name="elsewhere"), inputs={})
    lm, rr = cluster.policies.get(name="lm"), cluster.policies.get(name="rr")
    response = as_role("operator").post(
        f"/api/v1/clusters/{cluster.pk}/canaries",
        {
            "name": "stolen",
            "baseline_policy_id": lm.pk,
            "candidate_policy_id": rr.pk,
            "baseline_instances": ["i0"],
            "candidate_instances": ["i1", "i2"],
            "source_replay_id": other.pk,
            "reason": "r",
        },
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "source_replay_id"


def test_the_decision_stream_pages_with_a_cursor(as_role, cluster, redis_client):
    viewer = as_role("viewer")
    url = f"/api/v1/clusters/{cluster.pk}/decisions"
    try:
        assert viewer.get(url).json() == {"decisions": [], "cursor": None}
        for n in range(5):
            write_decision(redis_client, decision(cluster.name, f"old-{n}"))
        first = viewer.get(url, {"limit": 3}).json()
        assert [d["request_id"] for d in first["decisions"]] == ["old-4", "old-3", "old-2"]
        assert first["cursor"] == first["decisions"][0]["id"]
        assert first["decisions"][0]["candidates"][0]["instance"] == "i1"
        redis_client.xadd(decisions_stream(cluster.name), {"data": "{not json"})
        for n in range(4):
            write_decision(redis_client, decision(cluster.name, f"new-{n}", reason="retry"))
        # the oldest first taken, so a poller at its limit misses none; each page newest first
        page = viewer.get(url, {"after": first["cursor"], "limit": 3}).json()
        assert [d["request_id"] for d in page["decisions"]] == ["new-1", "new-0"]
        rest = viewer.get(url, {"after": page["cursor"], "limit": 3}).json()
        assert [d["request_id"] for d in rest["decisions"]] == ["new-3", "new-2"]
        idle = viewer.get(url, {"after": rest["cursor"]}).json()
        assert idle == {"decisions": [], "cursor": rest["cursor"]}
    finally:
        redis_client.delete(decisions_stream(cluster.name))


@pytest.mark.parametrize(("query", "field"), [({"after": "abc"}, "after"), ({"limit": 0}, "limit")])
def test_a_bad_cursor_or_limit_is_refused_naming_it(as_role, cluster, query, field):
    response = as_role("viewer").get(f"/api/v1/clusters/{cluster.pk}/decisions", query)
    assert response.status_code in (400, 422)
    assert field in response.content.decode()


def test_the_decisions_of_a_missing_cluster_are_a_404(as_role):
    assert as_role("viewer").get("/api/v1/clusters/999999/decisions").status_code == 404
    assert as_role(None).get("/api/v1/clusters/999999/decisions").status_code == 401


def test_the_live_state_is_the_live_views(as_role, cluster, redis_client):
    url = f"/api/v1/clusters/{cluster.pk}/live"
    assert as_role("viewer").get(url).json()["instances"] == []  # no router reports yet
    write_state(redis_client, snapshot(cluster.name, "r1", [instance("i0", pending=321)]))
    write_state(redis_client, snapshot(cluster.name, "r2", [instance("i0", pending=100)]))
    try:
        body = as_role("viewer").get(url).json()
        page = as_role("viewer").get(reverse("web:snapshot", args=[cluster.pk])).json()
    finally:
        for router in ("r1", "r2"):
            redis_client.delete(f"switchyard:state:{cluster.name}:{router}")
    (merged,) = body["instances"]
    assert merged["pending_prefill_tokens"] == 421  # router-local accounting sums
    assert sorted(r["router"] for r in body["routers"]) == ["r1", "r2"]
    assert body["instances"] == page["live"]["instances"]


def test_the_live_state_carries_the_per_tenant_figures(as_role, cluster, redis_client):
    """Each tenant's lane (admitted, queued, refused, share of tokens served against its
    weight's share, TTFT) merged over the routers, as the live view's Tenants table has it."""
    lanes = [
        {"a": TenantLane(priority="standard", weight=1.0, requests=4, admitted=5, queued=1,
                         refused=2, served_tokens=300.0)},
        {"a": TenantLane(priority="standard", weight=1.0, requests=6, admitted=6, queued=0,
                         refused=1, served_tokens=500.0),
         "b": TenantLane(priority="critical", weight=3.0, requests=2, admitted=2, queued=0,
                         refused=0, served_tokens=200.0)},
    ]  # fmt: skip
    for name, tenants in zip(("r1", "r2"), lanes, strict=True):
        write_state(redis_client, snapshot(cluster.name, name, [instance("i0")], tenants=tenants))
    url = f"/api/v1/clusters/{cluster.pk}/live"
    try:
        body = as_role("viewer").get(url).json()
        page = as_role("viewer").get(reverse("web:snapshot", args=[cluster.pk])).json()
    finally:
        for router in ("r1", "r2"):
            redis_client.delete(f"switchyard:state:{cluster.name}:{router}")
    a, b = body["tenants"]["a"], body["tenants"]["b"]
    assert (a["requests"], a["admitted"], a["queued"], a["refused"]) == (10, 11, 1, 3)
    assert a["share"] == pytest.approx(0.8) and b["share"] == pytest.approx(0.2)
    assert a["weight_share"] == pytest.approx(0.25) and b["priority"] == "critical"
    assert body["tenants"] == page["live"]["tenants"]
