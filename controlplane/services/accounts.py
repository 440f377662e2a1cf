"""Audit of account changes made in the Django admin: who granted or took away a role
(group membership), superuser or staff status, or deactivated, created or deleted a user.
Django's admin writes the user itself; this records the change, with before and after."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User

from controlplane.models import AuditEvent

from .audit import Actor, record
from .roles import ROLES, role_of

ADMIN_REASON = "from the Django admin"


def access_of(user: Any) -> dict[str, Any]:
    """What decides a user's access, as stored now."""
    return {
        "role": role_of(user) if user.is_active else None,
        "groups": sorted(user.groups.values_list("name", flat=True)),
        "is_active": user.is_active,
        "is_superuser": user.is_superuser,
        "is_staff": user.is_staff,
    }


def stored_access(user_pk: Any) -> dict[str, Any] | None:
    """The access of the user as the database holds it (None: no such user yet)."""
    user = get_user_model().objects.filter(pk=user_pk).first()
    return None if user is None else access_of(user)


def record_user_change(
    actor: Actor, user: User, before: dict[str, Any] | None
) -> AuditEvent | None:
    """One audit row when the user was created or their access changed; none otherwise."""
    after = access_of(user)
    if before == after:
        return None
    action = "user.create" if before is None else "user.access"
    return record(actor, action, user, before=before, after=after, reason=ADMIN_REASON)


def record_user_deleted(actor: Actor, user: User) -> AuditEvent:
    """Call before the delete (the row's id and access are read from it)."""
    return record(actor, "user.delete", user, before=access_of(user), reason=ADMIN_REASON)


def record_group_change(
    actor: Actor, group: Group, before_name: str | None, deleted: bool = False
) -> AuditEvent | None:
    """A group that is a role renamed, created or deleted changes its members' access."""
    after_name = None if deleted else group.name
    if before_name == after_name or not {before_name, after_name} & set(ROLES):
        return None
    members = sorted(group.user_set.values_list(get_user_model().USERNAME_FIELD, flat=True))
    return record(
        actor,
        "group.delete" if deleted else "group.change",
        group,
        before={"name": before_name, "members": members},
        after=None if deleted else {"name": after_name, "members": members},
        reason=ADMIN_REASON,
    )


def end_session(session: Any) -> None:
    """Delete a session that is logging out now. Django flushes it only after sending
    ``user_logged_out``; the open websockets re-check on that signal
    (``controlplane.realtime.access``) and must find it ended."""
    if session is not None and session.session_key:
        session.delete()
