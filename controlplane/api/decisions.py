"""The cluster's sampled routing decisions: what the live view's "Routing decisions" shows,
as a page of the decision stream that a client polls with a cursor."""

import redis
from django.http import HttpRequest
from ninja import Query, Router
from ninja.errors import HttpError

from controlplane.realtime.state import decisions_since
from controlplane.selectors import clusters as cluster_selectors
from controlplane.services import notify

from .schemas import DecisionFilters, DecisionPageOut, Id

routes = Router(tags=["decisions"])


@routes.get("/clusters/{cluster_id}/decisions", response=DecisionPageOut)
def list_decisions(request: HttpRequest, cluster_id: Id, filters: Query[DecisionFilters]):
    """Newest first. Routers sample a few decisions a second each and always keep fallbacks,
    hotspot-class decisions, retries and failures; the stream is capped and kept an hour
    after its last write."""
    cluster = cluster_selectors.cluster(cluster_id)
    try:
        with notify.redis_client() as client:
            decisions, cursor = decisions_since(client, cluster.name, filters.after, filters.limit)
    except redis.RedisError as error:
        raise HttpError(503, "Redis is unreachable; the decision stream cannot be read") from error
    return {"decisions": decisions, "cursor": cursor}
