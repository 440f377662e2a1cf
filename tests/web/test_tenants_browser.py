"""The Tenants table in Debian chromium under the enforced CSP: an operator creates a
tenant, changes it and removes it (confirming), hostile values are refused field by field
with the message next to each field and the typed values kept (on the create form and on
the tenant's own row), nothing is written by a refusal, and the audit log shows the
changes with their reasons."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from controlplane.models import AuditEvent, Tenant

from .helpers import login, make_cluster

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


def _create_field(page, name: str):
    return page.locator(f"[data-testid=tenant-create] [name={name}]")


def _row(page, tenant: str):
    return page.locator(f"tr[data-tenant='{tenant}']")


def test_an_operator_manages_a_tenant_from_the_browser_and_hostile_values_are_named(
    browser, asgi_server, artifacts_dir
) -> None:
    cluster = make_cluster()
    page = login(browser, asgi_server.url, "operator", bypass_csp=False)
    url = f"{asgi_server.url}/clusters/{cluster.pk}/tenants/"
    try:
        page.goto(url)
        # Hostile values on the create form: each refused next to its field, kept as typed.
        _create_field(page, "name").fill("no spaces allowed")
        _create_field(page, "weight").fill("NaN")
        _create_field(page, "tokens_per_minute").fill("1e99")
        _create_field(page, "requests_per_minute").fill("-3")
        _create_field(page, "max_queued_bytes").fill(str(65 * 1024**3))  # over the 64 GiB cap
        page.get_by_role("button", name="Create tenant").click()
        create = page.get_by_test_id("tenant-create")
        fields = ("name", "weight", "tokens_per_minute", "requests_per_minute", "max_queued_bytes")
        for field in fields:
            error = create.locator(f"[data-error={field}]")
            expect(error).to_be_visible()
            expect(error).to_contain_text(field)
        expect(create.locator(".field-error")).to_have_count(5)
        expect(_create_field(page, "weight")).to_have_value("NaN")
        expect(page.get_by_test_id("form-error")).to_be_visible()
        assert not Tenant.objects.filter(cluster=cluster).exists()
        versions = cluster.versions.count()

        # Corrected, it is created.
        _create_field(page, "name").fill("team-a")
        page.locator("[data-testid=tenant-create] select[name=priority]").select_option("critical")
        _create_field(page, "weight").fill("2")
        _create_field(page, "tokens_per_minute").fill("")
        _create_field(page, "requests_per_minute").fill("90")
        _create_field(page, "max_queued").fill("32")
        _create_field(page, "max_queued_bytes").fill(str(8 * 1024**2))
        _create_field(page, "reason").fill("a new team")
        page.get_by_role("button", name="Create tenant").click()
        row = _row(page, "team-a")
        expect(row).to_be_visible()
        expect(row.get_by_label("class")).to_have_value("critical")
        expect(row.get_by_label("requests per minute")).to_have_value("90")
        tenant = Tenant.objects.get(cluster=cluster, name="team-a")
        assert (tenant.priority, tenant.weight, tenant.requests_per_minute) == ("critical", 2, 90)
        assert (tenant.max_queued, tenant.max_queued_bytes) == (32, 8 * 1024**2)
        expect(row.get_by_label("bytes that may wait")).to_have_value(str(8 * 1024**2))
        assert cluster.versions.count() == versions + 1  # published to the routers

        # A hostile change: named on the tenant's own row, nothing written.
        row.get_by_label("weight").fill("0")
        row.get_by_label("token budget").fill("many")
        row.get_by_label("requests that may wait").fill("1000000")
        row.get_by_role("button", name="Save").click()
        row = _row(page, "team-a")
        for field in ("weight", "token_budget", "max_queued"):
            expect(row.locator(f"[data-error={field}]")).to_contain_text(field)
        expect(row.locator(".field-error")).to_have_count(3)
        expect(row.get_by_label("token budget")).to_have_value("many")
        expect(create.locator(".field-error")).to_have_count(0)
        page.screenshot(path=str(artifacts_dir / "tenants-refused.png"), full_page=True)
        tenant.refresh_from_db()
        assert (tenant.weight, tenant.token_budget, tenant.max_queued) == (2, None, 32)

        # Corrected, the change is saved; a blank limit clears it.
        row.get_by_label("weight").fill("3")
        row.get_by_label("token budget").fill("500000")
        row.get_by_label("requests that may wait").fill("16")
        row.get_by_label("bytes that may wait").fill(str(1024**2))
        row.get_by_label("requests per minute").fill("")
        row.get_by_label("class").select_option("sheddable")
        row.get_by_label("reason").fill("batch work now")
        row.get_by_role("button", name="Save").click()
        row = _row(page, "team-a")
        expect(row.locator(".field-error")).to_have_count(0)
        expect(row.get_by_label("class")).to_have_value("sheddable")
        expect(row.get_by_label("token budget")).to_have_value("500000")
        tenant.refresh_from_db()
        assert (tenant.priority, tenant.weight, tenant.token_budget, tenant.max_queued) == (
            "sheddable",
            3,
            500_000,
            16,
        )
        assert tenant.max_queued_bytes == 1024**2 and tenant.requests_per_minute is None

        # Removed, after the confirmation (dismissed first: nothing happens).
        page.once("dialog", lambda dialog: dialog.dismiss())
        row.get_by_role("button", name="Remove").click()
        expect(_row(page, "team-a")).to_be_visible()
        assert Tenant.objects.filter(pk=tenant.pk).exists()
        page.once("dialog", lambda dialog: dialog.accept())
        _row(page, "team-a").get_by_role("button", name="Remove").click()
        expect(_row(page, "team-a")).to_have_count(0)
        assert not Tenant.objects.filter(pk=tenant.pk).exists()

        # The audit log has the three changes, not the refusals.
        page.goto(f"{asgi_server.url}/audit/?cluster={cluster.pk}")
        audit = page.get_by_test_id("audit-events")
        for action in ("tenant.create", "tenant.update", "tenant.delete"):
            expect(audit.locator(f"tr[data-action='{action}']")).to_have_count(1)
        expect(audit.locator("tr[data-action='tenant.create']")).to_contain_text("a new team")
        expect(audit.locator("tr[data-action='tenant.update']")).to_contain_text("batch work now")
        actions = AuditEvent.objects.filter(cluster=cluster, target_type="tenant")
        assert actions.count() == 3
        assert page.js_errors == []
    finally:
        page.context.close()
