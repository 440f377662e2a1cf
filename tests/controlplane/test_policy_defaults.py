"""predicted_ttft's cost coefficients: derived from the cluster's GPU and model (enginesim's
cost model) wherever the operator left them unset — API, policy form, replays — and kept
where the operator set them; unknown hardware is refused naming the field to set."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from controlplane.models import AuditEvent, Cluster, Policy, ReplayJob
from controlplane.services import clusters, policies
from controlplane.services.errors import ServiceError
from controlplane.services.policy_defaults import (
    UnknownHardwareError,
    complete_params,
    derive_coefficients,
)
from enginesim.replay.policy_costs import derive_decode_costs
from router_worker.routing.policies.decode_guard import REFERENCE_DECODE_COSTS
from router_worker.routing.policies.predicted_ttft import (
    COEFFICIENT_FIELDS,
    FALLBACK_COEFFICIENTS,
    PredictedTTFTParams,
)

from .helpers import SYSTEM, session_client

pytestmark = pytest.mark.django_db
REASON = "ticket OPS-20"
# predicted_ttft's parameters that are not cost coefficients, at their declared defaults
# (nested settings, such as the hotspot detector's, as stored: plain JSON)
OTHER_DEFAULTS = {
    name: value
    for name, value in PredictedTTFTParams().model_dump(mode="json").items()
    if name not in COEFFICIENT_FIELDS
}


def stored_cluster(name: str, model: str, gpu_type: str) -> Cluster:
    """A cluster on hardware enginesim does not know: creation refuses such names now, so
    one stored before the check."""
    return Cluster.objects.create(name=name, model=model, gpu_type=gpu_type)


def test_the_policys_fallback_values_are_the_cost_models_h20_qwen2_7b_values() -> None:
    assert derive_coefficients("h20", "qwen2-7b") == FALLBACK_COEFFICIENTS


def test_coefficients_follow_the_gpu_and_the_model() -> None:
    h20 = derive_coefficients("h20", "qwen2-7b")
    h100 = derive_coefficients("h100", "qwen2-7b")
    assert h100["prefill_tps"] > 5 * h20["prefill_tps"]  # 989 against 148 dense TFLOPS
    assert h100["decode_seq_s"] < h20["decode_seq_s"]
    assert derive_coefficients("h20", "qwen3-32b")["prefill_tps"] < h20["prefill_tps"] / 3
    assert derive_coefficients("l40s", "qwen2-7b")["chunk_tokens"] == 2048  # < 70 GiB GPU
    assert set(h20) == set(COEFFICIENT_FIELDS)


@pytest.mark.parametrize(
    "name",
    ["qwen2-7b", "Qwen/Qwen2-7B", "Qwen/Qwen2-7B-Instruct", "Qwen2-7B-Instruct", " QWEN/QWEN2-7B "],
)
def test_model_spellings_of_one_model_resolve_alike(name: str) -> None:
    assert derive_coefficients("H20", name) == derive_coefficients("h20", "qwen2-7b")


@pytest.mark.parametrize(
    ("gpu", "model", "words"),
    [
        ("b200", "qwen2-7b", ("GPU 'b200'", "h20")),
        ("h20", "gpt-oss-120b", ("model 'gpt-oss-120b'", "qwen2-7b")),
        ("l40s", "qwen3-32b", ("does not fit",)),
    ],
)
def test_unknown_hardware_is_an_error_not_another_gpus_numbers(gpu, model, words) -> None:
    with pytest.raises(UnknownHardwareError) as info:
        derive_coefficients(gpu, model)
    assert all(word in str(info.value) for word in words)


def test_created_policy_gets_the_clusters_coefficients_and_the_audit_row_shows_them(world) -> None:
    policy = policies.create_policy(SYSTEM, world["alpha"], name="pt", kind="predicted_ttft")
    expected = {**FALLBACK_COEFFICIENTS, **OTHER_DEFAULTS}  # alpha: h20
    assert policy.params == expected
    assert Policy.objects.get(pk=policy.pk).params == expected
    audit = AuditEvent.objects.filter(action="policy.create").latest("at")
    assert audit.after is not None and audit.after["params"] == expected


def test_coefficients_the_operator_set_are_kept(world) -> None:
    set_by_hand = {
        "prefill_tps": 1234.5,
        "chunk_tokens": 4096,
        "decode_seq_s": 0.0,
        "use_measured_prefill_tps": True,
    }
    policy = policies.create_policy(
        SYSTEM, world["alpha"], name="pt", kind="predicted_ttft", params=set_by_hand
    )
    assert policy.params == {**FALLBACK_COEFFICIENTS, **OTHER_DEFAULTS, **set_by_hand}


def test_other_kinds_are_left_alone(world) -> None:
    params = {"w": 0.5, "variant": "weighted_sum", "prefill_weight": 1.0}
    cluster = stored_cluster("odd", "mystery-model", "tpu")
    assert complete_params("linear", params, cluster) is params
    policy = policies.create_policy(SYSTEM, cluster.pk, name="lin", kind="linear", params=params)
    assert policy.params == params


def post(client, path: str, body: Any):
    return client.post(path, body, content_type="application/json")


def test_api_fills_from_another_clusters_hardware(users) -> None:
    cluster = clusters.create_cluster(
        SYSTEM, name="hopper", model="meta-llama/Llama-3.1-8B", gpu_type="h100"
    )
    response = post(
        session_client(users["operator"]),
        f"/api/v1/clusters/{cluster.pk}/policies",
        {"name": "pt", "kind": "predicted_ttft", "params": {"min_step_s": None}},
    )
    assert response.status_code == 201, response.content
    derived = derive_coefficients("h100", "llama-3.1-8b")
    assert response.json()["params"] == {**derived, **OTHER_DEFAULTS}
    assert derived["prefill_tps"] != FALLBACK_COEFFICIENTS["prefill_tps"]


def test_unknown_hardware_is_refused_naming_the_first_unset_field(users) -> None:
    cluster = stored_cluster("blackwell", "Qwen/Qwen2-7B", "b200")
    operator = session_client(users["operator"])
    path = f"/api/v1/clusters/{cluster.pk}/policies"
    response = post(
        operator, path, {"name": "pt", "kind": "predicted_ttft", "params": {"prefill_tps": 20000.0}}
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "params.step_overhead_s"
    assert "b200" in error["message"] and "params.chunk_tokens" in error["message"]
    assert not Policy.objects.filter(cluster=cluster).exists()
    # every coefficient set by hand: nothing to derive, so the hardware does not matter
    response = post(
        operator,
        path,
        {
            "name": "pt",
            "kind": "predicted_ttft",
            "params": {**FALLBACK_COEFFICIENTS, "prefill_tps": 2e4},
        },
    )
    assert response.status_code == 201, response.content
    assert response.json()["params"]["prefill_tps"] == 2e4


def test_service_error_for_unknown_hardware_names_the_field(world) -> None:
    cluster = stored_cluster("mystery", "Qwen/Qwen2-7B", "mi300x")
    with pytest.raises(ServiceError) as info:
        complete_params("predicted_ttft", {"prefill_tps": None}, cluster)
    assert info.value.field == "params.prefill_tps"


def test_policy_form_leaves_coefficients_blank_and_the_service_fills_them(world, users) -> None:
    viewer = session_client(users["viewer"])
    form = viewer.get(
        reverse("web:policy_params", args=[world["alpha"]]), {"kind": "predicted_ttft"}
    ).content.decode()
    for name in COEFFICIENT_FIELDS:
        assert f'name="param.{name}"' in form
        assert f'name="param.{name}" value=""' in form  # blank: not the H20 values
    assert "derived from the cluster" in form
    assert 'name="param.correction" checked' in form
    assert 'name="param.kv_pressure"' in form
    assert 'name="param.kv_pressure" checked' not in form
    blank = {f"param.{name}": "" for name in COEFFICIENT_FIELDS}
    response = session_client(users["operator"]).post(
        reverse("web:policy_apply", args=[world["alpha"]]),
        {
            "policy": "new",
            "name": "pt-web",
            "kind": "predicted_ttft",
            "reason": REASON,
            "confirm": "yes",
            **blank,
            "param.correction": "on",  # checked by default, so a browser posts it
            # kv_pressure: unchecked by default, so a browser leaves it out
            "param.queue_attention": "on",
            "param.hotspot.enabled": "on",  # likewise
            "param.chunk_tokens": "4096",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    policy = Policy.objects.get(cluster_id=world["alpha"], name="pt-web")
    assert policy.params == {
        **FALLBACK_COEFFICIENTS,
        **OTHER_DEFAULTS,
        "chunk_tokens": 4096,
    }


def test_replay_specs_get_the_clusters_coefficients(world, users, replay_dispatches) -> None:
    response = post(
        session_client(users["operator"]),
        f"/api/v1/clusters/{world['alpha']}/replays",
        {
            "trace": "shared:mooncake_synthetic_trace.jsonl",
            "reason": REASON,
            "policies": [
                {"kind": "predicted_ttft", "params": {"prefill_tps": 3000}},
                {"kind": "lmetric"},
            ],
        },
    )
    assert response.status_code == 202, response.content
    job = ReplayJob.objects.get(pk=response.json()["replay"]["id"])
    assert job.inputs["policies"][0]["params"] == {
        **FALLBACK_COEFFICIENTS,
        **OTHER_DEFAULTS,
        "prefill_tps": 3000,
    }


def test_replay_on_unknown_hardware_names_the_spec_and_field(users, replay_dispatches) -> None:
    cluster = stored_cluster("future", "Qwen/Qwen2-7B", "b200")
    response = post(
        session_client(users["operator"]),
        f"/api/v1/clusters/{cluster.pk}/replays",
        {
            "trace": "shared:mooncake_synthetic_trace.jsonl",
            "reason": REASON,
            "policies": [{"kind": "lmetric"}, {"kind": "predicted_ttft"}],
        },
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == "policies.1.params.prefill_tps"


# ----- the decode guard's costs (lmetric, smetric) ---------------------------------------
def test_the_guards_reference_costs_are_the_cost_models_h20_qwen2_7b_values() -> None:
    assert derive_decode_costs("h20", "qwen2-7b") == REFERENCE_DECODE_COSTS


def test_the_guards_costs_follow_the_fleet() -> None:
    h20 = derive_decode_costs("h20", "qwen2-7b")
    a100 = derive_decode_costs("a100", "qwen3-8b")
    # an A100 reads KV more slowly against its weight read: a context weighs more
    assert a100["decode_fixed_tokens"] < h20["decode_fixed_tokens"] / 2


@pytest.mark.parametrize("kind", ["lmetric", "smetric"])
def test_cache_affine_policies_get_the_clusters_decode_costs(world, kind) -> None:
    cluster = clusters.create_cluster(
        SYSTEM, name=f"hopper-{kind}", model="meta-llama/Llama-3.1-8B", gpu_type="h100"
    )
    policy = policies.create_policy(SYSTEM, cluster.pk, name="p", kind=kind)
    derived = derive_decode_costs("h100", "llama-3.1-8b")
    assert {name: policy.params[name] for name in derived} == derived
    kept = policies.create_policy(
        SYSTEM, cluster.pk, name="q", kind=kind, params={"decode_fixed_tokens": 5e5}
    )
    assert kept.params["decode_fixed_tokens"] == 5e5
    assert kept.params["decode_seq_tokens"] == derived["decode_seq_tokens"]


@pytest.mark.parametrize("kind", ["lmetric", "smetric"])
def test_unknown_hardware_leaves_the_guard_on_the_reference_costs(world, kind) -> None:
    """Unlike predicted_ttft, the guard runs without its costs: nothing is refused."""
    cluster = stored_cluster(f"blackwell-{kind}", "Qwen/Qwen2-7B", "b200")
    policy = policies.create_policy(SYSTEM, cluster.pk, name="p", kind=kind)
    assert not set(REFERENCE_DECODE_COSTS) & {k for k, v in policy.params.items() if v}
