"""Router deployments: listing (with applied vs current version), creation with a one-time
token, and the two endpoints a router itself calls with that token."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router, Status

from controlplane.selectors import clusters as cluster_selectors
from controlplane.selectors import router_deployments as router_selectors
from controlplane.services import router_deployments as router_services

from .auth import RouterTokenAuth, actor_of, auth_router, role
from .schemas import (
    HeartbeatIn,
    HeartbeatOut,
    Id,
    RouterDeploymentCreatedOut,
    RouterDeploymentIn,
    RouterDeploymentOut,
)

routes = Router(tags=["routers"])


@routes.get("/routers", response=list[RouterDeploymentOut])
def list_routers(request: HttpRequest, cluster: Id | None = None):
    return router_selectors.routers(cluster)


@routes.get("/routers/{router_id}", response=RouterDeploymentOut)
def get_router(request: HttpRequest, router_id: Id):
    return router_selectors.router(router_id)


@routes.post(
    "/clusters/{cluster_id}/routers", response={201: RouterDeploymentCreatedOut}, auth=role("admin")
)
def create_router(request: HttpRequest, cluster_id: Id, payload: RouterDeploymentIn):
    token, created = router_services.create_router_deployment(
        actor_of(request), cluster_id, **payload.dict()
    )
    return Status(201, {"router": router_selectors.router(created.pk), "token": token})


@routes.get(
    "/routers/{router_id}/config",
    auth=RouterTokenAuth(),
    tags=["router agent"],
    response={200: dict, 304: None},
)
def router_config(request: HttpRequest, router_id: Id) -> HttpResponse:
    """The cluster's current ConfigVersion as `{"version": N, "document": {...}}`. Send
    `If-None-Match` with the last ETag to get 304 when nothing changed."""
    version = cluster_selectors.current_config(auth_router(request).cluster)
    etag = f'"v{version.number}"'
    if request.headers.get("If-None-Match") == etag:
        return HttpResponse(status=304, headers={"ETag": etag})
    return JsonResponse(
        {"version": version.number, "document": version.document}, headers={"ETag": etag}
    )


@routes.post(
    "/routers/{router_id}/heartbeat",
    auth=RouterTokenAuth(),
    response=HeartbeatOut,
    tags=["router agent"],
)
def router_heartbeat(request: HttpRequest, router_id: Id, payload: HeartbeatIn):
    router_services.record_heartbeat(
        auth_router(request), applied_version=payload.applied_version, state=payload.state
    )
    fresh = router_selectors.router(router_id)
    current = fresh.current_version  # type: ignore[attr-defined]  # the selector's annotation
    return {
        "applied_version": fresh.applied_version,
        "current_version": current,
        "is_current": current is not None and fresh.applied_version == current,
    }
