"""A cluster's GPU and model are checked against enginesim's cost model when it is created
(API and service): a typo is refused at once, naming the known ones, instead of surfacing
in the first replay. Clusters stored before the check keep their names
(tests/web/test_pages.py shows their pages)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.models import AuditEvent, Cluster
from controlplane.services import clusters
from controlplane.services.audit import Actor
from controlplane.services.errors import ServiceError
from enginesim.engine import GPUS, MODELS
from enginesim.replay.policy_costs import model_key

from .helpers import assert_refused, session_client

pytestmark = pytest.mark.django_db
SYSTEM = Actor.system("tests")


def post(client, body: dict[str, Any]):
    return client.post("/api/v1/clusters", body, content_type="application/json")


@pytest.mark.parametrize(
    ("body", "field", "known"),
    [
        ({"model": "Qwen/Qwen2-7B-Instruct", "gpu_type": "h2O"}, "gpu_type", sorted(GPUS)),
        ({"model": "Qwen/Qwen2-7B-Instrct", "gpu_type": "h20"}, "model", sorted(MODELS)),
    ],
)
def test_the_api_refuses_an_unknown_gpu_or_model_naming_the_known_ones(
    users, body, field, known
) -> None:
    admin = session_client(users["admin"])
    audited = AuditEvent.objects.count()
    response = post(admin, {"name": "typo", **body, "reason": "r"})
    assert_refused(response, 400, field, f"knows no {'GPU' if field == 'gpu_type' else 'model'}")
    message = response.json()["error"]["message"]
    assert all(name in message for name in known), message
    assert not Cluster.objects.filter(name="typo").exists()
    assert AuditEvent.objects.count() == audited


@pytest.mark.parametrize(
    ("model", "gpu_type"),
    [
        ("Qwen/Qwen2-7B-Instruct", "h20"),
        ("qwen3-8b", "H100"),
        ("meta-llama/Llama-3.1-8B", "a100"),
        ("Qwen/Qwen2.5-14B-Instruct", "h800"),
        ("qwen2.5-14b", "A800"),
    ],
)
def test_known_spellings_are_accepted_as_given(users, model, gpu_type) -> None:
    response = post(
        session_client(users["admin"]),
        {"name": "ok", "model": model, "gpu_type": gpu_type, "reason": "r"},
    )
    assert response.status_code == 201, response.content
    assert (response.json()["model"], response.json()["gpu_type"]) == (model, gpu_type)


def test_the_service_refuses_them_too() -> None:
    with pytest.raises(ServiceError) as refused:
        clusters.create_cluster(SYSTEM, name="tpu", model="qwen2-7b", gpu_type="tpu-v5")
    assert refused.value.field == "gpu_type" and "h100" in refused.value.message


def test_a_model_is_told_from_its_smaller_sibling_by_its_whole_name() -> None:
    """Qwen2.5-14B must not resolve to the 7B that shares its family prefix."""
    assert model_key("Qwen/Qwen2.5-14B-Instruct") == "qwen2.5-14b"
    assert model_key("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5-7b"
