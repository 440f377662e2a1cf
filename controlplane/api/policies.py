"""Policy kinds (with their parameter schemas), a cluster's policies, activation."""

from dataclasses import asdict
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import StrictInt

from controlplane.models import Policy
from controlplane.selectors import clusters as cluster_selectors
from controlplane.selectors import robustness
from controlplane.services import policies as policy_services
from controlplane.services.validation import policy_kinds
from router_worker.contract.config import DEFAULT_DECODE_POLICY
from router_worker.routing import REGISTRY
from router_worker.routing.provenance import params_provenance

from .auth import actor_of, role
from .revisions import expected_revision
from .schemas import (
    MAX_PK,
    ExpectedRevision,
    Id,
    PolicyIn,
    PolicyKindOut,
    PolicyOut,
    Reason,
    ReasonIn,
)

routes = Router(tags=["policies"])


def _out(policy: Policy, active_policy_id: int | None) -> dict:
    return {
        **{
            f: getattr(policy, f)
            for f in ("id", "cluster_id", "name", "kind", "params", "description", "created_at")
        },
        "active": policy.pk == active_policy_id,
    }


@routes.get("/policy-kinds", response=list[PolicyKindOut])
def list_policy_kinds(request: HttpRequest):
    """Every policy kind: its parameters' schema, where each default comes from, and where it
    breaks the never-collapse invariant in the robustness suite."""
    kinds = policy_kinds()
    records = robustness.by_kind(kinds)
    return [
        {
            "kind": kind,
            "description": info["description"],
            "params_schema": info["schema"],
            "params_provenance": _provenance(kind),
            "robustness": asdict(records[kind]),
        }
        for kind, info in kinds.items()
    ]


def _provenance(kind: str) -> dict[str, dict]:
    table = params_provenance(REGISTRY[kind].Params)
    return {name: found.to_dict() for name, found in table.items() if found is not None}


@routes.get("/clusters/{cluster_id}/policies", response=list[PolicyOut])
def list_policies(request: HttpRequest, cluster_id: Id):
    active = cluster_selectors.cluster(cluster_id).active_policy_id
    return [_out(policy, active) for policy in cluster_selectors.policies(cluster_id)]


@routes.post("/clusters/{cluster_id}/policies", response={201: PolicyOut}, auth=role("operator"))
def create_policy(request: HttpRequest, cluster_id: Id, payload: PolicyIn):
    policy = policy_services.create_policy(actor_of(request), cluster_id, **payload.dict())
    return Status(201, _out(policy, policy.cluster.active_policy_id))


@routes.post(
    "/clusters/{cluster_id}/policies/{policy_id}/activate",
    response=PolicyOut,
    auth=role("operator"),
)
def activate_policy(request: HttpRequest, cluster_id: Id, policy_id: Id, payload: ReasonIn):
    policy = policy_services.activate_policy(
        actor_of(request),
        cluster_id,
        policy_id,
        reason=payload.reason,
        expected_revision=expected_revision(request, payload.expected_revision),
    )
    return _out(policy, policy.pk)


class DecodePolicyIn(Schema):
    policy_id: StrictInt | None = Field(
        ge=1,
        le=MAX_PK,
        description="One of the cluster's policies, to place a disaggregated cluster's decode "
        "stage with; null: the routers' default (decode_room). It applies while some "
        "instance is of role prefill or decode.",
    )
    reason: Reason
    expected_revision: ExpectedRevision = None


class DecodePolicyOut(Schema):
    cluster_id: int
    policy_id: int | None
    name: str | None
    kind: str = Field(description="The decode stage's policy kind in force.")
    revision: int


@routes.get("/clusters/{cluster_id}/decode-policy", response=DecodePolicyOut)
def get_decode_policy(request: HttpRequest, cluster_id: Id):
    return _decode_out(cluster_selectors.cluster(cluster_id))


@routes.put("/clusters/{cluster_id}/decode-policy", response=DecodePolicyOut, auth=role("operator"))
def set_decode_policy(request: HttpRequest, cluster_id: Id, payload: DecodePolicyIn):
    """Choose the decode stage's policy of the cluster's routers (a new config version)."""
    policy_services.set_decode_policy(
        actor_of(request),
        cluster_id,
        payload.policy_id,
        reason=payload.reason,
        expected_revision=expected_revision(request, payload.expected_revision),
    )
    return _decode_out(cluster_selectors.cluster(cluster_id))


def _decode_out(cluster: Any) -> dict:
    policy = cluster.decode_policy
    return {
        "cluster_id": cluster.pk,
        "policy_id": policy.pk if policy else None,
        "name": policy.name if policy else None,
        "kind": policy.kind if policy else DEFAULT_DECODE_POLICY,
        "revision": cluster.revision,
    }
