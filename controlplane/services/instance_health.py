"""Active health checks and /metrics scraping of engine instances (observed state).

Observations are not changes: they update Instance.healthy/last_scrape without an audit
row. The routers do their own, faster checks; this view is for the control plane's UI.
The scrape is read as the routers read it (``engine_interface``): engines'
counts summed, KV usage the mean of the engines' fractions.
"""

from __future__ import annotations

import httpx
from django.utils import timezone

from controlplane.models import Cluster, Instance
from engine_interface import parse_metrics

TIMEOUT = httpx.Timeout(1.0)


def scrape_instance(client: httpx.Client, instance: Instance) -> tuple[bool, dict]:
    try:
        healthy = client.get(f"{instance.url}/health").status_code == 200
        metrics = client.get(f"{instance.url}/metrics")
        parsed = (
            parse_metrics(metrics.text, histograms=False).summary()
            if metrics.status_code == 200
            else {}
        )
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
