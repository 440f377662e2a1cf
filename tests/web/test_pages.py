"""Pages render for every role; controls only for operators; every POST refuses viewers."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.models import AuditEvent, CanarySplit, Cluster, HotspotEvent, Policy, ReplayJob
from controlplane.services import policies

from .helpers import SYSTEM, instance, snapshot, write_state

pytestmark = pytest.mark.django_db


def page_urls(cluster) -> list[str]:
    return [
        reverse("web:clusters"),
        reverse("web:cluster", args=[cluster.pk]),
        reverse("web:policy", args=[cluster.pk]),
        reverse("web:canary", args=[cluster.pk]),
        reverse("web:replays", args=[cluster.pk]),
        reverse("web:hotspots"),
        reverse("web:audit"),
        reverse("web:quarantine"),
    ]


def test_anonymous_is_sent_to_the_login_page(as_role, cluster) -> None:
    for url in page_urls(cluster):
        response = as_role(None).get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")
    assert as_role(None).get("/login/").status_code == 200


def test_a_user_without_a_role_is_refused(cluster, django_user_model) -> None:
    from django.test import Client

    client = Client()
    client.force_login(django_user_model.objects.create_user("nobody", password="x-123456789"))
    assert client.get(reverse("web:cluster", args=[cluster.pk])).status_code == 403


def test_viewer_sees_every_page_without_controls(as_role, cluster) -> None:
    client = as_role("viewer")
    for url in page_urls(cluster):
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert 'method="post" action="/clusters' not in body, url
        assert "policy-controls" not in body and "canary-controls" not in body


def test_operator_sees_the_controls(as_role, cluster) -> None:
    client = as_role("operator")
    assert b"policy-controls" in client.get(reverse("web:policy", args=[cluster.pk])).content
    assert b"canary-controls" in client.get(reverse("web:canary", args=[cluster.pk])).content
    assert b"replay-controls" in client.get(reverse("web:replays", args=[cluster.pk])).content


def forged_posts(cluster) -> list[tuple[str, dict]]:
    rr = cluster.policies.get(name="rr")
    canary = CanarySplit.objects.create(
        cluster=cluster,
        name="c",
        baseline_policy=rr,
        candidate_policy=cluster.active_policy,
        baseline_instances=["i0"],
        candidate_instances=["i1"],
        weight_steps=[10],
    )
    return [
        (
            reverse("web:policy_apply", args=[cluster.pk]),
            {"policy": rr.pk, "reason": "forged", "confirm": "yes"},
        ),
        (
            reverse("web:canary_create", args=[cluster.pk]),
            {"name": "x", "baseline_policy": rr.pk, "candidate_policy": rr.pk, "reason": "r"},
        ),
        (reverse("web:canary_action", args=[cluster.pk, canary.pk, "start"]), {"reason": "r"}),
        (reverse("web:replay_create", args=[cluster.pk]), {"policies": rr.pk, "reason": "r"}),
    ]


def test_forged_posts_from_a_viewer_are_refused(as_role, cluster) -> None:
    client = as_role("viewer")
    audit_rows = AuditEvent.objects.count()
    for url, data in forged_posts(cluster):
        assert client.post(url, data).status_code == 403, url
    cluster.refresh_from_db()
    assert cluster.active_policy.name == "lm"
    assert AuditEvent.objects.count() == audit_rows
    assert not ReplayJob.objects.exists()


def test_operator_switches_to_an_existing_policy(as_role, cluster) -> None:
    rr = cluster.policies.get(name="rr")
    response = as_role("operator").post(
        reverse("web:policy_apply", args=[cluster.pk]),
        {"policy": rr.pk, "reason": "try rr", "confirm": "yes"},
    )
    assert response.status_code == 302
    assert "applied=rr" in response["Location"] and "version=2" in response["Location"]
    cluster.refresh_from_db()
    assert cluster.active_policy == rr
    audit = AuditEvent.objects.filter(action="policy.activate").latest("at")
    assert audit.after is not None
    assert (audit.actor_name, audit.reason, audit.after["config_version"]) == (
        "web-operator",
        "try rr",
        2,
    )
    # the page it returns to offers the policy now active, not the first in the list
    page = as_role("operator").get(response["Location"]).content.decode()
    assert f'<option value="{rr.pk}" selected>' in page
    assert page.count(" selected>") == 2  # the policy choice and the new policy's kind


def test_the_policy_choice_starts_on_the_active_policy(as_role, cluster) -> None:
    lm = cluster.policies.get(name="lm")  # active; "rr" sorts after it, a new one before
    policies.create_policy(SYSTEM, cluster.pk, name="aaa-first", kind="round_robin")
    page = as_role("operator").get(reverse("web:policy", args=[cluster.pk])).content.decode()
    choice = page[page.index('id="policy-choice"') :]
    choice = choice[: choice.index("</select>")]
    assert f'<option value="{lm.pk}" selected>' in choice and choice.count("selected") == 1


def test_small_things_a_newcomer_meets(as_role, cluster, client) -> None:
    """The favicon is served; audit rows fold their JSON; the live view says when its
    times are a slowed simulation's."""
    favicon = client.get("/favicon.ico")
    assert favicon.status_code == 301 and favicon["Location"].endswith("favicon.svg")
    body = as_role("viewer").get(reverse("web:audit")).content.decode()
    assert '<details class="json"><summary><code>{' in body
    live = as_role("viewer").get(reverse("web:cluster", args=[cluster.pk])).content.decode()
    assert 'data-testid="time-scale-note"' not in live  # real engines: times are real
    Cluster.objects.filter(pk=cluster.pk).update(engine_time_scale=2.0)
    live = as_role("viewer").get(reverse("web:cluster", args=[cluster.pk])).content.decode()
    assert "on a simulation running 2× slower than real H20s" in live


