"""A canary's own page in chromium, under the enforced CSP: every judgement of the judge with
its evidence, appearing while the canary runs and still there after it ended."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import ArmMetricRollup, CanarySplit, Cluster
from controlplane.services import canaries
from controlplane.services.judge import judge_canary

from .helpers import SYSTEM, login, make_cluster

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


def started_canary(name: str) -> tuple[Cluster, CanarySplit]:
    """A canary of round robin against the active policy, 10% then 50%, started."""
    cluster = make_cluster()
    assert cluster.active_policy_id is not None
    canary = canaries.create_canary(
        SYSTEM,
        cluster.pk,
        name=name,
        baseline_policy_id=cluster.active_policy_id,
        candidate_policy_id=cluster.policies.get(name="rr").pk,
        baseline_instances=["i0", "i1"],
        candidate_instances=["i2"],
        weight_steps=[10, 50],
        reason="try rr",
    )
    canaries.transition(SYSTEM, canary.pk, "start", reason="go")
    return cluster, canary


def judge_step(canary_id: int, candidate_ttft: float, n: int) -> str:
    """A step that has run long enough with n samples per arm, judged by the real judge."""
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
    judgement = judge_canary(canary_id)
    assert judgement is not None
    return judgement.action


def test_canary_page_shows_every_judgement_during_and_after_the_canary(
    browser, asgi_server, artifacts_dir
) -> None:
    cluster, canary = started_canary("rr-trial")
    # Two halts while samples accumulate: one row, counted.
    assert judge_step(canary.pk, candidate_ttft=0.5, n=30) == "wait"
    assert judge_step(canary.pk, candidate_ttft=0.5, n=30) == "wait"

    page = login(browser, asgi_server.url, "viewer", bypass_csp=False)
    refused: list[str] = []
    page.on(
        "console",
        lambda message: (
            refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    try:
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/canary/")
        page.click("[data-testid=canary-link]")
        page.wait_for_url(f"**/clusters/{cluster.pk}/canary/{canary.pk}/")
        halted = page.locator("tr[data-verdict=halt]")
        assert halted.get_attribute("data-count") == "2"
        assert "× 2" in halted.locator("[data-field=time]").inner_text()
        assert halted.locator("[data-field=requests]").inner_text() == "30 / 30"
        # 30 of 50 samples per arm in 120 s: 20 more in about 80 s at that rate.
        expected = page.locator("[data-testid=verdict-expected]")
        assert expected.get_attribute("data-reachable") == "true"
        shown = re.search(r"Verdict expected in about (\d+) s", expected.inner_text())
        assert shown and 80 <= int(shown[1]) <= 100, expected.inner_text()  # page a bit later
        assert halted.locator("[data-guard=min_samples]").get_attribute("data-passed") == "false"
        assert "too few samples" in halted.locator("[data-field=reason]").inner_text()
        assert page.locator("[data-testid=canary-state]").inner_text() == "progressing"

        # The judge passes the step while the page is open: the row appears by itself.
        assert judge_step(canary.pk, candidate_ttft=0.45, n=100) == "advance"
        advanced = page.locator("tr[data-action=advance]")
        advanced.wait_for()
        assert advanced.locator("[data-field=step]").inner_text() == "1 · 10%"
        assert advanced.locator("[data-field=requests]").inner_text() == "100 / 100"
        # One-sided test (is the candidate slower?): a faster candidate has p ≈ 1.
        assert (
            advanced.locator("[data-field=ttft]").inner_text()
            == "504 ms → 454 ms (-9.9%, p=1; n 100/100) pass"
        )
        assert advanced.locator("[data-passed=true]").count() == 4  # and TTFT p95
        page.wait_for_selector("#canary-chart[data-points='2'] canvas")

        # The last step passes: promoted; the page says so and stops refreshing.
        assert judge_step(canary.pk, candidate_ttft=0.45, n=100) == "promote"
        page.wait_for_selector("#canary-timeline[data-state=promoted]")
        assert page.locator("#canary-timeline").get_attribute("hx-trigger") is None
        assert page.locator("[data-testid=judgements] tr[data-judgement]").count() == 3
        assert page.locator("[data-testid=verdict-expected]").count() == 0
        assert page.locator("tr[data-action=promote] [data-field=step]").inner_text() == "2 · 50%"

        # After the end the page is reached from the audit row of the promotion.
        page.goto(f"{asgi_server.url}/audit/?cluster={cluster.pk}")
        page.click("tr[data-action='canary.promote'] [data-testid=canary-link]")
        page.wait_for_url(f"**/clusters/{cluster.pk}/canary/{canary.pk}/")
        rows = page.locator("[data-testid=judgements] tr[data-judgement]")
        assert [rows.nth(i).get_attribute("data-action") for i in range(3)] == [
            "promote",
            "advance",
            "wait",
        ]
        assert (
            page.locator("[data-testid=canary-rollout] tr[data-action='canary.promote']").count()
            == 1
        )
        page.wait_for_selector("#canary-chart[data-points='3'] canvas")
        page.screenshot(path=str(artifacts_dir / "canary-detail.png"), full_page=True)
        assert page.js_errors == [] and refused == []
    finally:
        page.context.close()


def test_the_chart_waits_for_medians_and_then_draws_them(browser, asgi_server) -> None:
    """A canary judged only while no arm had samples has nothing to plot: the chart says so
    instead of drawing an empty frame; the first judgement with medians draws it."""
    cluster, canary = started_canary("quiet-trial")
    assert judge_step(canary.pk, candidate_ttft=0.5, n=0) == "wait"

    page = login(browser, asgi_server.url, "viewer", bypass_csp=False)
    try:
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/canary/{canary.pk}/")
        chart = page.locator("#canary-chart")
        chart.wait_for()
        page.wait_for_function("document.getElementById('canary-chart').dataset.points === '1'")
        assert chart.inner_text().startswith("No medians yet")
        assert chart.locator("canvas").count() == 0

        assert judge_step(canary.pk, candidate_ttft=0.45, n=100) == "advance"
        page.wait_for_selector("#canary-chart[data-points='2'] canvas")
        assert "No medians yet" not in page.locator("#canary-chart").inner_text()
        assert page.js_errors == []
    finally:
        page.context.close()
