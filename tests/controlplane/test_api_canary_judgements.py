"""GET /api/v1/canaries/{id}/judgements: every judgement of the judge, oldest first, with the
evidence it rested on (per-arm samples, medians, effect, p-value, guards)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import ArmMetricRollup, CanarySplit
from controlplane.services.judge import judge_canary

pytestmark = pytest.mark.django_db


def judge_step(canary_id: int, candidate_ttft: float, n: int) -> None:
    """A step that ran long enough, with n samples per arm, judged by the real judge."""
    canary = CanarySplit.objects.get(pk=canary_id)
    CanarySplit.objects.filter(pk=canary_id).update(
        step_started_at=timezone.now() - timedelta(minutes=2)
    )
    minute = (timezone.now() - timedelta(minutes=2)).replace(second=0, microsecond=0)
    for arm, ttft in (("baseline", 0.5), ("candidate", candidate_ttft)):
        ArmMetricRollup.objects.update_or_create(
            cluster_id=canary.cluster_id,
            arm=arm,
            minute=minute,
            defaults={
                "requests": n,
                "ttft_samples": [ttft + 0.001 * (k % 10) for k in range(n)],
                "tpot_samples": [0.02] * n,
            },
        )
    assert judge_canary(canary_id) is not None


def test_judgements_accumulate_oldest_first_with_their_evidence(world, as_role) -> None:
    running = world["running"]
    judge_step(running, candidate_ttft=0.5, n=30)  # too few samples: halt, wait
    judge_step(running, candidate_ttft=0.45, n=100)  # pass: advance to 50%
    response = as_role("viewer").get(f"/api/v1/canaries/{running}/judgements")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 2
    halted, advanced = body["items"]
    assert (halted["verdict"], halted["action"]) == ("halt", "wait")
    assert (advanced["verdict"], advanced["action"], advanced["step_index"]) == (
        "pass",
        "advance",
        0,
    )
    evidence = advanced["evidence"]
    assert evidence["candidate_weight"] == 10
    assert (
        evidence["arms"]["baseline"]["requests"] == evidence["arms"]["candidate"]["requests"] == 100
    )
    ttft = next(t for t in evidence["tests"] if t["metric"] == "ttft")
    assert ttft["median_baseline"] == pytest.approx(0.5045)
    assert ttft["median_candidate"] == pytest.approx(0.4545)
    assert ttft["effect"] == pytest.approx(0.4545 / 0.5045 - 1)
    assert 0 <= ttft["p_value"] <= 1 and ttft["outcome"] == "pass"
    assert [(g["name"], g["passed"]) for g in evidence["guards"]] == [
        ("min_samples", True),
        ("error_rate", True),
        ("hotspot_fallback_rate", True),
        ("ttft_p95_ratio", True),
    ]
    assert evidence["reasons"] == ["no regression beyond tolerance"]


def test_judgements_page_and_refuse_unknown_canaries(world, as_role) -> None:
    running = world["running"]
    for _ in range(3):
        judge_step(running, candidate_ttft=0.5, n=30)
    client = as_role("viewer")
    page = client.get(f"/api/v1/canaries/{running}/judgements?limit=2&offset=2").json()
    assert page["count"] == 3 and len(page["items"]) == 1
    missing = client.get("/api/v1/canaries/999999/judgements")
    assert missing.status_code == 404
    assert "canary 999999 does not exist" in missing.json()["error"]["message"]
    assert client.get(f"/api/v1/canaries/{world['draft']}/judgements").json() == {
        "items": [],
        "count": 0,
    }


def test_the_timeline_collapses_a_run_of_halts_into_one_row(world, as_role) -> None:
    """Three halts of step 1 while samples accumulate read as one row (count 3, its time
    span); the pass that follows is a row of its own; /judgements still lists all four."""
    running = world["running"]
    for _ in range(3):
        judge_step(running, candidate_ttft=0.5, n=30)
    judge_step(running, candidate_ttft=0.45, n=100)
    viewer = as_role("viewer")
    assert viewer.get(f"/api/v1/canaries/{running}/judgements").json()["count"] == 4
    response = viewer.get(f"/api/v1/canaries/{running}/timeline")
    assert response.status_code == 200, response.content
    halts, advanced = response.json()["items"]
    assert (halts["verdict"], halts["action"], halts["count"]) == ("halt", "wait", 3)
    assert halts["first_at"] < halts["last_at"] and halts["first_id"] < halts["last_id"]
    assert halts["evidence"]["patience"]["samples"] == {"baseline": 30, "candidate": 30}
    assert (advanced["action"], advanced["count"]) == ("advance", 1)


def test_canary_defaults_are_served_with_their_limits(world, as_role) -> None:
    body = as_role("viewer").get("/api/v1/canary-defaults").json()
    assert body["weight_steps"] == [10, 25, 50]
    assert body["guardrails"]["max_wait_seconds"]["default"] == 600
    assert body["guardrails"]["step_seconds"]["limit"] == 86_400
