"""The selectors the web views read through, in one namespace."""

from controlplane.selectors.canaries import (
    canaries,
    canary,
    canary_audit,
    canary_with_policies,
    judgements,
    timeline,
)
from controlplane.selectors.clusters import cluster, clusters, instances, policies
from controlplane.selectors.events import audit_events, hotspot_events
from controlplane.selectors.metrics import arm_rollups
from controlplane.selectors.replays import replay, replays
from controlplane.selectors.router_deployments import routers

__all__ = [
    "arm_rollups",
    "audit_events",
    "canaries",
    "canary",
    "canary_audit",
    "canary_with_policies",
    "cluster",
    "clusters",
    "hotspot_events",
    "instances",
    "judgements",
    "policies",
    "replay",
    "replays",
    "routers",
    "timeline",
]
