"""Routing policies: create (validated by the policy's own class; cost coefficients the
operator left unset derived from the cluster's GPU and model) and activate."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from controlplane.models import Policy
from router_worker.contract.config import DEFAULT_DECODE_POLICY

from . import audit, config, policy_defaults
from .audit import Actor
from .clusters import _full_clean, claim_edit, locked_cluster
from .errors import Conflict, NotFound
from .validation import normalised_params


def policy_snapshot(policy: Policy) -> dict[str, Any]:
    return {
        "name": policy.name,
        "kind": policy.kind,
        "params": policy.params,
        "description": policy.description,
    }


@transaction.atomic
def create_policy(
    actor: Actor,
    cluster_id: int,
    *,
    name: str,
    kind: str,
    params: dict[str, Any] | None = None,
    description: str = "",
    reason: str = "",
) -> Policy:
    cluster = locked_cluster(cluster_id)
    params = policy_defaults.complete_params(kind, normalised_params(kind, params), cluster)
    policy = Policy(cluster=cluster, name=name, kind=kind, params=params, description=description)
    _full_clean(policy, ("name",))
    try:
        with transaction.atomic():
            policy.save()
    except IntegrityError:
        raise Conflict(
            f"a policy named {name!r} already exists in {cluster.name}", "name"
        ) from None
    audit.record(
        actor,
        "policy.create",
        policy,
        after=policy_snapshot(policy),
        reason=reason,
        cluster=cluster,
    )
    return policy


@transaction.atomic
def activate_policy(
    actor: Actor,
    cluster_id: int,
    policy_id: int,
    *,
    reason: str,
    expected_revision: int | None = None,
) -> Policy:
    reason = audit.require_reason(reason)
    cluster, policy = _choosing(cluster_id, policy_id, expected_revision)
    assert policy is not None  # policy_id is an id
    before = {"active_policy": cluster.active_policy.name if cluster.active_policy else None}
    if cluster.active_policy_id == policy.pk:
        raise Conflict(f"{policy.name!r} is already the active policy", "policy_id")
    cluster.active_policy = policy
    cluster.save(update_fields=["active_policy"])
    version = config.publish(cluster, actor, reason)
    audit.record(
        actor,
        "policy.activate",
        policy,
        before=before,
        after={
            "active_policy": policy.name,
            "kind": policy.kind,
            "config_version": version.number if version else None,
        },
        reason=reason,
        cluster=cluster,
    )
    return policy


@transaction.atomic
def set_decode_policy(
    actor: Actor,
    cluster_id: int,
    policy_id: int | None,
    *,
    reason: str,
    expected_revision: int | None = None,
) -> Policy | None:
    """Choose the policy a disaggregated cluster's routers place the decode stage with (one
    of the cluster's policies; None: their default, decode_room). It applies while some
    instance is of role prefill or decode."""
    reason = audit.require_reason(reason)
    cluster, policy = _choosing(cluster_id, policy_id, expected_revision)
    if cluster.decode_policy_id == policy_id:
        raise Conflict(f"the decode policy is already {_decode_name(policy)}", "policy_id")
    before = {"decode_policy": _decode_name(cluster.decode_policy)}
    cluster.decode_policy = policy
    cluster.save(update_fields=["decode_policy"])
    version = config.publish(cluster, actor, reason)
    audit.record(
        actor,
        "policy.decode",
        cluster,
        before=before,
        after={
            "decode_policy": _decode_name(policy),
            "kind": policy.kind if policy else DEFAULT_DECODE_POLICY,
            "config_version": version.number if version else None,
        },
        reason=reason,
        cluster=cluster,
    )
    return policy


def _decode_name(policy: Policy | None) -> str:
    return policy.name if policy is not None else f"the default ({DEFAULT_DECODE_POLICY})"


def _choosing(
    cluster_id: int, policy_id: int | None, expected_revision: int | None
) -> tuple[Any, Policy | None]:
    """The locked cluster and its policy ``policy_id`` (None: None) for a change of which
    policy it runs: refused on a stale revision, for another cluster's policy, or while a
    canary runs."""
    cluster = locked_cluster(cluster_id)
    claim_edit(cluster, expected_revision)
    policy = None
    if policy_id is not None:
        try:
            policy = cluster.policies.get(pk=policy_id)
        except Policy.DoesNotExist:
            raise NotFound(
                f"policy {policy_id} does not exist in {cluster.name}", "policy_id"
            ) from None
    if config.active_canary(cluster) is not None:
        raise Conflict("a canary is running on this cluster: promote or abort it first")
    return cluster, policy
