"""The end of the operator's loop in Debian chromium: a replay's recommendation, its one
button to a pre-filled canary form, the canary created from it linking back."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from controlplane.models import CanarySplit

from .helpers import finished_job, login, make_cluster

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


def test_the_recommendation_becomes_a_canary(browser, asgi_server, artifacts_dir) -> None:
    cluster = make_cluster()
    # lm is active; rr wins at ×1.5 beyond the seeds' spread and ties at ×1
    job = finished_job(cluster, {"lm": [[5.0, 5.1, 4.9], [6.0, 6.1, 5.9]],
                                 "rr": [[5.0, 5.05, 4.95], [8.0, 8.1, 7.9]]})  # fmt: skip
    page = login(browser, asgi_server.url, "operator")
    try:
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/replays/{job.pk}/")
        expect(page.get_by_test_id("recommendation")).to_contain_text("Recommendation: rr")
        expect(page.get_by_test_id("active-row").first).to_be_visible()
        page.screenshot(path=str(artifacts_dir / "replay-recommendation.png"), full_page=True)
        page.click("[data-action=canary-from-replay]")
        expect(page.get_by_test_id("from-replay")).to_be_visible()
        rr = cluster.policies.get(name="rr")
        expect(page.locator("select[name=candidate_policy]")).to_have_value(str(rr.pk))
        page.fill("#canary-form input[name=name]", "replay-says-rr")
        page.fill("#canary-form [name=reason]", "replay recommendation")
        page.click("#canary-form button.primary")
        page.wait_for_url(f"{asgi_server.url}/clusters/{cluster.pk}/canary/")
        canary = CanarySplit.objects.get(name="replay-says-rr")
        assert canary.source_replay_id == job.pk
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/replays/{job.pk}/")
        expect(page.get_by_test_id("replay-canary")).to_contain_text("replay-says-rr")
        assert page.js_errors == []
    finally:
        page.context.close()
