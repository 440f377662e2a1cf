"""Router deployments: created by an admin with a one-time token; heartbeats record what
each router has applied (heartbeats are observations, not changes: no audit row)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.models import RouterDeployment
from controlplane.models.cluster import slug_name

from . import audit
from .audit import Actor
from .bearer import new_router_token, same_hash, sha256_hex
from .clusters import _full_clean, locked_cluster
from .config import latest_version
from .errors import Conflict, ServiceError

MAX_PORT = 65535


def router_snapshot(router: RouterDeployment) -> dict[str, Any]:
    return {
        "name": router.name,
        "host": router.host,
        "port": router.port,
        "desired_state": router.desired_state,
    }


@transaction.atomic
def create_router_deployment(
    actor: Actor, cluster_id: int, *, name: str, host: str, port: int, reason: str = ""
) -> tuple[str, RouterDeployment]:
    """Create a deployment; return its router token (shown once) and the row."""
    cluster = locked_cluster(cluster_id)
    if not 1 <= port <= MAX_PORT:
        raise ServiceError(f"port must be in 1..{MAX_PORT}", "port")
    plaintext = new_router_token()
    router = RouterDeployment(
        cluster=cluster, name=name, host=host, port=port, token_hash=sha256_hex(plaintext)
    )
    _full_clean(router, ("name", "host"))
    _require_slug(router)
    try:
        with transaction.atomic():
            router.save()
    except IntegrityError:
        raise Conflict(
            f"a router named {name!r} in {cluster.name} or on {host}:{port} already exists", "name"
        ) from None
    audit.record(
        actor,
        "router.create",
        router,
        after=router_snapshot(router),
        reason=reason,
        cluster=cluster,
    )
    return plaintext, router


def _require_slug(router: RouterDeployment) -> None:
    try:
        slug_name(router.name)
    except DjangoValidationError as error:
        raise ServiceError(f"name: {error.messages[0]}", "name") from None


def router_for_token(router_id: int, plaintext: str) -> RouterDeployment | None:
    """The deployment `router_id` if `plaintext` is its token, else None."""
    router = RouterDeployment.objects.select_related("cluster").filter(pk=router_id).first()
    if router is None or not same_hash(plaintext, router.token_hash):
        return None
    return router


def record_heartbeat(
    router: RouterDeployment, *, applied_version: int | None, state: dict[str, Any]
) -> RouterDeployment:
    latest = latest_version(router.cluster)
    newest = latest.number if latest else 0
    if applied_version is not None and not 0 <= applied_version <= newest:
        raise ServiceError(
            f"applied_version {applied_version} does not exist (latest is {newest})",
            "applied_version",
        )
    router.applied_version = applied_version
    router.heartbeat = state
    router.last_heartbeat = timezone.now()
    router.save(update_fields=["applied_version", "heartbeat", "last_heartbeat"])
    return router
