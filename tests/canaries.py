"""A running canary built through the services, for the judge's tests and drills."""

from __future__ import annotations

from typing import Any

from controlplane.models import CanarySplit
from controlplane.services import canaries, clusters, policies
from controlplane.services.audit import Actor

ACTOR = Actor.system("test")


def running_canary(
    name: str,
    *,
    instances: int = 4,
    base_port: int = 9100,
    weight_steps: list[float] | None = None,
    guardrails: dict[str, Any] | None = None,
) -> CanarySplit:
    """Cluster ``name`` with ``instances`` instances (even ones in the baseline arm), round
    robin active and lmetric as the candidate; the canary ``name`` on it, started."""
    cluster = clusters.create_cluster(ACTOR, name=name, model="qwen2-7b", gpu_type="h20")
    names = [f"i{i}" for i in range(instances)]
    for i, instance in enumerate(names):
        url = f"http://127.0.0.1:{base_port + i}"
        clusters.add_instance(ACTOR, cluster.pk, name=instance, url=url, reason="setup")
    base = policies.create_policy(ACTOR, cluster.pk, name="rr", kind="round_robin")
    cand = policies.create_policy(ACTOR, cluster.pk, name="lm", kind="lmetric")
    policies.activate_policy(ACTOR, cluster.pk, base.pk, reason="setup")
    half = instances // 2
    canary = canaries.create_canary(
        ACTOR,
        cluster.pk,
        name=name,
        baseline_policy_id=base.pk,
        candidate_policy_id=cand.pk,
        baseline_instances=names[:half],
        candidate_instances=names[half:],
        weight_steps=weight_steps or [10, 50],
        guardrails=guardrails,
        reason="try lmetric",
    )
    canaries.transition(ACTOR, canary.pk, "start", reason="go")
    return canary
