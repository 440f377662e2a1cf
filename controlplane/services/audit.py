"""The audit trail: every service that changes state records exactly one AuditEvent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db import models

from controlplane.models import AuditEvent, Cluster

from .errors import ServiceError

REQUEST_ID_CHARS = AuditEvent._meta.get_field("request_id").max_length


@dataclass(frozen=True)
class Actor:
    """Who is making a change: a user (browser or API token) or a system component."""

    name: str
    user: User | AnonymousUser | None = None
    request_id: str = ""

    @classmethod
    def of(cls, user: User | AnonymousUser, request_id: str = "") -> Actor:
        """A user's change; a client-sent request id is cut to what the audit row holds."""
        return cls(name=user.get_username(), user=user, request_id=request_id[:REQUEST_ID_CHARS])

    @property
    def account(self) -> User | None:
        """The stored user making the change: None for a system component (or no one)."""
        return self.user if isinstance(self.user, User) and self.user.pk else None

    @classmethod
    def system(cls, component: str) -> Actor:
        return cls(name=f"system:{component}")


def require_reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("a reason is required for changes that affect routing", field="reason")
    return reason


def record(
    actor: Actor,
    action: str,
    target: models.Model,
    *,
    before: Any = None,
    after: Any = None,
    reason: str = "",
    cluster: Cluster | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=actor.account,
        actor_name=actor.name,
        request_id=actor.request_id,
        action=action,
        target_type=type(target).__name__.lower(),
        target_id=str(target.pk),
        cluster=cluster,
        before=before,
        after=after,
        reason=reason,
    )
