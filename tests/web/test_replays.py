"""Replay jobs from the page to the task: shared and uploaded traces, progress, results."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from controlplane.models import ReplayJob
from controlplane.tasks.replay import run_replay

from .helpers import TRACE, policy_ids

pytestmark = pytest.mark.django_db


def test_shared_trace_replay_runs_every_policy(as_role, cluster, traces, dispatched) -> None:
    client = as_role("operator")
    response = client.post(
        reverse("web:replay_create", args=[cluster.pk]),
        {
            "trace": TRACE,
            "policies": policy_ids(cluster),
            "rate_scale": "2",
            "max_requests": "60",
            "seed": "1",
            "reason": "what if rr",
        },
    )
    job = ReplayJob.objects.get()
    assert response.status_code == 302
    cells = list(job.cells.values_list("pk", flat=True))
    assert [(name, args[0]) for name, args in dispatched] == [
        ("switchyard.replay_cell", (cell,)) for cell in cells
    ]
    assert run_replay(job.pk) == "succeeded"
    job.refresh_from_db()
    assert (job.state, job.progress) == ("succeeded", 1.0)
    assert job.results is not None
    policies = job.results["policies"]
    assert [p["kind"] for p in policies] == ["lmetric", "round_robin"]
    assert [p["summary"]["requests"] for p in policies] == [60, 60]
    assert all(p["summary"]["completed"] > 0 for p in policies)
    assert len(policies[0]["ttft_percentiles"]) == 99
    page = client.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()
    assert 'data-policy="round_robin"' in page and 'data-testid="live-now"' in page
    assert run_replay(job.pk) == "succeeded"  # run again: every cell is taken, nothing reruns
    assert all(c.attempts == 1 for c in job.cells.all())


def test_uploaded_trace_is_stored_and_replayed(as_role, cluster, traces, dispatched) -> None:
    upload = SimpleUploadedFile("mine.jsonl", (traces / TRACE).read_bytes()[:20_000])
    response = as_role("operator").post(
        reverse("web:replay_create", args=[cluster.pk]),
        {"upload": upload, "policies": policy_ids(cluster)[:1], "max_requests": "20"},
    )
    assert response.status_code == 302
    job = ReplayJob.objects.get()
    assert job.inputs["trace"].startswith("upload:")
    assert run_replay(job.pk) == "succeeded"


def test_an_unreadable_upload_is_refused(as_role, cluster, traces, dispatched) -> None:
    upload = SimpleUploadedFile("bad.csv", b"not,a,trace\n1,2,3\n")
    response = as_role("operator").post(
        reverse("web:replay_create", args=[cluster.pk]),
        {"upload": upload, "policies": policy_ids(cluster)[:1]},
    )
    assert response.status_code == 400
    assert b"not a supported trace" in response.content
    assert not ReplayJob.objects.exists() and not dispatched


def test_the_form_names_every_unreadable_value_at_once(as_role, cluster, traces, dispatched):
    response = as_role("operator").post(
        reverse("web:replay_create", args=[cluster.pk]),
        {"trace": "", "rate_scale": "fast", "seed": "1.5", "policies": policy_ids(cluster)[:1]},
    )
    assert response.status_code == 400
    for message in (b"is not a number", b"is not a whole number", b"choose a shared trace"):
        assert message in response.content
    assert not ReplayJob.objects.exists() and not dispatched


def test_a_model_enginesim_cannot_simulate_fails_the_job_with_its_reason(
    as_role, cluster, traces, dispatched
) -> None:
    cluster.model = "acme/unknown-model"
    cluster.save()
    as_role("operator").post(
        reverse("web:replay_create", args=[cluster.pk]),
        {"trace": TRACE, "policies": policy_ids(cluster)[:1], "max_requests": "10"},
    )
    job = ReplayJob.objects.get()
    assert run_replay(job.pk) == "failed"
    job.refresh_from_db()
    assert "no cost model" in job.error


def test_a_disaggregated_clusters_replay_splits_as_its_routers_do(
    as_role, cluster, traces, dispatched
) -> None:
    """The replay runs the cluster's pools, decider and decode policy: with i0 prefill, i1
    decode and the decider 'always', requests are split (before, every replay ran
    colocated)."""
    from controlplane.services import clusters, policies
    from controlplane.services.audit import Actor

    system = Actor.system("tests")
    ids = dict(cluster.instances.values_list("name", "pk"))
    clusters.set_instance_role(system, ids["i0"], "prefill", reason="pools")
    clusters.set_instance_role(system, ids["i1"], "decode", reason="pools")
    clusters.set_decider(system, cluster.pk, "always", reason="split all")
    rr = cluster.policies.get(name="rr")
    policies.set_decode_policy(system, cluster.pk, rr.pk, reason="decode by turns")
    client = as_role("operator")
    client.post(
        reverse("web:replay_create", args=[cluster.pk]),
        {"trace": TRACE, "policies": policy_ids(cluster)[:1], "max_requests": "30", "seeds": "2"},
    )
    job = ReplayJob.objects.get()
    assert run_replay(job.pk) == "succeeded", job.error
    job.refresh_from_db()
    assert job.results is not None
    split = job.results["policies"][0]["summary"]["disaggregation"]  # means over the seeds
    assert split["roles"] == ["prefill", "decode", "both"] and split["decider"] == "always"
    assert split["decode_policy"] == "round_robin"
    assert split["split"] > 0 and split["transfer_bytes"] > 0
    page = client.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()
    assert 'data-testid="replay-disaggregation"' in page
    assert f'data-field="split">{split["split"]:.0f}<' in page


def test_a_replay_of_pools_with_one_pool_down_says_so(as_role, cluster, traces, dispatched):
    from controlplane.services import clusters
    from controlplane.services.audit import Actor

    system = Actor.system("tests")
    ids = dict(cluster.instances.values_list("name", "pk"))
    clusters.set_instance_role(system, ids["i0"], "prefill", reason="pools")
    clusters.set_instance_role(system, ids["i1"], "decode", reason="pools")
    clusters.set_instance_role(system, ids["i2"], "prefill", reason="pools")
    cluster.instances.filter(name="i1").update(state="down")
    as_role("operator").post(
        reverse("web:replay_create", args=[cluster.pk]),
        {"trace": TRACE, "policies": policy_ids(cluster)[:1], "max_requests": "10"},
    )
    job = ReplayJob.objects.get()
    assert run_replay(job.pk) == "failed"
    job.refresh_from_db()
    assert "no decode pool" in job.error


def test_a_replay_no_worker_takes_says_which_worker_is_missing(as_role, cluster) -> None:
    from datetime import timedelta

    from django.utils import timezone

    waiting, fresh = (
        ReplayJob.objects.create(cluster=cluster, inputs={"trace": TRACE}) for _ in range(2)
    )
    ReplayJob.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    client = as_role("viewer")

    def page(job: ReplayJob) -> str:
        return client.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()

    assert 'data-testid="replay-unclaimed"' in page(waiting)
    assert "-Q replays" in page(waiting)
    assert 'data-testid="replay-unclaimed"' not in page(fresh)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rate_scales": "1, fast"}, "is not a number"),
        ({"rate_scales": "1,,2"}, "write rates as numbers separated by commas"),
        ({"rate_scales": "1, 1"}, "must not repeat a rate"),
        ({"rate_scales": "-1"}, "rate_scales must be a positive number"),
        ({"rate_scales": "1e999"}, "is out of range"),
        ({"rate_scales": "1, 2, 3, 4, 5"}, "rate_scales must list 1-4 rates"),
        ({"rate_scales": "5000"}, "rate_scales must be at most 1000"),
        ({"seeds": "0"}, "seeds must be a whole number from 1 to 10"),
        ({"seeds": "11"}, "seeds must be a whole number from 1 to 10"),
        ({"seeds": "2.5"}, "is not a whole number"),
        ({"seed": "-3"}, "seed must be a whole number from 0 to"),
    ],
)
def test_bad_loads_and_seeds_get_a_clear_400(as_role, cluster, traces, dispatched, fields, message):
    form = {"trace": TRACE, "policies": policy_ids(cluster)} | fields
    response = as_role("operator").post(reverse("web:replay_create", args=[cluster.pk]), form)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not ReplayJob.objects.exists() and not dispatched


def test_a_job_makes_one_cell_per_policy_load_and_seed(as_role, cluster, traces, dispatched):
    form = {"trace": TRACE, "policies": policy_ids(cluster), "rate_scales": "1, 1.5", "seeds": "3"}
    response = as_role("operator").post(reverse("web:replay_create", args=[cluster.pk]), form)
    assert response.status_code == 302
    job = ReplayJob.objects.get()
    cells = list(job.cells.values_list("policy", "rate_scale", "seed"))
    assert len(cells) == 12 and len(dispatched) == 12
    assert sorted(set(cells)) == [(p, r, s) for p in (0, 1) for r in (1.0, 1.5) for s in (0, 1, 2)]


def test_a_captures_tenants_are_replayed_with_the_clusters_settings(cluster) -> None:
    """A capture records each tenant as a keyed digest: its replay gives each digest the
    settings of the tenant it stands for, and scales a tenant named by the operator."""
    from controlplane.services import captures as capture_service
    from controlplane.services import tenants as tenant_service
    from controlplane.services.audit import Actor
    from controlplane.tasks.replay import _replay_tenants
    from router_worker.contract.capture import CaptureKey

    system = Actor.system("tests")
    tenant_service.create_tenant(system, cluster.pk, {"name": "team-a", "priority": "critical"})
    capture = capture_service.start_capture(system, cluster.pk, name="c1")
    digest = CaptureKey(capture.salt).tenant("team-a")
    tenants, names = _replay_tenants(cluster, f"capture:{capture.pk}")
    assert names == {"team-a": digest, "default": "default"}
    assert [(t.name, t.priority) for t in tenants] == [(digest, "critical")]
    tenants, names = _replay_tenants(cluster, "shared:x.jsonl")  # any other trace: by name
    assert [(t.name, t.priority) for t in tenants] == [("team-a", "critical")]


def test_a_replay_runs_flow_control_with_the_clusters_tpot_slo(cluster) -> None:
    """As the routers run it: a TPOT SLO turns flow control on without tenants, with the
    leg set; the job may still turn it off."""
    from controlplane.services import clusters
    from controlplane.services.audit import Actor
    from controlplane.tasks.replay import _replay_flow

    assert _replay_flow(cluster, "cluster", has_tenants=False) is None
    clusters.set_flow_tpot_slo(Actor.system("tests"), cluster.pk, 80, reason="TPOT")
    cluster.refresh_from_db()
    flow = _replay_flow(cluster, "cluster", has_tenants=False)
    assert flow is not None and flow.tpot_slo_s == 0.08
    assert _replay_flow(cluster, "off", has_tenants=True) is None