def test_operator_creates_a_policy_from_the_generated_form(as_role, cluster) -> None:
    response = as_role("operator").post(
        reverse("web:policy_apply", args=[cluster.pk]),
        {
            "policy": "new",
            "name": "lm-short",
            "kind": "lmetric",
            "reason": "shorter window",
            "confirm": "yes",
            "param.hotspot.window_s": "12.5",
            "param.hotspot.enabled": "on",
            "param.hotspot.min_class_blocks": "4",
        },
    )
    assert response.status_code == 302
    policy = Policy.objects.get(cluster=cluster, name="lm-short")
    assert policy.params["hotspot"]["window_s"] == 12.5
    assert policy.params["hotspot"]["min_class_blocks"] == 4
    cluster.refresh_from_db()
    assert cluster.active_policy == policy


@pytest.mark.parametrize(
    "data, message",
    [
        ({"reason": "", "confirm": "yes"}, "reason is required"),
        ({"reason": "why", "confirm": ""}, "confirm"),
        (
            {
                "reason": "why",
                "confirm": "yes",
                "policy": "new",
                "name": "bad",
                "kind": "lmetric",
                "param.hotspot.window_s": "-1",
            },
            "window_s",
        ),
    ],
)
def test_refused_changes_show_the_reason_and_change_nothing(
    as_role, cluster, data, message
) -> None:
    rr = cluster.policies.get(name="rr")
    response = as_role("operator").post(
        reverse("web:policy_apply", args=[cluster.pk]), {"policy": rr.pk, **data}
    )
    assert response.status_code == 400
    assert message in response.content.decode()
    cluster.refresh_from_db()
    assert cluster.active_policy.name == "lm"
    assert not Policy.objects.filter(name="bad").exists()


def test_snapshot_json_merges_live_state(as_role, cluster, redis_client) -> None:
    write_state(redis_client, snapshot(cluster.name, "r1", [instance("i0", pending=321)]))
    try:
        body = as_role("viewer").get(reverse("web:snapshot", args=[cluster.pk])).json()
    finally:
        redis_client.delete(f"switchyard:state:{cluster.name}:r1")
    assert body["live"]["instances"][0]["pending_prefill_tokens"] == 321
    assert body["live"]["routers"][0]["router"] == "r1"
    assert [a["label"] for a in body["annotations"]] == ["config v1"]


