"""Metrics only under the sending router's own identity: a router's
Redis user may write metrics to its own stream only (tests/drills/test_redis_acl_drill.py),
and ingest files what it reads there under that router alone. One record of 200k samples
filed under a sibling's name made a minute's samples 100% forged, enough to pass a canary:
now it is quarantined and nothing of it is folded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from controlplane.models import ArmMetricRollup, RouterDeployment
from controlplane.services import ingest
from router_worker.contract.telemetry import (
    ArmMetrics,
    MetricsRecord,
    router_metrics_stream,
)

CLUSTER = "ops-test"
OWN = router_metrics_stream(CLUSTER, "r0")
SIBLING = router_metrics_stream(CLUSTER, "r1")


@pytest.fixture
def streams(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    keys = (OWN, SIBLING, ingest.QUARANTINE_STREAM, ingest.QUARANTINE_COUNTS)
    redis_client.delete(*keys)
    yield redis_client
    redis_client.delete(*keys)


def _record(record_id: str, router: str, samples: int) -> dict[str, str]:
    return MetricsRecord(
        id=record_id,
        cluster=CLUSTER,
        router=router,
        start=1_800_000_000.0,
        end=1_800_000_001.0,
        arms={"candidate": ArmMetrics(policy="lmetric", requests=samples, ttft_s=[0.001] * 50)},
    ).to_stream_fields()


def test_a_router_files_metrics_under_its_own_name_only(streams, cluster, cluster_router):
    RouterDeployment.objects.create(cluster=cluster, name="r1", host="ops", port=2)
    streams.xadd(SIBLING, _record("honest", "r1", 5))
    streams.xadd(SIBLING, _record("forged", "r0", 200_000))  # r1 speaking as r0
    streams.xadd(OWN, _record("own", "r0", 3))
    result = ingest.ingest_metrics(streams)
    assert (result.stored, result.quarantined) == (2, 1)
    row = ArmMetricRollup.objects.get(cluster=cluster, arm="candidate")
    assert row.requests == 8  # nothing of the forged record
    [entry] = ingest.quarantine_summary(streams).entries
    assert entry.source == SIBLING and "in router 'r1'" in entry.reason
