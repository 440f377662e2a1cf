"""What-if replays with flow control from the replay page, in Debian chromium: the form
offers flow control and a per-tenant scale ("what if this tenant doubles"), refuses a bad
scale next to its field with what was typed kept, stores both with the job, and the job's
results carry one row per tenant (the scaled tenant with twice its requests)."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from controlplane.models import ReplayJob
from controlplane.services import tenants as tenant_service
from controlplane.tasks.replay import run_replay

from .helpers import SYSTEM, login, make_cluster

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]
PER_TENANT = 20


def _trace(path) -> None:
    """A Mooncake trace, two tenants' requests interleaved, PER_TENANT each."""
    rows = [
        {
            "timestamp": 100 * n,
            "input_length": 512,
            "output_length": 16,
            "hash_ids": [1000 * n + b for b in range(1)],
            "tenant": "team-a" if n % 2 else "team-b",
        }
        for n in range(2 * PER_TENANT)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_replay_with_flow_control_and_a_doubled_tenant_from_the_page(
    browser, asgi_server, artifacts_dir, tmp_path
) -> None:
    cluster = make_cluster()
    for name in ("team-a", "team-b"):
        tenant_service.create_tenant(SYSTEM, cluster.pk, {"name": name}, reason="setup")
    trace = tmp_path / "tenants.jsonl"
    _trace(trace)
    page = login(browser, asgi_server.url, "operator", bypass_csp=False)
    try:
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/replays/")
        form = page.get_by_test_id("replay-controls")
        expect(form.locator("#flow-help")).to_contain_text("team-a")

        def submit(scales: str) -> None:
            form.locator("input[name=upload]").set_input_files(str(trace))
            form.locator("select[name=flow]").select_option("on")
            form.locator("input[name=tenant_scales]").fill(scales)
            form.locator("input[name=rate_scales]").fill("1")
            form.locator("input[name=seeds]").fill("1")
            form.locator("button.primary").click()

        for hostile, said in [
            ("nobody=2", "not a tenant of"),
            ("team-a=11", "factor must be a number in [0, 10]"),
            ("team-a=lots", "is not a number"),
            ("team-a", "TENANT=FACTOR"),
        ]:
            submit(hostile)
            form = page.get_by_test_id("replay-controls")
            error = form.locator("[data-error=tenant_scales]")
            expect(error).to_contain_text(said)
            expect(form.locator("input[name=tenant_scales]")).to_have_value(hostile)
            expect(form.locator("select[name=flow]")).to_have_value("on")
        assert not ReplayJob.objects.exists()

        submit("team-a=2")
        page.wait_for_url(f"{asgi_server.url}/clusters/{cluster.pk}/replays/*/**")
        job = ReplayJob.objects.get()
        assert (job.inputs["flow"], job.inputs["tenant_scales"]) == ("on", {"team-a": 2.0})
        assert run_replay(job.pk) == "succeeded"
        page.reload()
        expect(page.get_by_test_id("replay-tenants-note")).to_contain_text("team-a ×2")
        tenants = page.get_by_test_id("replay-tenants")
        rows = {
            name: tenants.locator(f"tr[data-tenant='{name}'] [data-field=requests]")
            for name in ("team-a", "team-b")
        }
        expect(rows["team-a"]).to_have_text(str(2 * PER_TENANT))
        expect(rows["team-b"]).to_have_text(str(PER_TENANT))
        page.screenshot(path=str(artifacts_dir / "replay-tenants.png"), full_page=True)
        job.refresh_from_db()
        assert job.results is not None
        row = job.results["policies"][0]["tenants"]["team-a"]
        assert row["served"] + row["throttled"] + row["shed"] == 2 * PER_TENANT  # none lost
        assert page.js_errors == []
    finally:
        page.context.close()
