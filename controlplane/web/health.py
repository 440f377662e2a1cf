from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from controlplane.services.health import probe_dependencies


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when Postgres and Redis answer; 503 naming each one that does not."""
    health = probe_dependencies()
    down = health.down
    body = {"status": "ok" if not down else "degraded", **health.as_dict()}
    if down:
        body["message"] = f"{' and '.join(down)} unreachable"
    return JsonResponse(body, status=503 if down else 200)
