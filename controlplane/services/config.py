"""Config versions: the desired routing state of a cluster as an immutable JSON document."""

from __future__ import annotations

import secrets
from typing import Any

from django.utils.crypto import salted_hmac

from controlplane.models import CanarySplit, Cluster, ConfigVersion, Tenant
from controlplane.models.cluster import all_session_sources
from controlplane.selectors.captures import capture_document
from enginesim.replay.policy_costs import derive_decider
from router_worker.contract.config import ConfigError, parse_config
from router_worker.routing.flow import TenantSettings

from . import notify
from .audit import Actor
from .errors import ServiceError

TENANT_FIELDS = tuple(name for name in TenantSettings.model_fields if name != "name")


def decider_document(cluster: Cluster) -> dict[str, Any]:
    """The routers' decider parameters: the cluster's choice, its model's KV bytes per
    token and its prefill → decode link's bandwidth and latency."""
    return derive_decider(
        cluster.decider, cluster.decider_threshold_tokens, cluster.model, cluster.kv_link
    )


def active_canary(cluster: Cluster) -> CanarySplit | None:
    return cluster.canaries.filter(state__in=CanarySplit.ACTIVE_STATES).first()


def canary_salt(canary: CanarySplit) -> str:
    """The canary's secret for its routers' session → arm hash (router_worker/arms.py):
    derived from SECRET_KEY, so a client cannot compute its session's arm, and fixed for
    the canary's life, so a session stays in its arm across versions and routers: once
    published, the salt its first config version carried (a SECRET_KEY rotated mid-canary
    would otherwise move sessions between arms)."""
    first = (
        ConfigVersion.objects.filter(cluster_id=canary.cluster_id, document__canary__id=canary.pk)
        .order_by("number")
        .values_list("document", flat=True)
        .first()
    )
    published = (first or {}).get("canary") or {}
    salt = published.get("salt") if isinstance(published, dict) else None
    if isinstance(salt, str) and len(salt) >= 16:
        return salt
    return salted_hmac("switchyard.canary-arm", str(canary.pk)).hexdigest()[:32]


def without_secrets(document: dict[str, Any]) -> dict[str, Any]:
    """A router config document as people may read it (API, admin): the canary's
    arm-assignment salt and the capture's digest key hidden (routers read them with
    their token; a client who knew one could pick its arm or confirm a prompt)."""
    shown = dict(document)
    for section in ("canary", "capture"):
        value = shown.get(section)
        if isinstance(value, dict) and "salt" in value:
            shown[section] = {**value, "salt": "(hidden)"}
    return shown


def forget_capture_salt(cluster: Cluster, capture_id: int) -> int:
    """Replace a deleted capture's salt in the cluster's stored config versions with a
    random one: the key of its digests must not outlive it. The one change a version ever
    gets (an update, past ConfigVersion.save's immutability): the document stays valid
    and routes the same, only the secret is gone. The count of versions scrubbed."""
    scrubbed = 0
    versions = ConfigVersion.objects.filter(cluster=cluster, document__capture__id=capture_id)
    for pk, document in versions.values_list("pk", "document"):
        capture = {**document["capture"], "salt": secrets.token_hex(32)}
        scrubbed += ConfigVersion.objects.filter(pk=pk).update(
            document={**document, "capture": capture}
        )
    return scrubbed


def canary_document(canary: CanarySplit) -> dict[str, Any]:
    weight = canary.candidate_weight
    return {
        "id": canary.pk,
        "assignment_key": canary.assignment_key,
        "salt": canary_salt(canary),
        "arms": [
            {
                "name": "baseline",
                "policy": canary.baseline_policy.spec(),
                "weight": 100 - weight,
                "instances": canary.baseline_instances,
            },
            {
                "name": "candidate",
                "policy": canary.candidate_policy.spec(),
                "weight": weight,
                "instances": canary.candidate_instances,
                # a decode stage exists only while some instance is prefill or decode
                **(
                    {"decode_policy": canary.candidate_decode_policy.spec()}
                    if canary.candidate_decode_policy and canary.cluster.is_disaggregated()
                    else {}
                ),
            },
        ],
    }


