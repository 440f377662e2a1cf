"""Access credentials: API tokens for scripts (each user's own; an admin sees and revokes
everyone's) and client API keys for a cluster's routers (admins create and revoke them and
switch whether they are required). Secrets are in the answer to a create, and never again."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status

from controlplane.models import ApiToken, ClientKey
from controlplane.selectors import access as access_selectors
from controlplane.selectors import clusters as cluster_selectors
from controlplane.services import client_keys as key_services
from controlplane.services import tokens as token_services

from .auth import actor_of, auth_user, role
from .schemas import Id, Name, Reason

routes = Router(tags=["access"])


class TokenIn(Schema):
    name: Name
    valid_days: int = Field(
        default=token_services.DEFAULT_VALID_DAYS,
        ge=1,
        le=token_services.MAX_VALID_DAYS,
        description="Days until the token is refused.",
    )
    reason: Reason = ""


class TokenOut(Schema):
    id: int
    user: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked: bool
    revoked_at: datetime | None


class TokenCreatedOut(Schema):
    token: TokenOut
    secret: str = Field(description="The token itself. Shown only this once.")


class ClientKeyIn(Schema):
    name: Name
    debug: bool = Field(default=False, description="The router honours x-switchyard-debug.")
    reason: Reason = ""


class ClientKeyOut(Schema):
    id: int
    cluster_id: int
    name: str
    prefix: str
    debug: bool
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str
    tenant: str | None = Field(description="Its tenant's name; null: the default tenant.")


class ClientKeyCreatedOut(Schema):
    key: ClientKeyOut
    secret: str = Field(
        description="The key itself, for `Authorization: Bearer`. Shown only this once."
    )


class RevokeIn(Schema):
    reason: Reason = ""


class ClientAuthIn(Schema):
    required: bool
    reason: Reason


class ClientAuthOut(Schema):
    cluster_id: int
    required: bool
    active_keys: int


def token_out(token: ApiToken) -> dict:
    return {
        **{
            f: getattr(token, f)
            for f in (
                "id",
                "name",
                "prefix",
                "created_at",
                "expires_at",
                "last_used_at",
                "revoked",
                "revoked_at",
            )
        },
        "user": token.user.get_username(),
    }


def key_out(key: ClientKey) -> dict:
    return {
        **{
            f: getattr(key, f)
            for f in (
                "id",
                "cluster_id",
                "name",
                "prefix",
                "created_at",
                "created_by",
                "revoked_at",
                "revoked_by",
            )
        },
        "debug": key.can_debug,
        "tenant": key.tenant.name if key.tenant else None,
    }


@routes.get("/tokens", response=list[TokenOut])
def list_tokens(request: HttpRequest):
    """Your API tokens (an admin sees everyone's)."""
    return [token_out(t) for t in token_services.visible_tokens(auth_user(request))]


@routes.post("/tokens", response={201: TokenCreatedOut})
def create_token(request: HttpRequest, payload: TokenIn):
    """A token acting as you, with your role."""
    secret, token = token_services.create_api_token(
        actor_of(request), auth_user(request), payload.name, payload.valid_days, payload.reason
    )
    return Status(201, {"token": token_out(token), "secret": secret})


@routes.post("/tokens/{token_id}/revoke", response=TokenOut)
def revoke_token(request: HttpRequest, token_id: Id, payload: RevokeIn):
    """Revoke one of your tokens (an admin: anyone's). It is refused from now on. The body
    is a JSON object, `{}` or `{"reason": "..."}`."""
    return token_out(token_services.revoke_api_token(actor_of(request), token_id, payload.reason))


@routes.get("/clusters/{cluster_id}/client-keys", response=list[ClientKeyOut])
def list_client_keys(request: HttpRequest, cluster_id: Id):
    return [key_out(k) for k in access_selectors.client_keys(cluster_id)]


@routes.post(
    "/clusters/{cluster_id}/client-keys", response={201: ClientKeyCreatedOut}, auth=role("admin")
)
def create_client_key(request: HttpRequest, cluster_id: Id, payload: ClientKeyIn):
    secret, key = key_services.create_client_key(actor_of(request), cluster_id, **payload.dict())
    return Status(201, {"key": key_out(key), "secret": secret})


@routes.post(
    "/clusters/{cluster_id}/client-keys/{key_id}/revoke", response=ClientKeyOut, auth=role("admin")
)
def revoke_client_key(request: HttpRequest, cluster_id: Id, key_id: Id, payload: RevokeIn):
    """Routers refuse the key from their next config version on. The body is a JSON
    object, `{}` or `{"reason": "..."}`."""
    return key_out(
        key_services.revoke_client_key(actor_of(request), cluster_id, key_id, reason=payload.reason)
    )


@routes.get("/clusters/{cluster_id}/client-auth", response=ClientAuthOut)
def get_client_auth(request: HttpRequest, cluster_id: Id):
    return _client_auth_out(cluster_id)


@routes.put("/clusters/{cluster_id}/client-auth", response=ClientAuthOut, auth=role("admin"))
def set_client_auth(request: HttpRequest, cluster_id: Id, payload: ClientAuthIn):
    """Whether the cluster's routers refuse requests without a valid client key."""
    key_services.set_client_keys_required(
        actor_of(request), cluster_id, payload.required, reason=payload.reason
    )
    return _client_auth_out(cluster_id)


def _client_auth_out(cluster_id: int) -> dict:
    cluster = cluster_selectors.cluster(cluster_id)
    return {
        "cluster_id": cluster.pk,
        "required": cluster.client_keys_required,
        "active_keys": cluster.client_keys.filter(revoked_at=None).count(),
    }
