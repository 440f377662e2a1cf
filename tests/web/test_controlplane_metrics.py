"""The control plane's Prometheus metrics, read from Postgres at scrape time: canary
rollbacks and canaries per state, and each cluster's replay drift from its newest replay
of captured traffic; scraped with a viewer's API token."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.models import CanarySplit, ReplayJob
from controlplane.services import tokens

from .helpers import SYSTEM, finished_job

pytestmark = pytest.mark.django_db


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _canary(cluster, name: str, state: str) -> CanarySplit:
    lm, rr = cluster.policies.get(name="lm"), cluster.policies.get(name="rr")
    return CanarySplit.objects.create(
        cluster=cluster, name=name, baseline_policy=lm, candidate_policy=rr, state=state
    )


def _with_fidelity(job: ReplayJob, ttft_diff: float) -> None:
    ttft = {"metric": "ttft_mean_s", "live": 1.0, "replay": 1.0 + ttft_diff, "diff": ttft_diff}
    fidelity = {"metrics": [ttft, {"metric": "tpot_p99_s", "diff": None}]}
    ReplayJob.objects.filter(pk=job.pk).update(
        results={**(job.results or {}), "fidelity": fidelity}
    )


def test_rollbacks_canaries_and_the_newest_replays_drift_are_exported(as_role, users, cluster):
    _canary(cluster, "one", "rolled_back")
    _canary(cluster, "two", "rolled_back")
    _canary(cluster, "three", "promoted")
    goodputs = {"lm": [[5.0, 5.1, 4.9], [6.0, 6.1, 5.9]], "rr": [[5.0] * 3, [6.0] * 3]}
    older, newer = finished_job(cluster, goodputs), finished_job(cluster, goodputs)
    _with_fidelity(older, 0.9)
    _with_fidelity(newer, -0.12)
    finished_job(cluster, goodputs)  # the newest, without fidelity: not a capture's replay
    token, _row = tokens.create_api_token(SYSTEM, users["viewer"], "prometheus")
    response = as_role(None).get("/api/v1/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    found = samples(response.content.decode())
    name = cluster.name
    assert found[("switchyard_canary_rollbacks_total", (("cluster", name),))] == 2
    assert found[("switchyard_canaries", (("cluster", name), ("state", "promoted")))] == 1
    drift = (("cluster", name), ("metric", "ttft_mean_s"))
    assert found[("switchyard_replay_fidelity_drift_ratio", drift)] == pytest.approx(-0.12)
    assert not any(key[0].endswith("drift_ratio") and ("metric", "tpot_p99_s") in key[1]
                   for key in found)  # fmt: skip


def test_the_metrics_need_a_login_or_a_token(as_role):
    assert as_role(None).get("/api/v1/metrics").status_code == 401
