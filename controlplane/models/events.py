from __future__ import annotations

from django.db import models


class HotspotEvent(models.Model):
    """A transition of LMetric's hotspot detector, with all its numbers (append-only)."""

    event_id = models.CharField(max_length=64, unique=True, help_text="Router-assigned id")
    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="hotspots")
    router = models.CharField(max_length=64, blank=True, default="")
    at = models.DateTimeField(db_index=True)
    transition = models.CharField(max_length=16, db_index=True)  # suspected|confirmed|cleared
    prefix_class = models.CharField(max_length=64, db_index=True)
    prefix_hash = models.CharField(max_length=64)
    x = models.FloatField()
    x_bar = models.FloatField()
    m = models.IntegerField()
    m_bar = models.IntegerField()
    window = models.FloatField()
    instances = models.JSONField(default=list)
    details = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at"]


class RouterEvent(models.Model):
    """Other router events from the Redis stream: health changes, config applied, retries
    exhausted, restarts. Idempotent by the router-assigned event id (append-only)."""

    event_id = models.CharField(max_length=64, unique=True)
    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="events")
    router = models.CharField(max_length=64, blank=True, default="")
    at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=32, db_index=True)
    payload = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at"]


class IngestedRecord(models.Model):
    """Ids of telemetry records already folded into rollups, so re-delivered stream entries
    are not counted twice. Pruned with the rollups' retention."""

    record_id = models.CharField(max_length=64, unique=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)
