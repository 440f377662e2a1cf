"""The control plane's Prometheus metrics: what Postgres knows that the routers do not,
read at scrape time (``GET /api/v1/metrics``). ``describe`` names every family without a
query, so the generated alert rules and dashboard (scripts/observability.py) can check
what they reference."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.models import CanarySplit, ReplayJob

from .captures import FIDELITY_METRICS

ROLLBACKS = "switchyard_canary_rollbacks"
DRIFT = "switchyard_replay_fidelity_drift_ratio"
CANARIES = "switchyard_canaries"


class ControlPlaneCollector(Collector):
    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        rollbacks, drift, canaries = self._families()
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

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            CounterMetricFamily(
                ROLLBACKS,
                "Canaries rolled back (by the judge or an operator), per cluster.",
                labels=["cluster"],
            ),
            GaugeMetricFamily(
                DRIFT,
                "The latest replay of captured traffic against what the routers measured "
                "live for the same requests: (replay - live) / live, per cluster and metric "
                f"({', '.join(FIDELITY_METRICS)}).",
                labels=["cluster", "metric"],
            ),
            GaugeMetricFamily(
                CANARIES, "Canaries per cluster and state.", labels=["cluster", "state"]
            ),
        )


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
