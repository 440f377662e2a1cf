"""The control plane's Prometheus metrics (controlplane/selectors/prometheus.py): scraped
with an API token of a viewer, `Authorization: Bearer <token>`."""

from django.http import HttpRequest, HttpResponse
from ninja import Router
from prometheus_client import CONTENT_TYPE_LATEST

from controlplane.selectors import prometheus

routes = Router(tags=["metrics"])


@routes.get("/metrics", response={200: str}, openapi_extra={"responses": {200: {
    "description": "Prometheus text exposition",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}}})  # fmt: skip
def metrics(request: HttpRequest) -> HttpResponse:
    """Canary rollbacks and canaries per state, and each cluster's replay drift (its newest
    replay of captured traffic against the live measurements of the same requests)."""
    return HttpResponse(prometheus.exposition(), content_type=CONTENT_TYPE_LATEST)
