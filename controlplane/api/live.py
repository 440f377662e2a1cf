"""What the live view shows, from the routers' Redis records: the cluster's merged live
state (per instance and per router) and its sampled routing decisions, as a page of the
decision stream that a client polls with a cursor."""

from typing import Any

import redis
from django.http import HttpRequest
from ninja import Query, Router
from ninja.errors import HttpError

from controlplane.realtime.state import decisions_since, read_cluster
from controlplane.selectors import clusters as cluster_selectors
from controlplane.services import notify

from .schemas import DecisionFilters, DecisionPageOut, Id

routes = Router(tags=["live"])
UNREACHABLE = "Redis is unreachable; the routers' live records cannot be read"


@routes.get("/clusters/{cluster_id}/live", response=dict[str, Any])
def live_state(request: HttpRequest, cluster_id: Id):
    """The live view's state, the routers' snapshots merged (each field by its rule,
    controlplane/realtime/snapshot.py): per instance its health, pending prefill tokens,
    batch size, in flight, waiting and running, KV usage, hit ratio, preemptions, hotspot
    and arm; the cluster's last window (TTFT/TPOT percentiles, rates, hit ratio, load CV),
    its hotspots, each router's config version and policy, and per tenant its lane
    (admitted, queued, refused, share of tokens served against its weight's share, TTFT).
    Routers' snapshots expire 10 s after their last write."""
    cluster = cluster_selectors.cluster(cluster_id)
    try:
        with notify.redis_client() as client:
            return read_cluster(client, cluster.name, cluster.pk)
    except redis.RedisError as error:
        raise HttpError(503, UNREACHABLE) from error


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
        raise HttpError(503, UNREACHABLE) from error
    return {"decisions": decisions, "cursor": cursor}
