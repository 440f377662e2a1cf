"""Clusters and their instances."""

import json
from collections.abc import Callable
from typing import Any, Literal

from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema, Status
from pydantic import StrictInt

from controlplane.models import Instance
from controlplane.selectors import clusters as cluster_selectors
from controlplane.services import clusters as cluster_services
from controlplane.services.clusters import MAX_THRESHOLD_TOKENS, MAX_TPOT_SLO_MS
from controlplane.services.roles import role_of
from router_worker.routing.sessions import SessionSource

from .auth import actor_of, auth_user, role
from .revisions import etag, expected_revision
from .schemas import (
    ClusterIn,
    ClusterOut,
    ExpectedRevision,
    GreyOverrideIn,
    Id,
    InstanceIn,
    InstanceOut,
    InstanceRoleIn,
    MeOut,
    Reason,
    ReasonIn,
)

routes = Router(tags=["clusters"])


@routes.get("/me", response=MeOut, tags=["auth"])
def me(request: HttpRequest) -> dict:
    user = auth_user(request)
    return {"username": user.get_username(), "role": role_of(user)}


@routes.get("/clusters", response=list[ClusterOut])
def list_clusters(request: HttpRequest):
    return cluster_selectors.clusters()


@routes.get("/clusters/{cluster_id}", response=ClusterOut)
def get_cluster(request: HttpRequest, cluster_id: Id, response: HttpResponse):
    cluster = cluster_selectors.cluster(cluster_id)
    response["ETag"] = etag(cluster)
    return cluster


@routes.post("/clusters", response={201: ClusterOut}, auth=role("admin"))
def create_cluster(request: HttpRequest, payload: ClusterIn):
    cluster = cluster_services.create_cluster(actor_of(request), **payload.dict())
    return Status(201, cluster)


@routes.get("/clusters/{cluster_id}/instances", response=list[InstanceOut], tags=["instances"])
def list_instances(request: HttpRequest, cluster_id: Id):
    return cluster_selectors.instances(cluster_id)


@routes.post(
    "/clusters/{cluster_id}/instances",
    response={201: InstanceOut},
    auth=role("admin"),
    tags=["instances"],
)
def add_instance(request: HttpRequest, cluster_id: Id, payload: InstanceIn):
    instance = cluster_services.add_instance(
        actor_of(request),
        cluster_id,
        **{
            **payload.dict(),
            "expected_revision": expected_revision(request, payload.expected_revision),
        },
    )
    return Status(201, instance)


@routes.post(
    "/instances/{instance_id}/drain",
    response=InstanceOut,
    auth=role("operator"),
    tags=["instances"],
)
def drain_instance(request: HttpRequest, instance_id: Id, payload: ReasonIn):
    return _set(cluster_services.set_instance_state, request, instance_id, "draining", payload)


@routes.post(
    "/instances/{instance_id}/enable",
    response=InstanceOut,
    auth=role("operator"),
    tags=["instances"],
)
def enable_instance(request: HttpRequest, instance_id: Id, payload: ReasonIn):
    return _set(cluster_services.set_instance_state, request, instance_id, "enabled", payload)


@routes.post(
    "/instances/{instance_id}/grey-override",
    response=InstanceOut,
    auth=role("operator"),
    tags=["instances"],
)
def set_grey_override(request: HttpRequest, instance_id: Id, payload: GreyOverrideIn):
    """Override grey-failure detection for this instance: `auto` (the detector decides),
    `healthy` (never flagged slow) or `drained` (no traffic, no probes, until set back)."""
    return _set(cluster_services.set_grey_override, request, instance_id, payload.mode, payload)


@routes.post(
    "/instances/{instance_id}/role",
    response=InstanceOut,
    auth=role("operator"),
    tags=["instances"],
)
def set_instance_role(request: HttpRequest, instance_id: Id, payload: InstanceRoleIn):
    """Move the instance to the prefill pool, the decode pool or both (disaggregation)."""
    return _set(cluster_services.set_instance_role, request, instance_id, payload.role, payload)


def _set(
    setter: Callable[..., Instance],
    request: HttpRequest,
    instance_id: int,
    value: str,
    payload: ReasonIn,
) -> Instance:
    """One of the instance setters of the service, with the request's actor, reason and
    expected revision."""
    return setter(
        actor_of(request),
        instance_id,
        value,
        reason=payload.reason,
        expected_revision=expected_revision(request, payload.expected_revision),
    )


@routes.delete(
    "/instances/{instance_id}", response={204: None}, auth=role("admin"), tags=["instances"]
)
def remove_instance(request: HttpRequest, instance_id: Id, reason: Reason | None = None):
    """The reason goes in the query string (`?reason=...`) or in a JSON body."""
    reason = reason if reason is not None else _reason_in_body(request)
    cluster_services.remove_instance(
        actor_of(request), instance_id, reason=reason, expected_revision=expected_revision(request)
    )
    return Status(204, None)


def _reason_in_body(request: HttpRequest) -> str:
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return ""
    reason = body.get("reason") if isinstance(body, dict) else None
    return reason if isinstance(reason, str) else ""


