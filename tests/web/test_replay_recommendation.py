"""A replay's recommendation: the active policy's row marked, another policy recommended
only when it wins on goodput by more than the noise, and one button to a canary form
pre-filled with baseline = active and candidate = recommended; the canary, the replay and
the audit trail link to each other."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.models import AuditEvent, CanarySplit, ReplayJob
from controlplane.selectors.replays import recommendation

from .helpers import finished_job

pytestmark = pytest.mark.django_db


def test_a_policy_that_wins_beyond_the_noise_is_recommended(cluster):
    # lm is active; rr wins at ×1.5 by far more than the seeds' spread, ties at ×1
    job = finished_job(cluster, {"lm": [[5.0, 5.1, 4.9], [6.0, 6.1, 5.9]],
                                 "rr": [[5.0, 5.05, 4.95], [8.0, 8.1, 7.9]]})  # fmt: skip
    verdict = recommendation(job)
    assert verdict is not None and verdict["why"] == "wins"
    assert verdict["candidate"] == cluster.policies.get(name="rr").pk
    assert [round(load["diff"], 6) for load in verdict["loads"]] == [0.0, 2.0]


def test_a_gain_within_the_noise_or_a_loss_elsewhere_keeps_the_active_policy(cluster):
    noisy = finished_job(cluster, {"lm": [[5.0, 4.0, 6.0], [6.0, 5.0, 7.0]],
                                   "rr": [[5.5, 4.5, 6.5], [6.5, 5.5, 7.5]]})  # fmt: skip
    assert recommendation(noisy) == {
        "active": cluster.active_policy_id, "candidate": None, "loads": [], "why": "no winner"
    }  # fmt: skip
    trade = finished_job(cluster, {"lm": [[5.0, 5.1, 4.9], [6.0, 6.1, 5.9]],
                                   "rr": [[4.0, 4.1, 3.9], [8.0, 8.1, 7.9]]})  # fmt: skip
    kept = recommendation(trade)
    assert kept is not None and kept["candidate"] is None


def test_the_recommendation_opens_a_prefilled_canary_that_links_back(as_role, cluster):
    job = finished_job(cluster, {"lm": [[5.0, 5.1, 4.9], [6.0, 6.1, 5.9]],
                                 "rr": [[5.0, 5.05, 4.95], [8.0, 8.1, 7.9]]})  # fmt: skip
    operator = as_role("operator")
    page = operator.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()
    assert 'data-testid="recommendation"' in page and 'data-testid="active-row"' in page
    rr, lm = cluster.policies.get(name="rr"), cluster.policies.get(name="lm")
    link = (
        reverse("web:canary", args=[cluster.pk])
        + f"?from_replay={job.pk}&baseline_policy={lm.pk}&candidate_policy={rr.pk}"
    )
    assert link in page
    form = operator.get(link).content.decode()
    assert 'data-testid="from-replay"' in form
    assert f'<option value="{rr.pk}" selected>' in form.split('name="candidate_policy"')[1]
    assert f'<input type="hidden" name="source_replay" value="{job.pk}">' in form

    instances = list(cluster.instances.order_by("name").values_list("name", flat=True))
    response = operator.post(
        reverse("web:canary_create", args=[cluster.pk]),
        {
            "name": "from-replay",
            "baseline_policy": str(lm.pk),
            "candidate_policy": str(rr.pk),
            "source_replay": str(job.pk),
            "weight_steps": "10, 50",
            "reason": "the replay says so",
            **{
                f"arm.{name}": "baseline" if k % 2 == 0 else "candidate"
                for k, name in enumerate(instances)
            },
        },
    )
    assert response.status_code == 302, response.content.decode()[:500]
    canary = CanarySplit.objects.get(name="from-replay")
    assert canary.source_replay_id == job.pk
    created = AuditEvent.objects.get(action="canary.create", target_id=str(canary.pk))
    assert created.after is not None and created.after["source_replay"] == job.pk
    page = operator.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()
    assert 'data-testid="replay-canary"' in page and "from-replay" in page
    detail = operator.get(reverse("web:canary_detail", args=[cluster.pk, canary.pk]))
    assert 'data-testid="canary-source"' in detail.content.decode()


def test_a_canary_cannot_claim_another_clusters_replay(as_role, cluster):
    from tests.web.helpers import make_cluster

    other = make_cluster(name="elsewhere")
    job = ReplayJob.objects.create(cluster=other, inputs={})
    response = as_role("operator").get(
        reverse("web:canary", args=[cluster.pk]) + f"?from_replay={job.pk}"
    )
    assert response.status_code == 404


@pytest.mark.parametrize(
    ("value", "message"),
    [("abc", "is not a replay"), ("99999999", "is not one of"), ("1" * 30, "is not a replay")],
)
def test_a_bad_source_replay_gets_a_clear_400(as_role, cluster, value, message):
    lm, rr = cluster.policies.get(name="lm"), cluster.policies.get(name="rr")
    instances = list(cluster.instances.order_by("name").values_list("name", flat=True))
    response = as_role("operator").post(
        reverse("web:canary_create", args=[cluster.pk]),
        {
            "name": "bad-source",
            "baseline_policy": str(lm.pk),
            "candidate_policy": str(rr.pk),
            "source_replay": value,
            "reason": "r",
            **{
                f"arm.{n}": "baseline" if k % 2 == 0 else "candidate"
                for k, n in enumerate(instances)
            },
        },
    )
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not CanarySplit.objects.filter(name="bad-source").exists()