def settings_of(tenant: Tenant) -> dict[str, Any]:
    """A tenant as the router configuration carries it (a `tenants` entry)."""
    return {"name": tenant.name, **{name: getattr(tenant, name) for name in TENANT_FIELDS}}


def client_auth_document(cluster: Cluster) -> dict[str, Any] | None:
    """The `client_auth` section of the cluster's router config (None when there is nothing
    to say: no keys and none required, which is the router's default)."""
    keys = [
        {
            "sha256": key.key_hash,
            "rights": ["debug"] if key.can_debug else [],
            **({"tenant": key.tenant.name} if key.tenant else {}),
        }
        for key in cluster.client_keys.filter(revoked_at=None)
        .select_related("tenant")
        .order_by("pk")
    ]
    if not keys and not cluster.client_keys_required:
        return None
    return {"required": cluster.client_keys_required, "keys": keys}


def desired_document(cluster: Cluster) -> dict[str, Any] | None:
    """The routing document the cluster's routers should run, or None if not yet routable."""
    instances = [
        {
            "name": i.name,
            "url": i.url,
            "state": i.state,
            **({"kv_events": i.kv_events} if i.kv_events else {}),
            **({"role": i.role} if i.role != "both" else {}),
            **({"grey_override": i.grey_override} if i.grey_override != "auto" else {}),
        }
        for i in cluster.instances.order_by("name")
    ]
    if not instances or cluster.active_policy is None:
        return None
    canary = active_canary(cluster)
    document = {
        "cluster": cluster.name,
        "model": cluster.model,
        "block_size": cluster.block_size,
        "instances": instances,
        "policy": cluster.active_policy.spec(),
        "canary": canary_document(canary) if canary else None,
    }

    capture = capture_document(cluster)
    if capture is not None:
        document["capture"] = capture
    if any(i.get("role") for i in instances):
        # only a disaggregated cluster's: the block alone would make the cluster one
        document["disaggregation"] = {
            "decider": decider_document(cluster),
            **({"decode_policy": cluster.decode_policy.spec()} if cluster.decode_policy else {}),
        }
    if cluster.session_sources != all_session_sources():  # the routers' default otherwise
        document["session_sources"] = list(cluster.session_sources)
    client_auth = client_auth_document(cluster)
    if client_auth is not None:  # only hashes of the client keys travel
        document["client_auth"] = client_auth
    if cluster.flow_tpot_slo_ms is not None:  # the operator asked for it: on, tenants or not
        document["flow"] = {"enabled": True, "tpot_slo_s": cluster.flow_tpot_slo_ms / 1000}
    tenants = [settings_of(tenant) for tenant in cluster.tenants.order_by("name")]
    if tenants:  # flow control is on where the document lists tenants (RouterConfig)
        document["tenants"] = tenants
    return document


def latest_version(cluster: Cluster) -> ConfigVersion | None:
    return cluster.versions.order_by("-number").first()


def publish(cluster: Cluster, actor: Actor, reason: str) -> ConfigVersion | None:
    """Create a new version if the desired document changed. Call inside the service's
    transaction (the cluster row must be locked with select_for_update by the caller)."""
    document = desired_document(cluster)
    if document is None:
        return None
    latest = latest_version(cluster)
    if latest is not None and _without_version(latest.document) == document:
        return None
    number = (latest.number if latest else 0) + 1
    document = {"version": number, **document}
    try:
        parse_config(document)
    except ConfigError as error:
        raise ServiceError(f"the resulting router configuration is invalid: {error}") from None
    version = ConfigVersion.objects.create(
        cluster=cluster, number=number, document=document, created_by=actor.name, reason=reason
    )
    notify.config_version_created(cluster.name, number)
    return version


def _without_version(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "version"}
