"""Writes made on behalf of a host's router supervisor (a system actor, not an operator)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.models import RouterDeployment, RouterEvent
from router_worker.contract.telemetry import EventRecord

from .bearer import new_router_token, sha256_hex


@transaction.atomic
def issue_router_token(router_id: int) -> str:
    """Rotate the router's token and return the plaintext for the process being started.
    The supervisor owns the secret: only its hash is stored, and it reaches the router
    through the environment, never the command line (which `ps` shows to everyone)."""
    plaintext = new_router_token()
    RouterDeployment.objects.filter(pk=router_id).update(token_hash=sha256_hex(plaintext))
    return plaintext


@transaction.atomic
def record_router_exit(router_id: int, *, exit_code: int | None, restarting: bool) -> RouterEvent:
    router = RouterDeployment.objects.select_related("cluster").get(pk=router_id)
    if restarting:
        RouterDeployment.objects.filter(pk=router_id).update(restarts=F("restarts") + 1)
        router.refresh_from_db(fields=["restarts"])
    event = EventRecord.new(
        router.cluster.name,
        router.name,
        "router_restarted",
        timezone.now().timestamp(),
        exit_code=exit_code,
        restarts=router.restarts,
        restarting=restarting,
    )
    return RouterEvent.objects.create(
        event_id=event.id,
        cluster=router.cluster,
        router=router.name,
        at=timezone.now(),
        kind=event.kind,
        payload=event.payload,
    )
