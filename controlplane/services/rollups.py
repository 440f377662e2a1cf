"""Per-minute rollups of router request metrics, per canary arm and per instance."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from controlplane.models import (
    ArmMetricRollup,
    Cluster,
    HotspotEvent,
    IngestedRecord,
    InstanceMetricRollup,
    RouterEvent,
)
from engine_interface import percentile
from router_worker.contract.telemetry import MetricsRecord

MAX_SAMPLES_PER_MINUTE = 2000


def minute_of(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=UTC).replace(second=0, microsecond=0)


def merge_samples(existing: list[float], new: list[float], rng: random.Random) -> list[float]:
    merged = existing + new
    if len(merged) <= MAX_SAMPLES_PER_MINUTE:
        return merged
    return rng.sample(merged, MAX_SAMPLES_PER_MINUTE)


def _add_common(row, metrics, rng: random.Random) -> None:
    row.requests += metrics.requests
    row.errors += metrics.errors
    row.output_tokens += metrics.output_tokens
    row.ttft_samples = merge_samples(row.ttft_samples, metrics.ttft_s, rng)
    row.tpot_samples = merge_samples(row.tpot_samples, metrics.tpot_s, rng)
    row.ttft_p50_s, row.ttft_p99_s = (percentile(row.ttft_samples, q) for q in (50, 99))
    row.tpot_p50_s, row.tpot_p99_s = (percentile(row.tpot_samples, q) for q in (50, 99))


def fold(cluster: Cluster, record: MetricsRecord) -> None:
    """Add one router metrics record into the rollup rows of its minute."""
    minute = minute_of(record.start)
    rng = random.Random(record.id)
    for arm, metrics in record.arms.items():
        row, _ = ArmMetricRollup.objects.select_for_update().get_or_create(
            cluster=cluster, arm=arm, minute=minute
        )
        _add_common(row, metrics, rng)
        row.hotspot_fallbacks += metrics.hotspot_fallbacks
        row.save()
    for name, instance in record.instances.items():
        instance_row, _ = InstanceMetricRollup.objects.select_for_update().get_or_create(
            cluster=cluster, instance=name, minute=minute
        )
        _add_common(instance_row, instance, rng)
        instance_row.pending_prefill_tokens_max = max(
            instance_row.pending_prefill_tokens_max, int(instance.pending_prefill_tokens_max)
        )
        instance_row.batch_size_max = max(instance_row.batch_size_max, int(instance.batch_size_max))
        instance_row.kv_usage_max = max(instance_row.kv_usage_max, instance.kv_usage_max)
        instance_row.save()


def prune(retention_days: int = 7) -> dict[str, int]:
    """Delete rollups, router events and ingest markers older than the retention period.
    Hotspot events are an audit trail and are kept twice as long."""
    cutoff = timezone.now() - timedelta(days=retention_days)
    deleted = {
        "arm_rollups": ArmMetricRollup.objects.filter(minute__lt=cutoff).delete()[0],
        "instance_rollups": InstanceMetricRollup.objects.filter(minute__lt=cutoff).delete()[0],
        "router_events": RouterEvent.objects.filter(at__lt=cutoff).delete()[0],
        "ingested_records": IngestedRecord.objects.filter(at__lt=cutoff).delete()[0],
        "hotspot_events": HotspotEvent.objects.filter(
            at__lt=cutoff - timedelta(days=retention_days)
        ).delete()[0],
    }
    return deleted
