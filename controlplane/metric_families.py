"""The control plane's Prometheus metric families, empty: their names, types, help and
labels, importable without Django's settings. The scrape fills them
(controlplane/selectors/prometheus.py); the alert rules and dashboard generator
(scripts/observability.py) checks what it references against them."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

ROLLBACKS = "switchyard_canary_rollbacks"
DRIFT = "switchyard_replay_fidelity_drift_ratio"
CANARIES = "switchyard_canaries"


def families() -> tuple[CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    """(rollbacks, drift, canaries), empty."""
    return (
        CounterMetricFamily(
            ROLLBACKS,
            "Canaries rolled back (by the judge or an operator), per cluster.",
            labels=["cluster"],
        ),
        GaugeMetricFamily(
            DRIFT,
            "The newest replay of captured traffic against what the routers measured live "
            "for the same requests: (replay - live) / live, per cluster and metric "
            "(ttft_mean_s, ttft_p99_s, tpot_mean_s, tpot_p99_s).",
            labels=["cluster", "metric"],
        ),
        GaugeMetricFamily(CANARIES, "Canaries per cluster and state.", labels=["cluster", "state"]),
    )
