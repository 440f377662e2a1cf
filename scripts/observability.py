"""Generate Switchyard's Prometheus alert rules and Grafana dashboard from the metric
definitions of the router (router_worker/metrics.py) and the control plane
(controlplane/metric_families.py), so that neither can name a metric that does not exist.

    .venv/bin/python scripts/observability.py          # write deploy/prometheus, deploy/grafana
    .venv/bin/python scripts/observability.py --check  # exit 1 if they are not up to date

Every expression below is checked: a metric it names must be a sample of a defined family
(a counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``, a gauge's own name),
or generation stops naming it. The one exception is a rule or panel marked ``awaits``: it
waits for a metric another change adds, is left out while that metric is undefined, and is
named in the generated files' headers; it appears as soon as the metric is defined and the
files are regenerated (tests/operations/test_observability.py fails until they are). ``<F>``
in an expression stands for the dashboard's cluster filter.
The README's "Dashboards, alerts, traces and autoscaling" explains each rule.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.metrics_core import Metric

from controlplane.metric_families import families as control_plane_families
from router_worker.metrics import RouterMetrics

ROOT = Path(__file__).resolve().parents[1]
RULES_PATH = Path("deploy/prometheus/switchyard-rules.yml")
DASHBOARD_PATH = Path("deploy/grafana/switchyard.json")
# The silent-fallback alarm's metric: 1 per instance while the router's predicted prefix
# hits run well above what the engine's prefix-cache counters confirm (router_worker/hit_audit.py)
SILENT_FALLBACK = "switchyard_router_silent_fallback"

# Thresholds, shared by the rules and the dashboard's threshold lines
PENDING_PREFILL_S = 2.0
KV_PRESSURE = 0.9
HOTSPOT_FALLBACK_SHARE = 0.25
ERROR_SHARE = 0.02
SILENT_FALLBACK_SHARE = 0.5  # the gauge is 0 or 1 per instance
REPLAY_DRIFT = 0.35
GREY_DEGRADED = 2  # switchyard_router_instance_grey_level: 2 degraded, 3 drained

REQUESTS = "switchyard_router_requests_total"
SHARE = "sum by (cluster) (rate({m}{{<F>{sel}}}[5m])) / sum by (cluster) (rate({m}{{<F>}}[5m]))"
PENDING = "max by (cluster) (switchyard_router_fleet_pending_prefill_seconds{<F>})"
KV = "max by (cluster) (switchyard_router_fleet_kv_pressure{<F>})"
HOTSPOT_SHARE = SHARE.format(m=REQUESTS, sel='reason="hotspot_fallback"')
ERRORS = SHARE.format(m=REQUESTS, sel='status=~"5.."')
SILENT = f"max by (cluster) ({SILENT_FALLBACK}{{<F>}})"
DRIFT = 'abs(switchyard_replay_fidelity_drift_ratio{<F>metric="ttft_mean_s"})'
ROLLBACKS = "increase(switchyard_canary_rollbacks_total{<F>}[15m])"
GREY = "max by (cluster, instance) (switchyard_router_instance_grey_level{<F>})"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    summary: str
    description: str
    for_: str = "5m"
    severity: str = "warning"
    awaits: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[tuple[str, str], ...]  # (expression, legend)
    description: str
    unit: str = "short"
    threshold: float | None = None
    awaits: bool = False


ALERTS = (
    Alert(
        "SwitchyardFleetSaturated",
        f"{PENDING} > {PENDING_PREFILL_S} or {KV} > {KV_PRESSURE}",
        "Cluster {{ $labels.cluster }} is saturated: add instances",
        f"Each healthy instance holds over {PENDING_PREFILL_S:g} s of queued prefill, or the "
        f"engines' KV caches are over {KV_PRESSURE:.0%} full, for 10 minutes: TTFT grows with "
        "the queue. The autoscaling signal (switchyard_router_fleet_*) says by how much.",
        for_="10m",
    ),
    Alert(
        "SwitchyardHotspotFallbackStorm",
        f"{HOTSPOT_SHARE} > {HOTSPOT_FALLBACK_SHARE}",
        "Cluster {{ $labels.cluster }}: {{ $value | humanizePercentage }} of requests fall "
        "back from a hotspot",
        "A large share of requests is routed load-only because their prefix class would pile "
        "onto the few instances caching it: a burst on one prefix (a popular system prompt or "
        "agent), cache reuse lost. See the Hotspots page.",
        for_="10m",
    ),
    Alert(
        "SwitchyardErrorRate",
        f"{ERRORS} > {ERROR_SHARE}",
        "Cluster {{ $labels.cluster }}: {{ $value | humanizePercentage }} of requests end in a 5xx",
        f"Over {ERROR_SHARE:.0%} of answered requests failed with a server error for 5 "
        "minutes (engines down or overloaded, retries exhausted).",
        severity="critical",
    ),
    Alert(
        "SwitchyardSilentFallback",
        f"{SILENT} > {SILENT_FALLBACK_SHARE}",
        "Cluster {{ $labels.cluster }}: the engines do not confirm the router's predicted "
        "prefix hits",
        "The prefix hits the router's KV index predicts run well above what the engines' "
        "prefix-cache counters confirm (by 0.25 of the prompt or more): the router tokenizes "
        "or renders prompts differently from the engines (a wrong tokenizer or chat "
        "template), so KV-aware routing has silently fallen back to guessing.",
        for_="15m",
        awaits=True,
    ),
    Alert(
        "SwitchyardInstanceDegraded",
        f"{GREY} >= {GREY_DEGRADED}",
        "Cluster {{ $labels.cluster }}: instance {{ $labels.instance }} is slow (grey failure)",
        "The router's grey-failure detector has found the instance persistently slower than "
        "its own normal, beyond the fleet's drift, and lowered its weight or drained it for "
        "5 minutes: it is alive but slow (thermal throttling, a bad link, a noisy neighbour). "
        "The live view's Slowness column shows its excess; its override form puts it back.",
    ),
    Alert(
        "SwitchyardCanaryRolledBack",
        f"{ROLLBACKS} > 0",
        "Cluster {{ $labels.cluster }}: a canary was rolled back",
        "The canary judge (or an operator) rolled a canary back: its candidate policy broke a "
        "guardrail or lost to the baseline. See the cluster's Canary page for the verdict.",
        for_="0m",
        severity="info",
    ),
    Alert(
        "SwitchyardReplayDrift",
        f"{DRIFT} > {REPLAY_DRIFT}",
        "Cluster {{ $labels.cluster }}: replays are {{ $value | humanizePercentage }} off the "
        "live TTFT",
        f"The newest replay of captured traffic puts the TTFT mean over {REPLAY_DRIFT:.0%} "
        "away from what the routers measured live for the same requests: the replay's "
        "recommendations are not to be trusted until the engines' cost model or the "
        "capture is looked at.",
        for_="0m",
    ),
)

PANELS = (
    Panel(
        "Requests by status",
        ((f"sum by (cluster, status) (rate({REQUESTS}{{<F>}}[5m]))", "{{cluster}} {{status}}"),),
        "Requests answered per second, by HTTP status.",
        unit="reqps",
    ),
    Panel(
        "5xx share",
        ((ERRORS, "{{cluster}}"),),
        "Share of answered requests that ended in a server error (alert SwitchyardErrorRate).",
        unit="percentunit",
        threshold=ERROR_SHARE,
    ),
    Panel(
        "TTFT p50 / p99",
        tuple(
            (
                f"histogram_quantile({q}, sum by (cluster, le) "
                "(rate(switchyard_router_ttft_seconds_bucket{<F>}[5m])))",
                f"{{{{cluster}}}} p{round(q * 100)}",
            )
            for q in (0.5, 0.99)
        ),
        "Time to first token measured at the routers.",
        unit="s",
    ),
    Panel(
        "TPOT p50 / p99",
        tuple(
            (
                f"histogram_quantile({q}, sum by (cluster, le) "
                "(rate(switchyard_router_tpot_seconds_bucket{<F>}[5m])))",
                f"{{{{cluster}}}} p{round(q * 100)}",
            )
            for q in (0.5, 0.99)
        ),
        "Time per output token measured at the routers.",
        unit="s",
    ),
    Panel(
        "Queued prefill per instance (autoscaling signal)",
        ((PENDING, "{{cluster}}"),),
        "Seconds of queued prefill work per healthy instance (alert SwitchyardFleetSaturated).",
        unit="s",
        threshold=PENDING_PREFILL_S,
    ),
    Panel(
        "KV pressure (autoscaling signal)",
        ((KV, "{{cluster}}"),),
        "Mean KV cache usage the healthy instances report.",
        unit="percentunit",
        threshold=KV_PRESSURE,
    ),
    Panel(
        "Healthy instances",
        (("max by (cluster) (switchyard_router_fleet_instances{<F>})", "{{cluster}}"),),
        "Instances the routers route to.",
    ),
    Panel(
        "Hotspot fallback share",
        ((HOTSPOT_SHARE, "{{cluster}}"),),
        "Share of requests routed load-only by the hotspot detector (alert "
        "SwitchyardHotspotFallbackStorm).",
        unit="percentunit",
        threshold=HOTSPOT_FALLBACK_SHARE,
    ),
    Panel(
        "Silent fallback: unconfirmed predicted hits",
        ((SILENT, "{{cluster}}"),),
        "Share of the router's predicted prefix hits the engines do not confirm: high means "
        "the router tokenizes differently from the engines (alert SwitchyardSilentFallback).",
        unit="percentunit",
        threshold=SILENT_FALLBACK_SHARE,
        awaits=True,
    ),
    Panel(
        "Router overhead p99",
        (
            (
                "histogram_quantile(0.99, sum by (cluster, le) "
                "(rate(switchyard_router_overhead_seconds_bucket{<F>}[5m])))",
                "{{cluster}}",
            ),
        ),
        "Router time in a streamed request's first chunk.",
        unit="s",
    ),
    Panel(
        "Requests in flight",
        (("sum by (cluster) (switchyard_router_in_flight{<F>})", "{{cluster}}"),),
        "Requests the routers hold now.",
    ),
    Panel(
        "Canary rollbacks (15 min)",
        ((f"sum by (cluster) ({ROLLBACKS})", "{{cluster}}"),),
        "Canaries rolled back (alert SwitchyardCanaryRolledBack).",
    ),
    Panel(
        "Replay drift (TTFT mean)",
        (
            (
                'switchyard_replay_fidelity_drift_ratio{<F>metric="ttft_mean_s"}',
                "{{cluster}}",
            ),
        ),
        "The newest replay of captured traffic against the live TTFT of the same requests "
        "(alert SwitchyardReplayDrift at ±35%).",
        unit="percentunit",
        threshold=REPLAY_DRIFT,
    ),
)


class UndefinedMetric(ValueError):
    pass


# ----------------------------------------------------------------- what is defined


def sample_names(family: Metric) -> set[str]:
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created"),
    }.get(family.type, ("",))
    return {family.name + suffix for suffix in suffixes}


def defined_metrics() -> set[str]:
    """Every sample name the router and the control plane expose."""
    router = list(RouterMetrics().registry.collect())
    return {
        name for family in (*router, *control_plane_families()) for name in sample_names(family)
    }


def referenced(expr: str) -> set[str]:
    return set(re.findall(r"\bswitchyard_[a-z0-9_]+\b", expr))


def missing(exprs: Iterable[str], defined: set[str]) -> set[str]:
    return {name for expr in exprs for name in referenced(expr)} - defined


def checked(items: Iterable[Alert | Panel], defined: set[str]) -> tuple[list, list[str]]:
    """The items whose metrics are all defined, and the names of those left out (awaiting
    a metric); UndefinedMetric for any other item that names an undefined metric."""
    kept, waiting, wrong = [], [], []
    for item in items:
        exprs = [item.expr] if isinstance(item, Alert) else [t[0] for t in item.targets]
        absent = missing(exprs, defined)
        label = item.name if isinstance(item, Alert) else item.title
        if not absent:
            kept.append(item)
        elif item.awaits:
            waiting.append(f"{label} (needs {', '.join(sorted(absent))})")
        else:
            wrong.append(f"{label}: {', '.join(sorted(absent))}")
    if wrong:
        raise UndefinedMetric("metrics that neither the router nor the control plane define: "
                              + "; ".join(wrong))  # fmt: skip
    return kept, waiting


def rule_expr(expr: str) -> str:
    return expr.replace("{<F>}", "").replace("<F>", "")


def panel_expr(expr: str) -> str:
    return expr.replace("<F>", 'cluster=~"$cluster",')


# ----------------------------------------------------------------- the files


def rules_text(alerts: list[Alert], waiting: list[str]) -> str:
    rules = [
        {
            "alert": a.name,
            "expr": rule_expr(a.expr),
            "for": a.for_,
            "labels": {"severity": a.severity},
            "annotations": {"summary": a.summary, "description": a.description},
        }
        for a in alerts
    ]
    header = [
        "# Generated by scripts/observability.py from the router's and the control plane's",
        "# metric definitions: do not edit; change the script and run it again.",
        *(f"# Left out until its metric is defined: {w}" for w in waiting),
    ]
    body = yaml.safe_dump(
        {"groups": [{"name": "switchyard", "rules": rules}]},
        sort_keys=False,
        width=100,
        allow_unicode=True,
    )
    return "\n".join(header) + "\n" + body


def dashboard_text(panels: list[Panel], waiting: list[str]) -> str:
    built = []
    for index, panel in enumerate(panels):
        steps: list[dict[str, object]] = [{"color": "green", "value": None}]
        if panel.threshold is not None:
            steps.append({"color": "red", "value": panel.threshold})
        built.append(
            {
                "id": index + 1,
                "type": "timeseries",
                "title": panel.title,
                "description": panel.description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
                "fieldConfig": {
                    "defaults": {
                        "unit": panel.unit,
                        "thresholds": {"mode": "absolute", "steps": steps},
                        "custom": {"thresholdsStyle": {"mode": "line"}},
                    },
                    "overrides": [],
                },
                "targets": [
                    {"refId": chr(ord("A") + k), "expr": panel_expr(expr), "legendFormat": legend}
                    for k, (expr, legend) in enumerate(panel.targets)
                ],
            }
        )
    note = "Generated by scripts/observability.py; do not edit."
    if waiting:
        note += " Left out until their metrics are defined: " + "; ".join(waiting) + "."
    dashboard = {
        "title": "Switchyard",
        "uid": "switchyard",
        "description": note,
        "tags": ["switchyard", "vllm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "cluster",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(switchyard_router_fleet_instances, cluster)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "refresh": 2,
                },
            ]
        },
        "panels": built,
    }
    return json.dumps(dashboard, indent=2) + "\n"


def render(
    alerts: Iterable[Alert] = ALERTS,
    panels: Iterable[Panel] = PANELS,
    defined: set[str] | None = None,
) -> dict[Path, str]:
    """The generated files' text by path (relative to the repository)."""
    defined = defined_metrics() if defined is None else defined
    kept_alerts, waiting_alerts = checked(alerts, defined)
    kept_panels, waiting_panels = checked(panels, defined)
    return {
        RULES_PATH: rules_text(kept_alerts, waiting_alerts),
        DASHBOARD_PATH: dashboard_text(kept_panels, waiting_panels),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether they are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render().items():
        target = ROOT / path
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(str(path))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run scripts/observability.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
