"""Roles: viewer (read), operator (policies, canaries, drain, replays), admin (users,
clusters, instances). Each role includes the ones before it; a superuser is an admin."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User

ROLES: tuple[str, ...] = ("viewer", "operator", "admin")


def role_of(user: User | AnonymousUser | None) -> str | None:
    """The highest role the user holds, or None (no access at all)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return "admin"
    groups = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    held = [role for role in ROLES if role in groups]
    return held[-1] if held else None


def has_role(user: User | AnonymousUser | None, minimum: str) -> bool:
    """Whether the user's role is `minimum` or a higher one."""
    if minimum not in ROLES:
        raise ValueError(f"unknown role {minimum!r}; known: {ROLES}")
    role = role_of(user)
    return role is not None and ROLES.index(role) >= ROLES.index(minimum)
