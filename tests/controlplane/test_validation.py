"""Refusals name the field at fault: policy parameters (checked by the policies' own
classes), canary splits and weight steps, and the request schema itself."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.utils import OperationalError

from controlplane.models import AuditEvent, CanarySplit, ConfigVersion

from .endpoints import REASON, canary_body, fill
from .helpers import assert_refused, session_client

pytestmark = pytest.mark.django_db


def post(client, path: str, body: Any):
    return client.post(path, body, content_type="application/json")


@pytest.fixture
def operator(users):
    return session_client(users["operator"])


@pytest.mark.parametrize(
    ("params", "status", "field", "message"),
    [
        ({"w": 1.5}, 400, "params.w", "linear.w: must be ≤ 1 (got 1.5)"),  # 0 <= w <= 1
        ({"w": "heavy"}, 400, "params.w", "linear.w: must be a number (got 'heavy')"),
        (
            {"variant": "quadratic"},
            400,
            "params.variant",
            "linear.variant: must be one of 'weighted_sum' or 'dynamo' (got 'quadratic')",
        ),
        (
            {"bogus": 1},
            400,
            "params.bogus",  # the policy classes forbid unknown parameters
            "linear.bogus: unknown parameter (known: prefill_weight, variant, w)",
        ),
        ([1, 2], 422, "params", "params"),  # not a JSON object: refused by the request schema
    ],
)
def test_invalid_policy_params_are_refused_naming_the_field(
    world, operator, params, status, field, message
) -> None:
    response = post(
        operator,
        f"/api/v1/clusters/{world['alpha']}/policies",
        {"name": "bad", "kind": "linear", "params": params},
    )
    assert_refused(response, status, field, message)


def test_every_invalid_policy_param_is_listed_with_its_field(world, operator) -> None:
    response = post(
        operator,
        f"/api/v1/clusters/{world['alpha']}/policies",
        {
            "name": "bad",
            "kind": "lmetric",
            "params": {"batch_offset": -1, "hotspot": {"enabled": "maybe", "window_s": 0}},
        },
    )
    assert_refused(
        response, 400, "params.batch_offset", "lmetric.batch_offset: must be ≥ 0 (got -1)"
    )
    assert response.json()["error"]["problems"] == [
        {"field": "params.batch_offset", "message": "lmetric.batch_offset: must be ≥ 0 (got -1)"},
        {
            "field": "params.hotspot.enabled",
            "message": "lmetric.hotspot.enabled: must be true or false (got 'maybe')",
        },
        {
            "field": "params.hotspot.window_s",
            "message": "lmetric.hotspot.window_s: must be > 0 (got 0)",
        },
    ]


def test_nested_policy_params_name_the_full_path(world, operator) -> None:
    response = post(
        operator,
        f"/api/v1/clusters/{world['alpha']}/policies",
        {"name": "bad", "kind": "lmetric", "params": {"hotspot": {"window_s": 0}}},
    )
    assert_refused(response, 400, "params.hotspot.window_s")


def test_unknown_policy_kind_lists_the_known_ones(world, operator) -> None:
    response = post(
        operator, f"/api/v1/clusters/{world['alpha']}/policies", {"name": "bad", "kind": "fastest"}
    )
    assert_refused(response, 400, "kind", "lmetric", "round_robin")


def test_valid_params_are_stored_with_defaults_filled_in(world, operator) -> None:
    response = post(
        operator,
        f"/api/v1/clusters/{world['alpha']}/policies",
        {"name": "lin", "kind": "linear", "params": {"w": 0.55}},
    )
    assert response.status_code == 201
    assert response.json()["params"] == {
        "variant": "weighted_sum",
        "w": 0.55,
        "prefill_weight": 1.0,
    }


def test_policy_kinds_publish_each_parameter_schema(world, operator) -> None:
    kinds = {k["kind"]: k for k in operator.get("/api/v1/policy-kinds").json()}
    assert {"lmetric", "smetric", "round_robin", "linear"} <= set(kinds)
    assert kinds["linear"]["params_schema"]["properties"]["w"]["maximum"] == 1.0
    assert kinds["lmetric"]["description"]


def canary(world, **changes: Any) -> dict[str, Any]:
    return {**fill(canary_body(), world.ids), **changes}


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"candidate_instances": ["i0", "i2"]}, "candidate_instances", ("overlap", "i0")),
        ({"baseline_instances": []}, "baseline_instances", ("at least one",)),
        ({"candidate_instances": []}, "candidate_instances", ("at least one",)),
        ({"candidate_instances": ["i2", "ghost"]}, "candidate_instances", ("unknown", "ghost")),
        ({"baseline_instances": ["i0", "i0"]}, "baseline_instances", ("twice",)),
        ({"weight_steps": []}, "weight_steps", ("at least one",)),
        ({"weight_steps": [0, 50]}, "weight_steps", ("(0, 100]",)),
        ({"weight_steps": [50, 150]}, "weight_steps", ("(0, 100]",)),
        ({"weight_steps": [50, 20]}, "weight_steps", ("increase",)),
        ({"weight_steps": [-5]}, "weight_steps", ("(0, 100]",)),
        ({"guardrails": {"max_error_rate": -1}}, "guardrails.max_error_rate", ("≥ 0 (got -1",)),
        ({"guardrails": {"p_value": float("nan")}}, "guardrails.p_value", ("finite", "nan")),
        ({"guardrails": {"speed": 1}}, "guardrails.speed", ("unknown",)),
        ({"candidate_policy_id": "{lm}"}, "candidate_policy_id", ("differ",)),
        ({"baseline_policy_id": 987654}, "baseline_policy_id", ("does not exist",)),
        ({"reason": ""}, "reason", ("reason",)),
    ],
)
def test_inconsistent_canary_splits_are_refused_naming_the_field(
    world, operator, changes, field, words
) -> None:
    count = CanarySplit.objects.count(), AuditEvent.objects.count()
    body = canary(world, **fill(changes, world.ids))
    response = post(operator, f"/api/v1/clusters/{world['alpha']}/canaries", body)
    assert_refused(response, 400, field, *words)
    assert (CanarySplit.objects.count(), AuditEvent.objects.count()) == count


def test_policy_of_another_cluster_cannot_join_a_canary(world, operator) -> None:
    beta_policy = operator.get(f"/api/v1/clusters/{world['beta']}/policies").json()[0]["id"]
    response = post(
        operator,
        f"/api/v1/clusters/{world['alpha']}/canaries",
        canary(world, candidate_policy_id=beta_policy),
    )
    assert_refused(response, 400, "candidate_policy_id", "does not exist in alpha")


def test_non_numeric_weight_step_is_refused_by_the_schema(world, operator) -> None:
    response = post(
        operator,
        f"/api/v1/clusters/{world['alpha']}/canaries",
        canary(world, weight_steps=[10, "lots"]),
    )
    assert_refused(response, 422, "weight_steps.1")


def test_every_published_canary_step_splits_exactly_100_percent(world, users) -> None:
    admin = session_client(users["admin"])
    assert post(admin, f"/api/v1/canaries/{world['draft']}/start", REASON).status_code == 200
    newest = admin.get(f"/api/v1/clusters/{world['alpha']}/config-versions").json()[0]
    arms = newest["document"]["canary"]["arms"]
    assert [arm["weight"] for arm in arms] == [90.0, 10.0]
    assert sum(arm["weight"] for arm in arms) == 100
    # The routers hash session keys with the canary's secret salt: clients cannot pick arms.
    # The API shows the document without it; the stored version (what routers read) has it.
    assert newest["document"]["canary"]["salt"] == "(hidden)"
    stored = ConfigVersion.objects.get(pk=newest["id"]).document["canary"]["salt"]
    assert len(stored) == 32 and int(stored, 16) != world["draft"]


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/api/v1/clusters", {"name": "x y", "model": "qwen2-7b", "gpu_type": "h20"}, 400, "name"),
        (
            "/api/v1/clusters",
            {"name": "alpha", "model": "qwen2-7b", "gpu_type": "h20"},
            409,
            "name",
        ),
        (
            "/api/v1/clusters",
            {"name": "z", "model": "qwen2-7b", "gpu_type": "h20", "block_size": 0},
            422,
            "block_size",
        ),
        ("/api/v1/clusters", {"model": "qwen2-7b", "gpu_type": "h20"}, 422, "name"),
        (
            "/api/v1/clusters/{alpha}/instances",
            {"name": "i0", "url": "http://h:1", **REASON},
            409,
            "name",
        ),
        (
            "/api/v1/clusters/{alpha}/instances",
            {"name": "n", "url": "not a url", **REASON},
            400,
            "url",
        ),
        (
            "/api/v1/clusters/{alpha}/routers",
            {"name": "r9", "host": "h", "port": 70000},
            422,
            "port",
        ),
        (
            "/api/v1/clusters/{alpha}/replays",
            {
                "trace": "shared:mooncake_synthetic_trace.jsonl",
                "policies": [{"kind": "linear", "params": {"w": 7}}],
            },
            400,
            "policies.0.params.w",
        ),
        (
            "/api/v1/clusters/{alpha}/replays",
            {"trace": "shared:no-such-trace.jsonl", "policies": [{"kind": "lmetric"}]},
            400,
            "trace",
        ),
    ],
)
def test_admin_inputs_are_refused_naming_the_field(world, users, path, body, status, field) -> None:
    response = post(session_client(users["admin"]), path.format(**world.ids), body)
    assert_refused(response, status, field)


def test_no_op_changes_conflict(world, users) -> None:
    admin = session_client(users["admin"])
    response = post(admin, f"/api/v1/instances/{world['i3']}/drain", REASON)
    assert_refused(response, 409, "state", "already draining")
    response = post(
        admin, f"/api/v1/clusters/{world['alpha']}/policies/{world['lm']}/activate", REASON
    )
    assert_refused(response, 409, "policy_id", "already the active policy")


def test_illegal_canary_transition_conflicts(world, operator) -> None:
    response = post(operator, f"/api/v1/canaries/{world['draft']}/pause", REASON)
    assert response.status_code == 409
    assert "draft" in response.json()["error"]["message"]


def test_missing_objects_are_json_404(world, operator) -> None:
    for path in (
        "/api/v1/clusters/424242",
        "/api/v1/canaries/424242",
        "/api/v1/routers/424242",
        "/api/v1/replays/424242",
    ):
        response = operator.get(path)
        assert response.status_code == 404
        assert "424242" in response.json()["error"]["message"]


def test_malformed_json_is_a_json_error(world, operator) -> None:
    response = operator.post(
        f"/api/v1/clusters/{world['alpha']}/policies", "{not json", content_type="application/json"
    )
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["message"]


def test_database_outage_is_a_json_503(world, operator, monkeypatch) -> None:
    from controlplane.selectors import clusters as selectors

    def unavailable():
        raise OperationalError("connection refused")

    monkeypatch.setattr(selectors, "clusters", unavailable)
    response = operator.get("/api/v1/clusters")
    assert response.status_code == 503
    assert response.json()["error"]["message"].startswith("database unavailable")
