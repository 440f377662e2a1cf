"""The NinjaAPI: every resource router, viewer access by default, JSON errors."""

from __future__ import annotations

from ninja import NinjaAPI

from . import (
    access,
    canaries,
    captures,
    clusters,
    config_versions,
    events,
    live,
    metrics,
    policies,
    prometheus,
    replays,
    router_deployments,
    tenants,
)
from .auth import role
from .errors import install_error_handlers

api = NinjaAPI(
    title="Switchyard control plane",
    version="1",
    description="Clusters, instances, policies, canaries, config versions, routers, events. "
    "Authenticate with a browser session (plus X-CSRFToken for writes) or "
    "`Authorization: Bearer <API token>`. Roles: viewer < operator < admin.",
    urls_namespace="api",
    docs_url="/docs",
    auth=role("viewer"),
)
install_error_handlers(api)

for module in (
    clusters,
    policies,
    canaries,
    config_versions,
    router_deployments,
    events,
    live,
    metrics,
    replays,
    captures,
    access,
    prometheus,
    tenants,
):
    api.add_router("", module.routes)
