"""Active health checks and /metrics scraping of engine instances (observed state).

Observations are not changes: they update Instance.healthy/last_scrape without an audit
row. The routers do their own, faster checks; this view is for the control plane's UI.
"""

from __future__ import annotations

import httpx
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.models import Cluster, Instance

TIMEOUT = httpx.Timeout(1.0)
GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
}
COUNTERS = {"vllm:prefix_cache_queries": "prefix_queries", "vllm:prefix_cache_hits": "prefix_hits"}


def parse_vllm_metrics(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            key = GAUGES.get(name) or COUNTERS.get(name)
            if key is not None:
                values[key] = values.get(key, 0.0) + sample.value
    return values


def scrape_instance(client: httpx.Client, instance: Instance) -> tuple[bool, dict]:
    try:
        healthy = client.get(f"{instance.url}/health").status_code == 200
        metrics = client.get(f"{instance.url}/metrics")
        parsed = parse_vllm_metrics(metrics.text) if metrics.status_code == 200 else {}
    except (httpx.HTTPError, ValueError) as error:
        return False, {"error": f"{type(error).__name__}: {error}"}
    return healthy, parsed


def scrape_cluster(cluster: Cluster) -> dict[str, bool]:
    results: dict[str, bool] = {}
    with httpx.Client(timeout=TIMEOUT) as client:
        for instance in cluster.instances.all():
            healthy, scraped = scrape_instance(client, instance)
            instance.healthy = healthy
            instance.last_scrape = scraped
            if healthy:
                instance.last_seen_at = timezone.now()
            instance.save(update_fields=["healthy", "last_scrape", "last_seen_at"])
            results[instance.name] = healthy
    return results
