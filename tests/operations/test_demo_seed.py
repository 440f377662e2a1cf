"""The demo's seed and fresh start (controlplane/services/demo.py, `make demo`)."""

from __future__ import annotations

import redis

from controlplane.models import AuditEvent, CanarySplit, Cluster, Policy, TrafficCapture
from controlplane.services import demo
from router_worker.routing.policies import REGISTRY

SPEC = demo.DemoSpec(cluster="demo-seed", instances=4, kv_events_base_port=None, time_scale=2.0)


def test_the_demo_starts_on_round_robin_with_a_canary_from_it_and_every_policy(db):
    cluster = demo.seed(SPEC)
    assert sorted(cluster.policies.values_list("kind", flat=True)) == sorted(REGISTRY)
    assert "predicted_ttft" in REGISTRY  # the registry, not a hand-kept list
    assert cluster.active_policy is not None and cluster.active_policy.kind == "round_robin"
    assert cluster.engine_time_scale == 2.0
    canary = CanarySplit.objects.get(cluster=cluster)
    assert canary.state == CanarySplit.State.DRAFT
    # the live policy is the baseline, a plausible one the candidate
    assert canary.baseline_policy == cluster.active_policy
    assert canary.candidate_policy.kind == "lmetric"
    assert canary.name == "round-robin-to-lmetric"
    capture = TrafficCapture.objects.get(cluster=cluster)
    assert capture.engine_time_scale == 2.0  # the cluster's, unasked


def test_seeding_again_keeps_what_an_operator_changed(db):
    cluster = demo.seed(SPEC)
    lmetric = Policy.objects.get(cluster=cluster, kind="lmetric")
    Cluster.objects.filter(pk=cluster.pk).update(active_policy=lmetric)
    again = demo.seed(SPEC)  # `make demo KEEP=1`
    assert again.pk == cluster.pk and again.active_policy == lmetric
    assert CanarySplit.objects.filter(cluster=cluster).count() == 1
    assert Policy.objects.filter(cluster=cluster).count() == len(REGISTRY)


def test_a_fresh_start_empties_the_database_redis_and_the_routers_saved_configs(
    transactional_db, settings, tmp_path
):
    settings.SWITCHYARD_VAR_DIR = str(tmp_path)
    demo.seed(SPEC)
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "router-config-1.json").write_text('{"version": 12}')
    (tmp_path / "captures").mkdir()
    (tmp_path / "captures" / "1-40.jsonl").write_text("{}\n")
    (tmp_path / "celerybeat-schedule").write_text("x")
    (tmp_path / "log").mkdir()
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.set("switchyard:state:demo-seed:router-0", "old")
    reset = demo.reset()
    assert not Cluster.objects.exists() and not AuditEvent.objects.exists()
    assert client.dbsize() == 0
    client.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log"]  # the logs stay
    assert reset[0] == f"database {settings.DATABASES['default']['NAME']}"
    cluster = demo.seed(SPEC)  # and the seed starts over: version 1, round robin
    assert cluster.versions.order_by("number").first().number == 1  # type: ignore[union-attr]


PD_SPEC = demo.DisaggDemoSpec(cluster="demo-seed-pd", instances=4, kv_events_base_port=None)


def test_the_disaggregated_cluster_has_two_pools_its_own_router_and_llm_ds_decider(db):
    from controlplane.services.config import desired_document
    from router_worker.contract.config import parse_config

    cluster = demo.seed_disaggregated(PD_SPEC)
    roles = dict(cluster.instances.order_by("name").values_list("name", "role"))
    assert roles == {"pd00": "prefill", "pd01": "prefill", "pd02": "decode", "pd03": "decode"}
    assert cluster.decider == "prefix_threshold"
    assert cluster.active_policy is not None and cluster.active_policy.kind == "lmetric"
    (router,) = cluster.routers.all()
    assert (router.name, router.port) == ("router-pd", 8001)
    document = desired_document(cluster)
    assert document is not None
    config = parse_config(document)
    assert config.disaggregated and config.stages.decider.kind == "prefix_threshold"


def test_seeding_the_disaggregated_cluster_again_keeps_the_operators_pools(db):
    from controlplane.services import clusters

    cluster = demo.seed_disaggregated(PD_SPEC)
    pd01 = cluster.instances.get(name="pd01")
    clusters.set_instance_role(demo.SEEDER, pd01.pk, "decode", reason="more decode")
    clusters.set_decider(demo.SEEDER, cluster.pk, "cost", reason="the live cost")
    again = demo.seed_disaggregated(PD_SPEC)
    assert again.pk == cluster.pk and again.decider == "cost"
    assert again.instances.get(name="pd01").role == "decode"
    assert again.instances.count() == 4
