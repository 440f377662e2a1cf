"""API tokens for scripts: `sy_<prefix>_<secret>`, shown once, stored as a sha256 hash.
Every token expires (90 days unless asked otherwise, at most a year) and can be revoked by
its owner or an admin."""

from __future__ import annotations

import datetime
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from controlplane.models import ApiToken

from . import audit
from .audit import Actor
from .bearer import new_secret, sha256_hex
from .errors import Conflict, Forbidden, NotFound, ServiceError
from .fields import max_length
from .roles import has_role

TOKEN_PREFIX = "sy"
PREFIX_LENGTH = 8
DEFAULT_VALID_DAYS = 90
MAX_VALID_DAYS = 365


def token_snapshot(token: ApiToken) -> dict:
    return {
        "user": token.user.get_username(),
        "name": token.name,
        "prefix": token.prefix,
        "expires_at": token.expires_at.isoformat(),
        "revoked": token.revoked,
    }


@transaction.atomic
def create_api_token(
    actor: Actor,
    user: User,
    name: str,
    valid_days: int = DEFAULT_VALID_DAYS,
    reason: str = "",
) -> tuple[str, ApiToken]:
    """Create a token for `user`; return its plaintext (never stored) and the row."""
    name = (name or "").strip()
    if not name or len(name) > max_length(ApiToken, "name"):
        raise ServiceError("name must be 1-64 characters", "name")
    if (
        isinstance(valid_days, bool)
        or not isinstance(valid_days, int)
        or not 1 <= valid_days <= MAX_VALID_DAYS
    ):
        raise ServiceError(
            f"valid_days must be a whole number of days, 1-{MAX_VALID_DAYS}", "valid_days"
        )
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    plaintext = f"{TOKEN_PREFIX}_{prefix}_{new_secret()}"
    expires_at = timezone.now() + datetime.timedelta(days=valid_days)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=prefix, token_hash=sha256_hex(plaintext), expires_at=expires_at
    )
    audit.record(
        actor,
        "api_token.create",
        token,
        after=token_snapshot(token),
        reason=reason.strip() or f"API token {name!r} for {user.get_username()}",
    )
    return plaintext, token


def visible_tokens(user: User) -> list[ApiToken]:
    """The tokens a user may see and revoke: their own; an admin's are everyone's."""
    tokens = ApiToken.objects.select_related("user")
    if not has_role(user, "admin"):
        tokens = tokens.filter(user=user)
    return list(tokens)


@transaction.atomic
def revoke_api_token(actor: Actor, token_id: int, reason: str = "") -> ApiToken:
    """Revoke a token of the actor's own, or anyone's when the actor is an admin."""
    token = ApiToken.objects.select_for_update().select_related("user").filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"API token {token_id} does not exist")
    own = actor.user is not None and token.user_id == actor.user.pk
    if not (own or has_role(actor.user, "admin")):
        raise Forbidden("only the token's owner or an admin may revoke it")
    if token.revoked:
        raise Conflict(f"API token {token.name!r} is already revoked")
    before = token_snapshot(token)
    token.revoked, token.revoked_at = True, timezone.now()
    token.save(update_fields=["revoked", "revoked_at"])
    audit.record(
        actor,
        "api_token.revoke",
        token,
        before=before,
        after=token_snapshot(token),
        reason=reason.strip() or f"API token {token.name!r} of {token.user.get_username()} revoked",
    )
    return token


def user_for_api_token(plaintext: str) -> User | None:
    """The active user a valid, unexpired, unrevoked token belongs to; marks it as used."""
    if not plaintext.startswith(f"{TOKEN_PREFIX}_"):
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=sha256_hex(plaintext), revoked=False, expires_at__gt=timezone.now())
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    # Usage bookkeeping, not a change of state: no audit row.
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


def user_named(username: str) -> User:
    try:
        return get_user_model().objects.get(username=username)
    except get_user_model().DoesNotExist:
        raise ServiceError(f"no user named {username!r}", "user") from None
