"""Control-plane state in Postgres. Writes go through controlplane.services only."""

from .access import ClientKey
from .audit import ApiToken, AuditEvent
from .capture import CapturedRequest, TrafficCapture
from .cluster import Cluster, Instance, Policy
from .events import HotspotEvent, IngestedRecord, RouterEvent
from .metrics import ArmMetricRollup, InstanceMetricRollup
from .replay import ReplayCell, ReplayJob
from .rollout import CanaryJudgement, CanarySplit
from .routing import ConfigVersion, RouterDeployment
from .tenant import Tenant

__all__ = [
    "ApiToken",
    "ArmMetricRollup",
    "AuditEvent",
    "CanaryJudgement",
    "CanarySplit",
    "CapturedRequest",
    "ClientKey",
    "Cluster",
    "ConfigVersion",
    "HotspotEvent",
    "IngestedRecord",
    "Instance",
    "InstanceMetricRollup",
    "Policy",
    "ReplayCell",
    "ReplayJob",
    "RouterDeployment",
    "RouterEvent",
    "Tenant",
    "TrafficCapture",
]
