"""Hostile values in the parameters this wave added (the decode guard's, predicted_ttft's
KV, decode and correction settings): the form and the API refuse each with a clear 4xx
that names the field (or the NUL rule), store nothing, and never echo a script unescaped.
The API refuses NUL in its request schema, before the policy's own checks, and so with
the 422 every schema refusal gets; the policy's checks answer 400."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from controlplane.models import Policy

NEW_PARAMS = {
    "lmetric": ["decode_slack", "decode_fixed_tokens", "decode_seq_tokens"],
    "smetric": ["decode_slack", "decode_fixed_tokens", "decode_seq_tokens"],
    "predicted_ttft": ["context_token_s", "decode_slack", "decode_weight", "output_tokens_prior"],
}
HOSTILE_TEXT = ["<script>alert(1)</script>", "nan", "inf", "-1", "1e309", "0x10", "\u0000"]
# the same as raw JSON tokens (NaN, Infinity and 1e309 are what a careless client sends)
HOSTILE_JSON = [
    '"<script>alert(1)</script>"',
    "NaN",
    "Infinity",
    "-1",
    "1e309",
    '"0x10"',
    '"\\u0000"',
]
FIELDS = [(kind, name) for kind, names in NEW_PARAMS.items() for name in names]
NUL_REFUSAL = "cannot contain NUL characters"


@pytest.mark.parametrize("value", HOSTILE_TEXT)
@pytest.mark.parametrize(("kind", "name"), FIELDS)
def test_the_form_refuses_hostile_values_naming_the_field(as_role, cluster, kind, name, value):
    data = {
        "policy": "new",
        "name": "hostile",
        "kind": kind,
        "reason": "hostile input",
        "confirm": "yes",
        f"param.{name}": value,
    }
    response = as_role("operator").post(reverse("web:policy_apply", args=[cluster.pk]), data)
    assert response.status_code == 400, (name, value)
    body = response.content.decode()
    assert (name in body or NUL_REFUSAL in body) and "<script>alert(1)</script>" not in body
    assert not Policy.objects.filter(name="hostile").exists()


@pytest.mark.parametrize("token", HOSTILE_JSON)
@pytest.mark.parametrize(("kind", "name"), FIELDS)
def test_the_api_refuses_hostile_values_naming_the_field(as_role, cluster, kind, name, token):
    head = f'{{"name": "hostile", "kind": "{kind}", "reason": "hostile input", '
    raw = head + f'"params": {{"{name}": {token}}}}}'
    response = as_role("operator").post(
        f"/api/v1/clusters/{cluster.pk}/policies", raw, content_type="application/json"
    )
    expected = 422 if token == '"\\u0000"' else 400
    assert response.status_code == expected, (name, token, response.content[:300])
    error = response.json()["error"]
    assert name in error.get("field", "") or NUL_REFUSAL in error["message"], error
    assert not Policy.objects.filter(name="hostile").exists()


@pytest.mark.parametrize("value", ["maybe", "<script>", "\u0000"])
def test_a_hostile_correction_switch_is_refused_by_the_api(as_role, cluster, value):
    body = {
        "name": "hostile",
        "kind": "predicted_ttft",
        "reason": "r",
        "params": {"correction": value},
    }
    response = as_role("operator").post(
        f"/api/v1/clusters/{cluster.pk}/policies", json.dumps(body), content_type="application/json"
    )
    error = response.json()["error"]
    if value == "\u0000":
        assert response.status_code == 422 and error["field"] == "params", error
    else:
        assert response.status_code == 400 and error["field"] == "params.correction", error