class SessionSourcesIn(Schema):
    sources: list[SessionSource] = Field(
        description="Where the routers read a request's session from, each at most once; "
        "they are read in a fixed order, first found wins: header (X-Session-ID), harness "
        "(agent harness session headers), response_chain (Responses previous_response_id), "
        "user (the body's user; Messages metadata.user_id). [] turns sessions off."
    )
    reason: Reason
    expected_revision: ExpectedRevision = None


class SessionSourcesOut(Schema):
    cluster_id: int
    sources: list[SessionSource]
    revision: int


@routes.get("/clusters/{cluster_id}/session-sources", response=SessionSourcesOut)
def get_session_sources(request: HttpRequest, cluster_id: Id):
    return _session_sources_out(cluster_selectors.cluster(cluster_id))


@routes.put(
    "/clusters/{cluster_id}/session-sources", response=SessionSourcesOut, auth=role("operator")
)
def set_session_sources(request: HttpRequest, cluster_id: Id, payload: SessionSourcesIn):
    """Switch session sources on or off for the cluster's routers (a new config version)."""
    cluster = cluster_services.set_session_sources(
        actor_of(request),
        cluster_id,
        list(payload.sources),
        reason=payload.reason,
        expected_revision=expected_revision(request, payload.expected_revision),
    )
    return _session_sources_out(cluster)


def _session_sources_out(cluster: Any) -> dict:
    return {
        "cluster_id": cluster.pk,
        "sources": cluster.session_sources,
        "revision": cluster.revision,
    }


class DeciderIn(Schema):
    decider: Literal["cost", "prefix_threshold", "always", "never"] = Field(
        description="When a disaggregated cluster's routers split a request into its prefill "
        "and decode calls: cost (the live cost of colocation against the split's), "
        "prefix_threshold (llm-d's: more prompt tokens than threshold_tokens uncached on the "
        "decode pool), always, never. It applies while some instance is of role prefill or "
        "decode."
    )
    threshold_tokens: StrictInt | None = Field(
        None,
        ge=0,
        le=MAX_THRESHOLD_TOKENS,
        description="prefix_threshold's tokens (256, llm-d's, by default); omitted: kept.",
    )
    kv_link: Literal["nvlink", "rdma", "tcp"] | None = Field(
        None,
        description="The link between the prefill and decode instances, whose bandwidth and "
        "latency the cost decider weighs (rdma by default); omitted: kept.",
    )
    reason: Reason
    expected_revision: ExpectedRevision = None


class DeciderOut(Schema):
    cluster_id: int
    decider: str
    threshold_tokens: int
    kv_link: str
    revision: int


@routes.get("/clusters/{cluster_id}/decider", response=DeciderOut)
def get_decider(request: HttpRequest, cluster_id: Id):
    return _decider_out(cluster_selectors.cluster(cluster_id))


@routes.put("/clusters/{cluster_id}/decider", response=DeciderOut, auth=role("operator"))
def set_decider(request: HttpRequest, cluster_id: Id, payload: DeciderIn):
    """Choose the disaggregation decider of the cluster's routers (a new config version)."""
    cluster = cluster_services.set_decider(
        actor_of(request),
        cluster_id,
        payload.decider,
        threshold_tokens=payload.threshold_tokens,
        kv_link=payload.kv_link,
        reason=payload.reason,
        expected_revision=expected_revision(request, payload.expected_revision),
    )
    return _decider_out(cluster)


def _decider_out(cluster: Any) -> dict:
    return {
        "cluster_id": cluster.pk,
        "decider": cluster.decider,
        "threshold_tokens": cluster.decider_threshold_tokens,
        "kv_link": cluster.kv_link,
        "revision": cluster.revision,
    }


class FlowIn(Schema):
    tpot_slo_ms: StrictInt | None = Field(
        ge=1,
        le=MAX_TPOT_SLO_MS,
        description="The TPOT SLO (ms per output token) the cluster's routers hold admission "
        "to: flow control keeps the engines' step time under it (and runs without tenants "
        "too). null: off.",
    )
    reason: Reason
    expected_revision: ExpectedRevision = None


class FlowOut(Schema):
    cluster_id: int
    tpot_slo_ms: int | None
    revision: int


@routes.get("/clusters/{cluster_id}/flow", response=FlowOut)
def get_flow(request: HttpRequest, cluster_id: Id):
    return _flow_out(cluster_selectors.cluster(cluster_id))


@routes.put("/clusters/{cluster_id}/flow", response=FlowOut, auth=role("operator"))
def set_flow(request: HttpRequest, cluster_id: Id, payload: FlowIn):
    """Set or clear the cluster's flow-control TPOT SLO (a new config version)."""
    cluster = cluster_services.set_flow_tpot_slo(
        actor_of(request),
        cluster_id,
        payload.tpot_slo_ms,
        reason=payload.reason,
        expected_revision=expected_revision(request, payload.expected_revision),
    )
    return _flow_out(cluster)


def _flow_out(cluster: Any) -> dict:
    return {
        "cluster_id": cluster.pk,
        "tpot_slo_ms": cluster.flow_tpot_slo_ms,
        "revision": cluster.revision,
    }
