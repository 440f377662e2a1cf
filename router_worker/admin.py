"""Token-protected admin endpoints and the router's own /metrics, plus its open /health.

* ``GET /admin/state``: indicator snapshot per instance, health and breaker state, KV
  subscriber stats, replica-sync (peer routers) stats, telemetry status and the most
  recent routing decisions.
* ``GET /admin/config``: the applied configuration document.
* ``POST /admin/config``: apply a configuration document (``RouterConfig`` JSON, or
  ``{"version": N, "document": {...}}``); 400 naming the field when invalid, 409 when
  older than the applied version; the old configuration stays in force either way.
* ``POST /admin/instances/{name}/drain`` and ``/undrain``: stop (resume) sending new
  requests to an instance; in-flight ones finish.

Every ``/admin`` call, and ``/metrics`` (it tells who is sending what, how much, and
where: not for the clients sharing the port), needs ``Authorization: Bearer <token>`` (or
``X-Admin-Token``) matching ``--admin-token`` / ``SWITCHYARD_ROUTER_ADMIN_TOKEN``; with no
token configured they are disabled (401). Prometheus sends the token with
``authorization: {credentials: ...}`` in its scrape config.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router_worker.errors import error_dict
from router_worker.service import ConfigRefused, Service

RECENT_SHOWN = 50


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_dict(status, message, param), status_code=status)


def _authorised(request: Request, token: str | None) -> bool:
    if not token:
        return False
    given = request.headers.get("x-admin-token", "")
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    return hmac.compare_digest(given.encode(), token.encode())


def build_admin_app(service: Service, lifespan: Any = None) -> Starlette:
    token = service.options.admin_token

    def guarded(handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            if not _authorised(request, token):
                return _error(401, "A valid admin token is required.")
            return await handler(request)

        return endpoint

    async def health(request: Request) -> Response:
        runtime = service.core.runtime
        ready = runtime is not None
        return JSONResponse(
            {
                "status": "ok" if ready else "no_config",
                "config_version": runtime.version if runtime else None,
            },
            status_code=200 if ready else 503,
        )

    async def metrics(request: Request) -> Response:
        return Response(
            service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def state(request: Request) -> Response:
        return JSONResponse(admin_state(service))

    async def get_config(request: Request) -> Response:
        runtime = service.core.runtime
        if runtime is None:
            return _error(404, "No configuration applied yet.")
        return JSONResponse(runtime.config.model_dump(mode="json"))

    async def post_config(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Invalid JSON body.")
        if not isinstance(body, dict):
            return _error(400, "The configuration must be a JSON object.")
        version = body.get("version") if "document" in body else None
        document = body.get("document", body)
        if not isinstance(document, dict):
            return _error(400, "document must be a JSON object.", "document")
        try:
            config = service.apply_document(document, version, source="admin")
        except ConfigRefused as error:
            return _error(error.status, str(error))
        return JSONResponse({"applied_version": config.version})

    def drain_handler(drain: bool) -> Any:
        async def handler(request: Request) -> Response:
            name = request.path_params["name"]
            if name not in service.core.health.instances:
                return _error(404, f"Unknown instance {name!r}.", "name")
            service.core.health.set_drain(name, drain)
            return JSONResponse({"instance": name, "health": service.core.health.effective(name)})

        return handler

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
        Route("/admin/state", guarded(state), methods=["GET"]),
        Route("/admin/config", guarded(get_config), methods=["GET"]),
        Route("/admin/config", guarded(post_config), methods=["POST"]),
        Route("/admin/instances/{name}/drain", guarded(drain_handler(True)), methods=["POST"]),
        Route("/admin/instances/{name}/undrain", guarded(drain_handler(False)), methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def admin_state(service: Service) -> dict[str, Any]:
    core = service.core
    snapshot = service.telemetry.state_snapshot(time.time())
    breakers = {
        name: {
            "breaker": h.breaker,
            "failures": h.failures,
            "admin_drain": h.admin_drain,
            "config_state": h.config_state,
            "last_error": h.last_error,
        }
        for name, h in core.health.instances.items()
    }
    return {
        "router": service.options.name,
        "snapshot": snapshot.model_dump(mode="json"),
        "breakers": breakers,
        "kv_events": service.kv.stats(),
        "peers": service.peers.stats(time.time()),
        "limiter": {"active": service.limiter.active, "queued": service.limiter.queued},
        "telemetry": {
            "redis": service.telemetry.connected,
            "buffered_events": service.telemetry.buffered_events,
            "dropped_total": service.telemetry.dropped_total,
            "decisions": {
                "kept": core.sampler.kept,
                "skipped": core.sampler.skipped,
                "dropped": service.telemetry.decisions_dropped,
            },
        },
        "recent_decisions": core.recent_decisions(RECENT_SHOWN),
        "recent_events": list(service.telemetry.recent_events)[-RECENT_SHOWN:],
    }