def test_canary_lifecycle_through_the_pages(as_role, cluster) -> None:
    client = as_role("operator")
    rr, lm = cluster.policies.get(name="rr"), cluster.policies.get(name="lm")
    response = client.post(
        reverse("web:canary_create", args=[cluster.pk]),
        {
            "name": "try-rr",
            "baseline_policy": lm.pk,
            "candidate_policy": rr.pk,
            "arm.i0": "baseline",
            "arm.i1": "baseline",
            "arm.i2": "candidate",
            "weight_steps": "10, 50",
            "guard.min_samples": "20",
            "assignment_key": "session",
            "reason": "compare",
        },
    )
    assert response.status_code == 302
    canary = CanarySplit.objects.get(name="try-rr")
    assert (canary.baseline_instances, canary.candidate_instances) == (["i0", "i1"], ["i2"])
    assert canary.guardrails["min_samples"] == 20
    for action, state in (("start", "progressing"), ("pause", "paused"), ("abort", "aborted")):
        url = reverse("web:canary_action", args=[cluster.pk, canary.pk, action])
        assert client.post(url, {"reason": action}).status_code == 302
        canary.refresh_from_db()
        assert canary.state == state
    comparison = client.get(reverse("web:canary_comparison", args=[cluster.pk, canary.pk]))
    assert b"baseline" in comparison.content


def test_hotspot_log_filters_and_links_to_the_cluster_then(as_role, cluster) -> None:
    from django.utils import timezone

    for n, transition in enumerate(("suspected", "confirmed")):
        HotspotEvent.objects.create(
            event_id=f"e{n}",
            cluster=cluster,
            at=timezone.now(),
            transition=transition,
            prefix_class="c9",
            prefix_hash="ff",
            x=5,
            x_bar=1,
            m=1,
            m_bar=2,
            window=30,
            instances=["i0"],
        )
    body = (
        as_role("viewer").get(reverse("web:hotspots"), {"transition": "confirmed"}).content.decode()
    )
    assert 'data-transition="confirmed"' in body and 'data-transition="suspected"' not in body
    assert f"/clusters/{cluster.pk}/?at=" in body


def test_audit_log_shows_who_what_and_why(as_role, cluster) -> None:
    body = (
        as_role("viewer").get(reverse("web:audit"), {"action": "policy.activate"}).content.decode()
    )
    assert 'data-action="policy.activate"' in body and "system:web-tests" in body
    assert 'data-action="cluster.create"' not in body


def test_canary_page_reads_judgements_of_any_age_and_only_on_its_cluster(as_role, cluster) -> None:
    from controlplane.models import CanaryJudgement

    from .helpers import make_cluster

    lm, rr = cluster.policies.get(name="lm"), cluster.policies.get(name="rr")
    canary = CanarySplit.objects.create(
        cluster=cluster,
        name="c",
        baseline_policy=lm,
        candidate_policy=rr,
        baseline_instances=["i0"],
        candidate_instances=["i1"],
        weight_steps=[10],
        guardrails={"step_seconds": 60},
        state="rolled_back",
    )
    # Evidence as the judge wrote it before guards carried limits, and none at all.
    CanaryJudgement.objects.create(
        canary=canary,
        step_index=0,
        verdict="fail",
        action="rollback",
        evidence={
            "verdict": "fail",
            "reasons": ["error rate 0.100 > 0.02"],
            "guards": {"candidate_error_rate": 0.1},
            "tests": [
                {
                    "metric": "ttft",
                    "median_baseline": 0.05,
                    "median_candidate": 0.06,
                    "effect": 0.2,
                    "p_value": 0.01,
                    "outcome": "fail",
                }
            ],
        },
    )
    CanaryJudgement.objects.create(canary=canary, step_index=0, verdict="halt", action="wait")
    client = as_role("viewer")
    url = reverse("web:canary_detail", args=[cluster.pk, canary.pk])
    body = client.get(url).content.decode()
    assert 'data-verdict="fail"' in body and 'data-verdict="halt"' in body
    assert "50.0 ms → 60.0 ms" in body and "+20.0%" in body
    assert (
        'data-guard="candidate_error_rate" data-passed="unknown">candidate_error_rate 10.0%<'
        in body
    )
    partial = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert partial.startswith('<div id="canary-timeline" data-state="rolled_back"')
    assert "hx-trigger" not in partial  # ended: the page stops refreshing
    other = make_cluster()
    assert client.get(reverse("web:canary_detail", args=[other.pk, canary.pk])).status_code == 404
    assert client.get(reverse("web:canary_detail", args=[cluster.pk, 999999])).status_code == 404


