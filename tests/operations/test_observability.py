"""The Prometheus alert rules and the Grafana dashboard are generated from the router's and
the control plane's metric definitions (scripts/observability.py): the committed files are
what the generator writes now, a rule or panel naming a metric nobody defines stops the
generation, and the rules pass Debian's ``promtool`` (``check rules``) and fire on their
conditions and only then (``test rules``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router_worker.metrics import RouterMetrics
from scripts import observability as obs

ROOT = Path(__file__).resolve().parents[2]
DEFINED = obs.defined_metrics()


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: install Debian's prometheus (scripts/bootstrap.sh does)")
    return found


def test_the_committed_files_are_what_the_generator_writes() -> None:
    for path, text in obs.render().items():
        assert (ROOT / path).read_text() == text, f"{path} is stale: run scripts/observability.py"


def test_every_metric_the_rules_and_panels_name_is_defined() -> None:
    rules = yaml.safe_load((ROOT / obs.RULES_PATH).read_text())["groups"][0]["rules"]
    dashboard = json.loads((ROOT / obs.DASHBOARD_PATH).read_text())
    exprs = [rule["expr"] for rule in rules]
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert all(obs.referenced(expr) for expr in exprs)
    assert obs.missing(exprs, DEFINED) == set()
    assert {"switchyard_router_fleet_pending_prefill_seconds", "switchyard_canary_rollbacks_total",
            "switchyard_replay_fidelity_drift_ratio"} <= DEFINED  # fmt: skip


def readme_scaled_objects() -> list[dict[str, Any]]:
    """The KEDA ``ScaledObject`` YAML blocks of README.md ("Dashboards, alerts, traces and
    autoscaling")."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", (ROOT / "README.md").read_text(), re.M | re.S)
    documents = [yaml.safe_load(block) for block in blocks]
    return [d for d in documents if isinstance(d, dict) and d.get("kind") == "ScaledObject"]


def test_the_readmes_keda_example_queries_metrics_the_router_defines() -> None:
    router = {
        name for family in RouterMetrics().registry.collect() for name in obs.sample_names(family)
    }
    (scaled,) = readme_scaled_objects()
    triggers = scaled["spec"]["triggers"]
    assert triggers and {t["type"] for t in triggers} == {"prometheus"}
    queries = [t["metadata"]["query"] for t in triggers]
    assert all(obs.referenced(q) for q in queries), queries
    assert obs.missing(queries, router) == set()
    for trigger in triggers:
        float(trigger["metadata"]["threshold"])  # KEDA takes a number in a string


def test_a_rule_or_panel_naming_an_undefined_metric_stops_the_generation() -> None:
    typo = obs.Alert("Typo", "rate(switchyard_router_request_total[5m]) > 1", "s", "d")
    with pytest.raises(obs.UndefinedMetric, match="Typo: switchyard_router_request_total"):
        obs.render(alerts=(*obs.ALERTS, typo))
    # a metric renamed in the router: every rule and panel on it is named
    with pytest.raises(obs.UndefinedMetric) as refused:
        obs.render(defined=DEFINED - {"switchyard_router_fleet_kv_pressure"})
    assert "SwitchyardFleetSaturated" in str(refused.value)
    with pytest.raises(obs.UndefinedMetric, match="KV pressure"):
        obs.render(alerts=(), defined=DEFINED - {"switchyard_router_fleet_kv_pressure"})


def test_only_the_silent_fallback_waits_for_its_metric() -> None:
    _kept, waiting = obs.checked(obs.ALERTS, DEFINED)
    if obs.SILENT_FALLBACK in DEFINED:
        assert waiting == []
    else:
        assert waiting == [f"SwitchyardSilentFallback (needs {obs.SILENT_FALLBACK})"]
    with_it = obs.render(defined=DEFINED | {obs.SILENT_FALLBACK})
    assert "alert: SwitchyardSilentFallback" in with_it[obs.RULES_PATH]
    assert "Left out" not in with_it[obs.RULES_PATH]
    assert "Silent fallback" in with_it[obs.DASHBOARD_PATH]


def test_every_panel_follows_the_cluster_filter() -> None:
    dashboard = json.loads((ROOT / obs.DASHBOARD_PATH).read_text())
    panels = dashboard["panels"]
    assert (
        len({p["id"] for p in panels})
        == len(panels)
        == len(obs.PANELS) - (obs.SILENT_FALLBACK not in DEFINED)
    )
    for panel in panels:
        for target in panel["targets"]:
            assert 'cluster=~"$cluster"' in target["expr"], panel["title"]


def _rules_file(tmp_path: Path, **changes: str) -> Path:
    """The generated rules (with the silent fallback's), each alert's expr replaceable."""
    text = obs.render(defined=DEFINED | {obs.SILENT_FALLBACK})[obs.RULES_PATH]
    document = yaml.safe_load(text)
    for rule in document["groups"][0]["rules"]:
        rule["expr"] = changes.get(rule["alert"], rule["expr"])
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_promtool_accepts_the_rules_and_would_refuse_a_broken_one(tmp_path: Path) -> None:
    committed = subprocess.run(
        [promtool(), "check", "rules", str(ROOT / obs.RULES_PATH)], capture_output=True, text=True
    )
    assert committed.returncode == 0, committed.stdout + committed.stderr
    assert "SUCCESS" in committed.stdout
    broken = _rules_file(tmp_path, SwitchyardErrorRate="sum by (cluster (rate(x[5m]))")
    refused = subprocess.run(
        [promtool(), "check", "rules", str(broken)], capture_output=True, text=True
    )
    assert refused.returncode != 0


def _annotations(alert: str, summary: str) -> dict[str, str]:
    described = next(a for a in obs.ALERTS if a.name == alert).description
    return {"summary": summary, "description": described}


def _expect(alert: str, at: str, labels: dict[str, str] | None, summary: str = "") -> dict:
    expected: list[dict[str, Any]] = []
    if labels is not None:
        severity = next(a for a in obs.ALERTS if a.name == alert).severity
        expected.append(
            {
                "exp_labels": {"severity": severity, **labels},
                "exp_annotations": _annotations(alert, summary),
            }
        )
    return {"eval_time": at, "alertname": alert, "exp_alerts": expected}


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{matchers}}}", "values": values}


