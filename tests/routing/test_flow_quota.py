"""Tenant quotas (router_worker/routing/quota.py): requests and tokens a minute and a token
budget per period, refused with 429 and a Retry-After until the window turns."""

from __future__ import annotations

from router_worker.routing.flow import TenantSettings
from router_worker.routing.quota import QuotaCharge, QuotaLedger


def test_no_limits_no_refusal():
    ledger = QuotaLedger()
    tenant = TenantSettings(name="free")
    assert all(ledger.take(tenant, 10**6, float(n)) is None for n in range(100))


def test_requests_a_minute_are_refused_until_the_minute_turns():
    ledger = QuotaLedger()
    tenant = TenantSettings(name="a", requests_per_minute=3)
    assert [ledger.take(tenant, 10, 120.0 + n) for n in range(3)] == [None, None, None]
    refused = ledger.take(tenant, 10, 135.2)
    assert refused is not None and refused.status == 429 and refused.reason == "quota"
    assert refused.retry_after_s == 45 and "request rate" in refused.message
    assert ledger.take(tenant, 10, 180.0) is None  # the next minute


def test_tokens_a_minute_count_prompt_and_output_tokens():
    ledger = QuotaLedger()
    tenant = TenantSettings(name="a", tokens_per_minute=1000)
    assert ledger.take(tenant, 600, 0.0) is None
    ledger.add_tokens(tenant, 300, 1.0)  # its output
    refused = ledger.take(tenant, 200, 2.0)
    assert refused is not None and "token rate" in refused.message
    assert ledger.take(tenant, 100, 3.0) is None  # 1000 exactly still fits


def test_a_token_budget_lasts_its_period():
    ledger = QuotaLedger()
    tenant = TenantSettings(name="a", token_budget=5000, budget_period="hour")
    for minute in range(5):
        assert ledger.take(tenant, 1000, 60.0 * minute) is None
    refused = ledger.take(tenant, 1, 600.0)
    assert refused is not None and "budget" in refused.message
    assert refused.retry_after_s == 3000
    assert ledger.take(tenant, 1000, 3600.0) is None


def test_a_refused_request_is_not_charged():
    ledger = QuotaLedger()
    tenant = TenantSettings(name="a", tokens_per_minute=1000, requests_per_minute=100)
    assert ledger.take(tenant, 900, 0.0) is None
    assert ledger.take(tenant, 500, 1.0) is not None
    assert ledger.take(tenant, 100, 2.0) is None


def test_a_refund_gives_back_the_charge_in_the_windows_it_was_charged_in():
    ledger = QuotaLedger()
    tenant = TenantSettings(name="a", requests_per_minute=2, token_budget=1000)
    assert ledger.take(tenant, 400, 10.0) is None
    assert ledger.take(tenant, 400, 11.0) is None
    assert ledger.take(tenant, 400, 12.0) is not None
    ledger.refund(QuotaCharge.of(tenant, 400, 11.0))  # shed after it passed
    assert ledger.take(tenant, 400, 13.0) is None  # its request and tokens are back
    # A refund of the minute past gives the budget back, not this minute's requests.
    assert ledger.take(tenant, 100, 61.0) is None
    ledger.refund(QuotaCharge.of(tenant, 400, 13.0))
    assert ledger.take(tenant, 300, 62.0) is None
    refused = ledger.take(tenant, 1, 63.0)
    assert refused is not None and "request rate" in refused.message
