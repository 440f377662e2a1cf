"""Operators can read the knobs, in Debian chromium under the enforced CSP: each policy
parameter's description is the accessible description of its input (lmetric and smetric,
a boolean included), a refused value comes back named next to its field with the typed
value kept, and the canary form describes the chosen policies' parameters."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from router_worker.routing.hotspot import HotspotParams
from router_worker.routing.policies import REGISTRY

from .helpers import login, make_cluster

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


def description(kind: str, name: str) -> str:
    """The policy module's own text (read at test time: the modules may reword it)."""
    return REGISTRY[kind].Params.model_fields[name].description or ""


def starts_with(text: str) -> re.Pattern:
    return re.compile("^" + re.escape(" ".join(text.split())[:60]))


def csp_watch(page) -> list[str]:
    refused: list[str] = []
    page.on(
        "console",
        lambda message: (
            refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    return refused


def test_policy_form_describes_every_knob_and_names_a_refused_value(
    browser, asgi_server, artifacts_dir
) -> None:
    cluster = make_cluster()
    page = login(browser, asgi_server.url, "operator", bypass_csp=False)
    refused = csp_watch(page)
    try:
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/policy/")
        page.select_option("[data-testid=policy-choice]", "new")
        page.select_option("[data-testid=policy-kind]", "smetric")
        slo = page.get_by_label("slo_ttft_s", exact=True)
        expect(slo).to_have_accessible_description(
            starts_with(description("smetric", "slo_ttft_s"))
        )
        default = REGISTRY["smetric"].Params.model_fields["slo_ttft_s"].default
        expect(slo).to_have_accessible_description(
            re.compile(rf"default {re.escape(str(default))}; > 0; blank: the default$")
        )

        page.select_option("[data-testid=policy-kind]", "lmetric")
        enabled = page.get_by_label("hotspot.enabled", exact=True)
        expect(enabled).to_be_checked()
        expect(enabled).to_have_accessible_description(
            starts_with(HotspotParams.model_fields["enabled"].description or "")
        )
        offset = page.get_by_label("batch_offset", exact=True)
        expect(offset).to_have_accessible_description(
            starts_with(description("lmetric", "batch_offset"))
        )

        page.get_by_test_id("policy-name").fill("lm-typo")
        offset.fill("-1")
        enabled.uncheck()
        page.get_by_test_id("reason").fill("a smaller offset")
        page.get_by_test_id("confirm").check()
        page.get_by_test_id("apply").click()

        error = page.locator("[data-param=batch_offset] [data-testid=field-error]")
        expect(error).to_have_text("lmetric.batch_offset: must be ≥ 0 (got -1)")
        offset = page.get_by_label("batch_offset", exact=True)
        expect(offset).to_have_value("-1")
        expect(offset).to_have_attribute("aria-invalid", "true")
        expect(offset).to_have_accessible_description(
            re.compile(r"lmetric\.batch_offset: must be ≥ 0 \(got -1\)$")
        )
        expect(page.get_by_label("hotspot.enabled", exact=True)).not_to_be_checked()
        expect(page.get_by_test_id("policy-name")).to_have_value("lm-typo")
        expect(page.get_by_test_id("reason")).to_have_value("a smaller offset")
        expect(page.get_by_test_id("confirm")).to_be_checked()
        expect(page.get_by_test_id("form-error")).to_contain_text("lmetric.batch_offset")
        expect(page.locator("[data-testid=field-error]")).to_have_count(1)
        page.screenshot(path=str(artifacts_dir / "policy-form-refused.png"), full_page=True)
        assert not cluster.policies.filter(name="lm-typo").exists()

        offset.fill("0")  # corrected: nothing else needs retyping
        page.get_by_test_id("apply").click()
        expect(page.get_by_test_id("applied")).to_contain_text("lm-typo")
        assert cluster.policies.get(name="lm-typo").params["hotspot"]["enabled"] is False
        assert page.js_errors == [] and refused == []
    finally:
        page.context.close()


@pytest.mark.parametrize("typo", ["2e", "1.2.3"])
def test_a_typo_typed_in_the_browser_is_refused_naming_its_field(
    browser, asgi_server, typo
) -> None:
    """A number input sent "2e" as blank (read as null: the guard off) and "1.2.3" as
    something else; the inputs are text, and the server names the field."""
    cluster = make_cluster()
    page = login(browser, asgi_server.url, "operator", bypass_csp=False)
    try:
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/policy/")
        page.select_option("[data-testid=policy-choice]", "new")
        page.select_option("[data-testid=policy-kind]", "smetric")
        expect(page.get_by_label("slo_ttft_s", exact=True)).to_be_visible()
        page.select_option("[data-testid=policy-kind]", "lmetric")
        expect(page.get_by_label("slo_ttft_s", exact=True)).to_have_count(0)  # swapped in
        slack = page.get_by_label("decode_slack", exact=True)
        expect(slack).to_have_accessible_description(re.compile("blank: the default; none: null"))
        slack.fill(typo)
        page.get_by_test_id("policy-name").fill("lm-typo")
        page.get_by_test_id("reason").fill("tighten the guard")
        page.get_by_test_id("confirm").check()
        page.get_by_test_id("apply").click()
        error = page.locator("[data-param=decode_slack] [data-testid=field-error]")
        expect(error).to_have_text(f"lmetric.decode_slack: must be a number (got '{typo}')")
        expect(page.get_by_label("decode_slack", exact=True)).to_have_value(typo)
        assert not cluster.policies.filter(name="lm-typo").exists()
        assert cluster.versions.count() == 1
    finally:
        page.context.close()


def test_canary_form_describes_the_chosen_policies_parameters(
    browser, asgi_server, artifacts_dir
) -> None:
    cluster = make_cluster()
    lm = cluster.policies.get(name="lm")
    page = login(browser, asgi_server.url, "operator", bypass_csp=False)
    refused = csp_watch(page)
    try:
        page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/canary/")
        baseline = page.get_by_label("Baseline policy")
        candidate = page.get_by_label("Candidate policy")
        enabled_help = HotspotParams.model_fields["enabled"].description or ""
        expect(baseline).to_have_accessible_description(re.compile(re.escape(enabled_help)))
        expect(candidate).not_to_have_accessible_description(re.compile(re.escape(enabled_help)))
        candidate_lm = page.locator(f"#candidate-params [data-policy='{lm.pk}']")
        expect(candidate_lm).to_be_hidden()

        candidate.select_option(str(lm.pk))  # the script shows lm's knobs under the candidate
        expect(candidate_lm).to_be_visible()
        expect(candidate_lm).to_contain_text("hotspot.enabled = true")
        expect(candidate).to_have_accessible_description(
            re.compile(re.escape(" ".join(description("lmetric", "batch_offset").split()[:8])))
        )
        expect(page.get_by_label("max_failures", exact=True)).to_have_accessible_description(
            re.compile("failed steps tolerated before automatic rollback")
        )
        page.screenshot(path=str(artifacts_dir / "canary-form-knobs.png"), full_page=True)
        assert page.js_errors == [] and refused == []
    finally:
        page.context.close()