REQUESTS = "switchyard_router_requests_total"


def test_the_rules_fire_on_their_conditions_and_only_then(tmp_path: Path) -> None:
    rules = _rules_file(tmp_path)
    a, b = {"cluster": "a"}, {"cluster": "b"}
    series = [
        # a: 1 in 11 requests a 5xx; b: 1 in 101 (under the 2% line)
        _series(REQUESTS, "0+100x40", status="200", reason="score", **a),
        _series(REQUESTS, "0+10x40", status="502", reason="score", **a),
        _series(REQUESTS, "0+100x40", status="200", reason="score", **b),
        _series(REQUESTS, "0+1x40", status="503", reason="score", **b),
        # b: a third of its requests fall back from a hotspot
        _series(REQUESTS, "0+50x40", status="200", reason="hotspot_fallback", **b),
        # a: 3 s of queued prefill per instance; b: 1 s and KV usage 0.95 after 5 minutes
        _series("switchyard_router_fleet_pending_prefill_seconds", "3x40", **a),
        _series("switchyard_router_fleet_pending_prefill_seconds", "1x40", **b),
        _series("switchyard_router_fleet_kv_pressure", "0.2x40", **a),
        _series("switchyard_router_fleet_kv_pressure", "0.5x4 0.95x35", **b),
        _series(obs.SILENT_FALLBACK, "0.8x40", **a),
        _series(obs.SILENT_FALLBACK, "0.1x40", **b),
        # a canary of a rolled back at minute 10
        _series("switchyard_canary_rollbacks_total", "1x9 2x30", **a),
        _series("switchyard_canary_rollbacks_total", "0x40", **b),
        _series("switchyard_replay_fidelity_drift_ratio", "-0.5x40", metric="ttft_mean_s", **a),
        _series("switchyard_replay_fidelity_drift_ratio", "0.1x40", metric="ttft_mean_s", **b),
        _series("switchyard_replay_fidelity_drift_ratio", "0.9x40", metric="tpot_p99_s", **b),
        # a: i3 suspect, then degraded from minute 6 and drained from 12; b: i1 only suspect
        _series("switchyard_router_instance_grey_level", "1x5 2x5 3x30", instance="i3", **a),
        _series("switchyard_router_instance_grey_level", "0x40", instance="i0", **a),
        _series("switchyard_router_instance_grey_level", "1x40", instance="i1", **b),
    ]
    tests = [
        _expect("SwitchyardErrorRate", "20m", a, "Cluster a: 9.091% of requests end in a 5xx"),
        _expect("SwitchyardErrorRate", "3m", None),  # not for 5 minutes yet
        _expect("SwitchyardFleetSaturated", "8m", None),
        _expect("SwitchyardFleetSaturated", "20m", a, "Cluster a is saturated: add instances"),
        _expect(
            "SwitchyardHotspotFallbackStorm",
            "20m",
            b,
            "Cluster b: 33.11% of requests fall back from a hotspot",
        ),
        _expect(
            "SwitchyardSilentFallback",
            "20m",
            a,
            "Cluster a: the engines do not confirm the router's predicted prefix hits",
        ),
        _expect("SwitchyardInstanceDegraded", "9m", None),  # degraded, not for 5 minutes
        _expect(
            "SwitchyardInstanceDegraded",
            "20m",
            {**a, "instance": "i3"},
            "Cluster a: instance i3 is slow (grey failure)",
        ),
        _expect("SwitchyardCanaryRolledBack", "5m", None),
        _expect("SwitchyardCanaryRolledBack", "12m", a, "Cluster a: a canary was rolled back"),
        _expect("SwitchyardCanaryRolledBack", "30m", None),  # 15 minutes later: over
        _expect(
            "SwitchyardReplayDrift",
            "1m",
            {**a, "metric": "ttft_mean_s"},
            "Cluster a: replays are 50% off the live TTFT",
        ),
    ]
    # b saturates on KV pressure alone, 10 minutes after it passed 0.9
    tests.append(
        _expect("SwitchyardFleetSaturated", "20m", b, "Cluster b is saturated: add instances")
    )
    tests[3]["exp_alerts"] += tests.pop()["exp_alerts"]
    unit = tmp_path / "rules_test.yml"
    unit.write_text(
        yaml.safe_dump(
            {
                "rule_files": [rules.name],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}],
            },
            sort_keys=False,
        )
    )
    result = subprocess.run(
        [promtool(), "test", "rules", str(unit)], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
