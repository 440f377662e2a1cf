"""Non-finite numbers in policy parameters are refused with the field named, never a 5xx
(JSON's 1e999 parses as infinity, which Postgres cannot store)."""

from __future__ import annotations

import pytest

from .helpers import assert_refused, session_client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        ("lmetric", '{"batch_offset": 1e999}', "params.batch_offset"),
        ("predicted_ttft", '{"prefill_tps": 1e999}', "params.prefill_tps"),
        ("smetric", '{"slo_ttft_s": 1e999}', "params.slo_ttft_s"),
    ],
)
def test_infinite_parameters_are_refused(world, users, kind, params, field) -> None:
    client = session_client(users["operator"])
    body = f'{{"name": "inf", "kind": "{kind}", "params": {params}}}'
    response = client.post(
        f"/api/v1/clusters/{world['alpha']}/policies", body, content_type="application/json"
    )
    assert_refused(response, 400, field)
