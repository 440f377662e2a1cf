"""Client API keys for a cluster's routers: `syk_<prefix>_<secret>`, shown once, stored and
published to the routers as a sha256 hash only. Creating or revoking a key, or switching
whether keys are required, publishes a new config version: a running router follows with
its next config fetch (at once over pub/sub, at worst after its poll interval)."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.models import ClientKey, Cluster, ConfigVersion

from . import audit, config
from .audit import Actor
from .bearer import new_secret, sha256_hex
from .clusters import locked_cluster
from .errors import Conflict, NotFound, ServiceError
from .fields import max_length

KEY_PREFIX = "syk"
PREFIX_LENGTH = 8


def key_snapshot(key: ClientKey) -> dict[str, Any]:
    return {
        "name": key.name,
        "prefix": key.prefix,
        "debug": key.can_debug,
        "revoked": key.revoked_at is not None,
    }


@transaction.atomic
def create_client_key(
    actor: Actor, cluster_id: int, *, name: str, debug: bool = False, reason: str = ""
) -> tuple[str, ClientKey]:
    """Create a key; return its plaintext (never stored) and the row."""
    cluster = locked_cluster(cluster_id)
    name = (name or "").strip()
    if not name or len(name) > max_length(ClientKey, "name"):
        raise ServiceError("name must be 1-64 characters", "name")
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    plaintext = f"{KEY_PREFIX}_{prefix}_{new_secret()}"
    try:
        with transaction.atomic():
            key = ClientKey.objects.create(
                cluster=cluster,
                name=name,
                prefix=prefix,
                key_hash=sha256_hex(plaintext),
                can_debug=bool(debug),
                created_by=actor.name,
            )
    except IntegrityError:
        raise Conflict(f"{cluster.name} already has an active key named {name!r}", "name") from None
    version = config.publish(cluster, actor, reason or f"client key {name!r} created")
    audit.record(
        actor,
        "client_key.create",
        key,
        after=_with_version(key, version),
        reason=reason or f"client key {name!r} ({'debug' if debug else 'plain'})",
        cluster=cluster,
    )
    return plaintext, key


@transaction.atomic
def revoke_client_key(actor: Actor, cluster_id: int, key_id: int, *, reason: str = "") -> ClientKey:
    cluster = locked_cluster(cluster_id)
    try:
        key = ClientKey.objects.select_for_update().get(pk=key_id, cluster=cluster)
    except ClientKey.DoesNotExist:
        raise NotFound(f"client key {key_id} does not exist on {cluster.name}") from None
    if key.revoked_at is not None:
        raise Conflict(f"client key {key.name!r} is already revoked")
    before = key_snapshot(key)
    key.revoked_at, key.revoked_by = timezone.now(), actor.name
    key.save(update_fields=["revoked_at", "revoked_by"])
    version = config.publish(cluster, actor, reason or f"client key {key.name!r} revoked")
    audit.record(
        actor,
        "client_key.revoke",
        key,
        before=before,
        after=_with_version(key, version),
        reason=reason or f"client key {key.name!r} revoked",
        cluster=cluster,
    )
    return key


@transaction.atomic
def set_client_keys_required(
    actor: Actor, cluster_id: int, required: bool, *, reason: str
) -> Cluster:
    """Switch whether the cluster's routers refuse requests without a valid key."""
    reason = audit.require_reason(reason)
    cluster = locked_cluster(cluster_id)
    if cluster.client_keys_required == required:
        raise Conflict(
            f"client keys are already {'required' if required else 'optional'} on {cluster.name}",
            "required",
        )
    cluster.client_keys_required = required
    cluster.save(update_fields=["client_keys_required"])
    version = config.publish(cluster, actor, reason)
    audit.record(
        actor,
        "cluster.client_keys_required",
        cluster,
        before={"client_keys_required": not required},
        after={
            "client_keys_required": required,
            "config_version": version.number if version else None,
        },
        reason=reason,
        cluster=cluster,
    )
    return cluster


def _with_version(key: ClientKey, version: ConfigVersion | None) -> dict[str, Any]:
    return {**key_snapshot(key), "config_version": version.number if version else None}
