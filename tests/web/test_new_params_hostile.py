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
NUL_REFUSAL = "cannot contain NUL characters"


# one request per kind and value, every new parameter of the kind set to it: the refusal
# must name each of them (the form and the API list every bad field at once)
@pytest.mark.parametrize("value", HOSTILE_TEXT)
@pytest.mark.parametrize("kind", NEW_PARAMS)
def test_the_form_refuses_hostile_values_naming_every_field(as_role, cluster, kind, value):
    data = {
        "policy": "new",
        "name": "hostile",
        "kind": kind,
        "reason": "hostile input",
        "confirm": "yes",
        **{f"param.{name}": value for name in NEW_PARAMS[kind]},
    }
    response = as_role("operator").post(reverse("web:policy_apply", args=[cluster.pk]), data)
    assert response.status_code == 400, value
    body = response.content.decode()
    marked = [f'class="param invalid" data-param="{name}"' in body for name in NEW_PARAMS[kind]]
    assert NUL_REFUSAL in body or all(marked), (value, marked)
    assert "<script>alert(1)</script>" not in body
    assert not Policy.objects.filter(name="hostile").exists()


@pytest.mark.parametrize("token", HOSTILE_JSON)
@pytest.mark.parametrize("kind", NEW_PARAMS)
def test_the_api_refuses_hostile_values_naming_every_field(as_role, cluster, kind, token):
    params = ", ".join(f'"{name}": {token}' for name in NEW_PARAMS[kind])
    head = f'"name": "hostile", "kind": "{kind}", "reason": "hostile input"'
    raw = f'{{{head}, "params": {{{params}}}}}'
    response = as_role("operator").post(
        f"/api/v1/clusters/{cluster.pk}/policies", raw, content_type="application/json"
    )
    error = response.json()["error"]
    if token == '"\\u0000"':
        assert response.status_code == 422 and NUL_REFUSAL in error["message"], error
    else:
        assert response.status_code == 400, (token, error)
        fields = {problem["field"] for problem in error["problems"]}
        assert fields == {f"params.{name}" for name in NEW_PARAMS[kind]}, error
    assert not Policy.objects.filter(name="hostile").exists()


@pytest.mark.parametrize("switch", ["correction", "kv_pressure", "queue_attention"])
@pytest.mark.parametrize("value", ["maybe", "<script>", "\u0000"])
def test_a_hostile_correction_switch_is_refused_by_the_api(as_role, cluster, switch, value):
    body = {
        "name": "hostile",
        "kind": "predicted_ttft",
        "reason": "r",
        "params": {switch: value},
    }
    response = as_role("operator").post(
        f"/api/v1/clusters/{cluster.pk}/policies", json.dumps(body), content_type="application/json"
    )
    error = response.json()["error"]
    if value == "\u0000":
        assert response.status_code == 422 and error["field"] == "params", error
    else:
        assert response.status_code == 400 and error["field"] == f"params.{switch}", error
