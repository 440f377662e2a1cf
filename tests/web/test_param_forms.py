"""Operators can read the knobs: every policy parameter's description, default and bounds sit
next to its input (linked by aria-describedby) in the policy form and beside the chosen
policies in the canary form; refused values come back named, next to their field, with
everything the operator typed still in the form."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.models import CanarySplit, Policy
from controlplane.services.validation import policy_kinds
from controlplane.web.schema_form import param_fields
from router_worker.routing.hotspot import HotspotParams
from router_worker.routing.policies import REGISTRY

from .helpers import described, parse

pytestmark = pytest.mark.django_db


def test_every_parameter_of_every_policy_has_a_description() -> None:
    for kind, info in policy_kinds().items():
        for field in param_fields(info["schema"]):
            assert len(field.description) > 10, f"{kind}.{field.name} has no description"


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_policy_form_links_each_input_to_its_description(as_role, cluster, kind) -> None:
    response = as_role("operator").get(
        reverse("web:policy_params", args=[cluster.pk]), {"kind": kind}
    )
    root = parse(response)
    fields = param_fields(policy_kinds()[kind]["schema"])
    for field in fields:
        control = root.find(name=field.input_name)
        help_text = described(root, control)
        assert " ".join(field.description.split()) in help_text, (kind, field.name)
        assert f"default {field.default_text}" in help_text
        assert field.bounds in help_text
    assert len(root.find_all(data_testid="param-help")) == len(fields)


def test_policy_form_shows_lmetric_bounds_defaults_and_the_boolean_help(as_role, cluster):
    root = parse(
        as_role("operator").get(
            reverse("web:policy_params", args=[cluster.pk]), {"kind": "lmetric"}
        )
    )
    enabled = root.find("input", name="param.hotspot.enabled")
    assert enabled.attrs["type"] == "checkbox" and "checked" in enabled.attrs
    hint = HotspotParams.model_fields["enabled"].description
    assert hint is not None and described(root, enabled).startswith(hint)
    assert "default on" in described(root, enabled)
    assert "default 1.0; ≥ 0" in described(root, root.find(name="param.batch_offset"))
    window = described(root, root.find(name="param.hotspot.window_s"))
    assert "default 30.0; > 0" in window  # exclusive bound: 0 itself is refused
    assert "> 0, ≤ 1" in described(root, root.find(name="param.hotspot.max_hit_fraction"))


def refused_policy_post(as_role, cluster, **params: str):
    data = {
        "policy": "new",
        "name": "lm-bad",
        "kind": "lmetric",
        "reason": "try a new lm",
        "confirm": "yes",
        "param.prefill_term": "miss_ratio",
        **params,
    }
    return as_role("operator").post(reverse("web:policy_apply", args=[cluster.pk]), data)


def test_refused_policy_form_names_each_field_and_keeps_what_was_typed(as_role, cluster):
    response = refused_policy_post(
        as_role,
        cluster,
        **{
            "param.batch_offset": "-1",
            "param.hotspot.window_s": "soon",
            "param.hotspot.min_class_blocks": "3",
        },
    )  # hotspot.enabled left unchecked
    assert response.status_code == 400
    root = parse(response)
    offset = root.find("input", name="param.batch_offset")
    assert offset.attrs["value"] == "-1" and offset.attrs["aria-invalid"] == "true"
    assert "lmetric.batch_offset: must be ≥ 0 (got -1)" in described(root, offset)
    window = root.find("input", name="param.hotspot.window_s")
    assert window.attrs["value"] == "soon"
    assert "lmetric.hotspot.window_s: must be a number (got 'soon')" in described(root, window)
    blocks = root.find("input", name="param.hotspot.min_class_blocks")
    assert blocks.attrs["value"] == "3" and "aria-invalid" not in blocks.attrs
    assert "checked" not in root.find("input", name="param.hotspot.enabled").attrs
    prefill = root.find("select", name="param.prefill_term")
    assert [o.text for o in prefill.find_all("option") if "selected" in o.attrs] == ["miss_ratio"]
    assert root.find("input", name="name").attrs["value"] == "lm-bad"
    assert root.find("textarea", name="reason").text == "try a new lm"
    assert not Policy.objects.filter(name="lm-bad").exists()


def test_accepted_values_raise_no_field_error(as_role, cluster) -> None:
    response = refused_policy_post(
        as_role, cluster, **{"param.batch_offset": "0", "param.hotspot.window_s": "5"}
    )
    assert response.status_code == 302
    assert Policy.objects.get(name="lm-bad").params["batch_offset"] == 0


def canary_form(cluster, **changes: str) -> dict[str, str]:
    lm, rr = cluster.policies.get(name="lm"), cluster.policies.get(name="rr")
    return {
        "name": "try-rr",
        "baseline_policy": str(rr.pk),
        "candidate_policy": str(lm.pk),
        "arm.i0": "candidate",
        "arm.i1": "",
        "arm.i2": "baseline",
        "weight_steps": "5, 20",
        "guard.min_samples": "30",
        "guard.p_value": "-0.5",
        "assignment_key": "random",
        "reason": "compare lm and rr",
        **changes,
    }


def test_canary_form_shows_the_chosen_policies_parameters_with_their_help(as_role, cluster):
    root = parse(as_role("operator").get(reverse("web:canary", args=[cluster.pk])))
    lm = cluster.policies.get(name="lm")
    baseline = root.find("select", name="baseline_policy")
    text = described(root, baseline)  # the visible block is lm's, the active policy
    assert "hotspot.enabled = true" in text
    hint = HotspotParams.model_fields["enabled"].description
    offset_hint = REGISTRY["lmetric"].Params.model_fields["batch_offset"].description
    assert hint is not None and hint in text
    assert offset_hint is not None and offset_hint[:40] in text
    visible = [b for b in root.find(id="baseline-params").find_all(data_policy=str(lm.pk))]
    assert len(visible) == 1 and "hidden" not in visible[0].attrs
    hidden = root.find(id="candidate-params").find(data_policy=str(lm.pk))
    assert "hidden" in hidden.attrs  # rr is the default candidate
    guard = root.find("input", name="guard.max_failures")
    assert "failed steps tolerated before automatic rollback" in described(root, guard)


def test_refused_canary_form_names_the_field_and_keeps_what_was_typed(as_role, cluster):
    response = as_role("operator").post(
        reverse("web:canary_create", args=[cluster.pk]), canary_form(cluster)
    )
    assert response.status_code == 400
    root = parse(response)
    p_value = root.find("input", name="guard.p_value")
    assert p_value.attrs["value"] == "-0.5" and p_value.attrs["aria-invalid"] == "true"
    assert "guardrails.p_value: must be a finite number ≥ 0 (got -0.5)" in described(root, p_value)
    assert root.find("input", name="guard.min_samples").attrs["value"] == "30"
    assert root.find("input", name="weight_steps").attrs["value"] == "5, 20"
    assert root.find("input", name="name").attrs["value"] == "try-rr"
    assert root.find("textarea", name="reason").text == "compare lm and rr"
    for select, policy in (("baseline_policy", "rr"), ("candidate_policy", "lm")):
        chosen = [
            o.attrs["value"]
            for o in root.find("select", name=select).find_all("option")
            if "selected" in o.attrs
        ]
        assert chosen == [str(cluster.policies.get(name=policy).pk)], select
    arms = {
        i.attrs["name"]: i.attrs["value"]
        for i in root.find_all("input", type="radio")
        if "checked" in i.attrs
    }
    assert arms == {"arm.i0": "candidate", "arm.i1": "", "arm.i2": "baseline"}
    assert [
        o.text
        for o in root.find("select", name="assignment_key").find_all("option")
        if "selected" in o.attrs
    ] == ["random"]
    assert not CanarySplit.objects.exists()


def test_canary_form_accepts_the_corrected_value(as_role, cluster) -> None:
    response = as_role("operator").post(
        reverse("web:canary_create", args=[cluster.pk]),
        canary_form(cluster, **{"guard.p_value": "0.01"}),
    )
    assert response.status_code == 302
    assert CanarySplit.objects.get(name="try-rr").guardrails["p_value"] == 0.01


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        # min_samples 0 was once accepted, and passed steps without data
        ({"guard.min_samples": "0"}, "must be a whole number ≥ 1 (got 0)"),
        ({"guard.min_samples": "2.5"}, "must be a whole number (got 2.5)"),
        ({"guard.min_samples": "2e"}, "'2e' is not a number"),
        ({"guard.min_samples": "1.2.3"}, "'1.2.3' is not a number"),
    ],
)
def test_canary_form_refuses_a_bad_min_samples_next_to_it(as_role, cluster, typed, message):
    response = as_role("operator").post(
        reverse("web:canary_create", args=[cluster.pk]),
        canary_form(cluster, **{"guard.p_value": "0.01", **typed}),
    )
    assert response.status_code == 400
    root = parse(response)
    box = root.find("input", name="guard.min_samples")
    assert box.attrs["aria-invalid"] == "true" and box.attrs["value"] == typed["guard.min_samples"]
    assert f"guardrails.min_samples: {message}" in described(root, box)
    assert "whole number ≥ 1, at most 100000" in described(root, box)
    assert not CanarySplit.objects.exists()


def test_canary_form_takes_a_blank_guardrail_as_the_default(as_role, cluster) -> None:
    response = as_role("operator").post(
        reverse("web:canary_create", args=[cluster.pk]),
        canary_form(cluster, **{"guard.p_value": " ", "guard.min_samples": "30"}),
    )
    assert response.status_code == 302
    stored = CanarySplit.objects.get(name="try-rr").guardrails
    assert (stored["p_value"], stored["min_samples"]) == (0.05, 30)
