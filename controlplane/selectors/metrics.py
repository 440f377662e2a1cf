"""Per-minute metric rollups per canary arm and per instance."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from controlplane.models import ArmMetricRollup, InstanceMetricRollup

from .clusters import cluster
from .common import in_time_range


def arm_rollups(
    cluster_id: int,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    arm: str | None = None,
) -> QuerySet[ArmMetricRollup]:
    queryset = ArmMetricRollup.objects.filter(cluster=cluster(cluster_id))
    queryset = in_time_range(queryset.order_by("-minute", "arm"), "minute", since, until)
    return queryset.filter(arm=arm) if arm else queryset


def instance_rollups(
    cluster_id: int,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    instance: str | None = None,
) -> QuerySet[InstanceMetricRollup]:
    queryset = InstanceMetricRollup.objects.filter(cluster=cluster(cluster_id))
    queryset = in_time_range(queryset.order_by("-minute", "instance"), "minute", since, until)
    return queryset.filter(instance=instance) if instance else queryset