def test_a_cluster_stored_with_an_unknown_gpu_and_model_keeps_its_pages(as_role, cluster):
    """Names are checked when a cluster is created; one stored before keeps its names and
    every page, and a replay of it says what enginesim does not know."""
    Cluster.objects.filter(pk=cluster.pk).update(model="mystery-7b", gpu_type="tpu-v5")
    client = as_role("operator")
    for url in page_urls(cluster):
        response = client.get(url)
        assert response.status_code == 200, url
    body = client.get(reverse("web:replays", args=[cluster.pk])).content.decode()
    assert "mystery-7b · tpu-v5" in body
    from controlplane.tasks.replay import ReplayFailed, simulator_gpu

    with pytest.raises(ReplayFailed, match="enginesim knows no GPU 'tpu-v5' \\(known: a100"):
        simulator_gpu(Cluster.objects.get(pk=cluster.pk))


def test_the_replay_pages_live_row_is_in_the_engines_time(cluster) -> None:
    """A replay's numbers are in the engines' time; the live row beside them too."""
    from controlplane.web.replays import engine_time

    window = {"seconds": 30.0, "requests": 9, "ttft_p50_s": 4.0, "output_tokens_per_s": 100.0}
    assert engine_time(window, cluster) == window  # real engines
    cluster.engine_time_scale = 2.0
    assert engine_time(window, cluster) == {
        "seconds": 30.0,  # the wall window it covers
        "requests": 9,
        "ttft_p50_s": 2.0,
        "output_tokens_per_s": 200.0,
    }


def test_operator_sets_session_sources_from_the_policy_page(as_role, cluster) -> None:
    """The form posts the checked sources and a reason to the same service as
    ``PUT /api/v1/clusters/{id}/session-sources``: stored in the order they are read,
    published to the routers, audited under the operator's name."""
    operator = as_role("operator")
    url = reverse("web:policy", args=[cluster.pk])
    page = operator.get(url).content.decode()
    form = page[page.index('data-testid="session-sources-form"') :]
    form = form[: form.index("</form>")]
    names = [s for s in ("header", "harness", "response_chain", "user") if f'value="{s}"' in form]
    assert names == ["header", "harness", "response_chain", "user"]
    assert form.count(" checked") == 4 and 'name="reason" required' in form

    response = operator.post(
        reverse("web:session_sources", args=[cluster.pk]),
        {"sources": ["user", "header"], "reason": "harness ids collide"},
    )
    assert response.status_code == 302 and response["Location"].startswith(url)
    cluster.refresh_from_db()
    assert cluster.session_sources == ["header", "user"]
    version = cluster.versions.order_by("-number").first()
    assert version is not None and version.document["session_sources"] == ["header", "user"]
    assert (version.created_by, version.reason) == ("web-operator", "harness ids collide")
    event = AuditEvent.objects.filter(action="cluster.session_sources").latest("pk")
    assert event.actor_name == "web-operator"
    assert event.after is not None and event.after["session_sources"] == ["header", "user"]
    shown = operator.get(response["Location"]).content.decode()
    assert 'data-testid="sources-set"' in shown
    assert 'value="harness" data-testid' in shown  # unchecked now


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        ({"sources": ["header", "cookie"], "reason": "r"}, 400, "session_sources must be distinct"),
        ({"sources": ["header", "header"], "reason": "r"}, 400, "session_sources must be distinct"),
        ({"sources": ["header"], "reason": " "}, 400, "reason"),
    ],
    ids=["unknown-source", "twice", "no-reason"],
)
def test_a_hostile_session_sources_post_is_refused_and_stores_nothing(
    as_role, cluster, data, status, message
) -> None:
    versions, audit_rows = cluster.versions.count(), AuditEvent.objects.count()
    response = as_role("operator").post(reverse("web:session_sources", args=[cluster.pk]), data)
    assert response.status_code == status
    body = response.content.decode()
    error = body[body.index('data-testid="sources-error"') :]
    assert message in error[: error.index("</div>")]
    assert f'value="{data["reason"]}"' in body  # the reason typed is kept
    cluster.refresh_from_db()
    assert cluster.session_sources == ["header", "harness", "response_chain", "user"]
    assert (cluster.versions.count(), AuditEvent.objects.count()) == (versions, audit_rows)


def test_a_viewer_cannot_post_session_sources(as_role, cluster) -> None:
    response = as_role("viewer").post(
        reverse("web:session_sources", args=[cluster.pk]), {"sources": [], "reason": "r"}
    )
    assert response.status_code == 403
    cluster.refresh_from_db()
    assert cluster.session_sources == ["header", "harness", "response_chain", "user"]
