from __future__ import annotations

from django.db import models


class _Rollup(models.Model):
    """Per-minute aggregates of router request metrics."""

    cluster = models.ForeignKey("controlplane.Cluster", on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField(db_index=True)
    requests = models.IntegerField(default=0)
    errors = models.IntegerField(default=0)
    ttft_p50_s = models.FloatField(null=True)
    ttft_p99_s = models.FloatField(null=True)
    tpot_p50_s = models.FloatField(null=True)
    tpot_p99_s = models.FloatField(null=True)
    output_tokens = models.BigIntegerField(default=0)
    # Raw TTFT/TPOT samples (bounded) for exact per-minute percentiles and rank tests.
    ttft_samples = models.JSONField(default=list)
    tpot_samples = models.JSONField(default=list)

    class Meta:
        abstract = True


class ArmMetricRollup(_Rollup):
    arm = models.CharField(max_length=64)
    hotspot_fallbacks = models.IntegerField(default=0)

    class Meta:
        ordering = ["-minute"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "arm", "minute"], name="arm_rollup_minute")
        ]


class InstanceMetricRollup(_Rollup):
    instance = models.CharField(max_length=64)
    pending_prefill_tokens_max = models.BigIntegerField(default=0)
    batch_size_max = models.IntegerField(default=0)
    kv_usage_max = models.FloatField(default=0)

    class Meta:
        ordering = ["-minute"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "instance", "minute"], name="instance_rollup_minute"
            )
        ]
