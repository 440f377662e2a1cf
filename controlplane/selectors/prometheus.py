"""The control plane's Prometheus metrics: what Postgres knows that the routers do not,
read at scrape time (``GET /api/v1/metrics``); the families themselves, and what the alert
rules may reference, are in controlplane/metric_families.py."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from controlplane.metric_families import families
from controlplane.models import CanarySplit, ReplayJob

from .captures import FIDELITY_METRICS


class ControlPlaneCollector(Collector):
    def describe(self) -> Iterator[Metric]:
        yield from families()

    def collect(self) -> Iterator[Metric]:
        rollbacks, drift, canaries = families()
        rows = CanarySplit.objects.values("cluster__name", "state").annotate(n=Count("id"))
        for row in rows.order_by("cluster__name", "state"):
            canaries.add_metric([row["cluster__name"], row["state"]], row["n"])
            if row["state"] == CanarySplit.State.ROLLED_BACK:
                rollbacks.add_metric([row["cluster__name"]], row["n"])
        for cluster, metrics in latest_fidelity():
            for metric in metrics:
                if metric.get("metric") in FIDELITY_METRICS and metric.get("diff") is not None:
                    drift.add_metric([cluster, metric["metric"]], float(metric["diff"]))
        yield from (rollbacks, drift, canaries)


def latest_fidelity() -> Iterator[tuple[str, list[dict]]]:
    """Per cluster, the fidelity rows of its newest finished replay that has them."""
    jobs = (
        ReplayJob.objects.filter(
            state=ReplayJob.State.SUCCEEDED, results__fidelity__metrics__isnull=False
        )
        .select_related("cluster")
        .order_by("cluster_id", "-finished_at", "-id")
        .distinct("cluster_id")
    )
    for job in jobs:
        metrics = (job.results or {}).get("fidelity", {}).get("metrics") or []
        yield job.cluster.name, [m for m in metrics if isinstance(m, dict)]


def registry() -> CollectorRegistry:
    found = CollectorRegistry(auto_describe=True)
    found.register(ControlPlaneCollector())
    return found


def exposition() -> bytes:
    return generate_latest(registry())
