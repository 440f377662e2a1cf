"""API tokens for scripts: `sy_<prefix>_<secret>`, shown once, stored as a sha256 hash."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from controlplane.models import ApiToken

from . import audit
from .audit import Actor
from .bearer import new_secret, sha256_hex
from .errors import ServiceError

TOKEN_PREFIX = "sy"
PREFIX_LENGTH = 8


def token_snapshot(token: ApiToken) -> dict:
    return {"user": token.user.get_username(), "name": token.name, "prefix": token.prefix,
            "revoked": token.revoked}


@transaction.atomic
def create_api_token(actor: Actor, user: AbstractBaseUser, name: str) -> tuple[str, ApiToken]:
    """Create a token for `user`; return its plaintext (never stored) and the row."""
    name = (name or "").strip()
    if not name or len(name) > ApiToken._meta.get_field("name").max_length:
        raise ServiceError("name must be 1-64 characters", "name")
    prefix = secrets.token_hex(PREFIX_LENGTH // 2)
    plaintext = f"{TOKEN_PREFIX}_{prefix}_{new_secret()}"
    token = ApiToken.objects.create(user=user, name=name, prefix=prefix,
                                    token_hash=sha256_hex(plaintext))
    audit.record(actor, "api_token.create", token, after=token_snapshot(token),
                 reason=f"API token {name!r} for {user.get_username()}")
    return plaintext, token


def user_for_api_token(plaintext: str) -> AbstractBaseUser | None:
    """The active user a valid, unrevoked token belongs to; marks the token as used."""
    if not plaintext.startswith(f"{TOKEN_PREFIX}_"):
        return None
    token = (ApiToken.objects.select_related("user")
             .filter(token_hash=sha256_hex(plaintext), revoked=False).first())
    if token is None or not token.user.is_active:
        return None
    # Usage bookkeeping, not a change of state: no audit row.
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


def user_named(username: str) -> AbstractBaseUser:
    try:
        return get_user_model().objects.get(username=username)
    except get_user_model().DoesNotExist:
        raise ServiceError(f"no user named {username!r}", "user") from None
