"""Instance roles (prefill/decode disaggregation): the pools' sizes are editable, audited,
published in the routers' config, and shown on the cluster page."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent, Cluster, ConfigVersion, Instance
from enginesim.engine.transfer import LINKS
from router_worker.contract.config import parse_config

from .endpoints import REASON
from .helpers import assert_refused, session_client

pytestmark = pytest.mark.django_db
# Llama 3.1 8B's config.json on the Hugging Face hub: 32 layers, 8 KV heads of 128
LLAMA_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, bf16: 131,072 (Qwen2-7B: 57,344)


def set_role(client, instance_id: int, role: str):
    return client.post(
        f"/api/v1/instances/{instance_id}/role",
        {"role": role, **REASON},
        content_type="application/json",
    )


def newest_document(cluster_id: int) -> dict:
    return ConfigVersion.objects.filter(cluster_id=cluster_id).order_by("-number")[0].document


def test_a_role_change_is_audited_and_reaches_the_routers_config(world, users):
    client = session_client(users["operator"])
    response = set_role(client, world["i0"], "prefill")
    assert response.status_code == 200, response.content
    assert response.json()["role"] == "prefill"
    row = AuditEvent.objects.order_by("-id")[0]
    assert row.action == "instance.role" and row.reason == REASON["reason"]
    assert row.before is not None and row.after is not None
    assert row.before["role"] == "both" and row.after["role"] == "prefill"
    document = newest_document(world["alpha"])
    roles = {i["name"]: i.get("role", "both") for i in document["instances"]}
    assert roles["i0"] == "prefill" and roles["i1"] == "both"
    assert parse_config(document).disaggregated


def test_a_change_that_leaves_no_decode_pool_is_refused(world, users):
    client = session_client(users["admin"])
    alpha = Instance.objects.filter(cluster_id=world["alpha"]).exclude(pk=world["i0"])
    alpha.update(role="prefill")
    assert_refused(set_role(client, world["i0"], "prefill"), 400, "role", "no decode pool")
    assert Instance.objects.get(pk=world["i0"]).role == "both"


def test_an_unknown_role_is_refused_naming_the_field(world, users):
    response = set_role(session_client(users["operator"]), world["i0"], "middle")
    assert response.status_code == 422
    assert "role" in response.content.decode()


def test_the_cluster_page_shows_the_pools(world, users):
    client = session_client(users["viewer"])
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert 'data-testid="pools"' not in page  # every instance serves both halves
    assert 'data-testid="role-form"' not in page  # a viewer has no controls
    set_role(session_client(users["operator"]), world["i0"], "prefill")
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert 'data-testid="pools"' in page
    assert '<tr data-pool="prefill"><td>Prefill only</td><td class="num">1</td><td>i0</td>' in page


def test_an_operator_sets_a_role_from_the_cluster_page(world, users):
    client = session_client(users["operator"])
    url = f"/clusters/{world['alpha']}/role/"
    response = client.post(url, {"instance": "i0", "role": "decode", "reason": "more decode"})
    assert response.status_code == 302
    assert Instance.objects.get(pk=world["i0"]).role == "decode"
    assert AuditEvent.objects.order_by("-id")[0].action == "instance.role"
    refused = client.post(url, {"instance": "i0", "role": "decode", "reason": "again"})
    assert refused.status_code == 409
    assert "already decode" in refused.content.decode()
    unknown = client.post(url, {"instance": "nope", "role": "decode", "reason": "x"})
    assert unknown.status_code == 400 and "not in this cluster" in unknown.content.decode()
    viewer = session_client(users["viewer"]).post(url, {"instance": "i0", "role": "both"})
    assert viewer.status_code == 403


def set_decider(client, cluster_id: int, decider: str, **more):
    return client.put(
        f"/api/v1/clusters/{cluster_id}/decider",
        {"decider": decider, **more, **REASON},
        content_type="application/json",
    )


def test_the_decider_is_audited_and_reaches_a_disaggregated_clusters_config(world, users):
    client = session_client(users["operator"])
    response = set_decider(client, world["alpha"], "always")
    assert response.status_code == 200, response.content
    assert response.json()["decider"] == "always"
    row = AuditEvent.objects.order_by("-id")[0]
    assert row.action == "cluster.decider"
    assert row.before == {"decider": "cost", "decider_threshold_tokens": 256, "kv_link": "rdma"}
    assert row.after is not None and row.after["decider"] == "always"
    # Every instance serves both: no block (it alone would make the cluster disaggregated).
    assert "disaggregation" not in newest_document(world["alpha"])
    set_role(client, world["i0"], "prefill")
    config = parse_config(newest_document(world["alpha"]))
    assert config.disaggregated and config.stages.decider.kind == "always"
    got = client.get(f"/api/v1/clusters/{world['alpha']}/decider").json()
    assert (got["decider"], got["threshold_tokens"], got["kv_link"]) == ("always", 256, "rdma")


def test_the_threshold_and_the_link_reach_the_routers_with_the_models_kv_layout(world, users):
    """llm-d's threshold as the operator sets it; the cost decider's link and the KV bytes
    per token of the cluster's model (worked out by hand from its layout, not read from
    enginesim), not the reference fleet's."""
    client = session_client(users["operator"])
    Cluster.objects.filter(pk=world["alpha"]).update(model="meta-llama/Llama-3.1-8B-Instruct")
    set_role(client, world["i0"], "prefill")
    response = set_decider(
        client, world["alpha"], "prefix_threshold", threshold_tokens=1024, kv_link="tcp"
    )
    assert response.status_code == 200, response.content
    assert response.json()["threshold_tokens"] == 1024 and response.json()["kv_link"] == "tcp"
    decider = parse_config(newest_document(world["alpha"])).stages.decider
    assert (decider.kind, decider.threshold_tokens) == ("prefix_threshold", 1024)
    # 25 Gb/s effective TCP, 200 µs per read (enginesim's tcp preset)
    assert (decider.link_bandwidth, decider.link_latency) == (3.125e9, 200e-6)
    assert decider.kv_bytes_per_token == LLAMA_KV_BYTES_PER_TOKEN
    row = AuditEvent.objects.order_by("-id")[0]
    assert row.after is not None and row.after["decider_threshold_tokens"] == 1024
    # Back to the cost decider: the threshold and the link are kept.
    set_decider(client, world["alpha"], "cost")
    decider = parse_config(newest_document(world["alpha"])).stages.decider
    assert (decider.kind, decider.threshold_tokens, decider.link_bandwidth) == (
        "cost",
        1024,
        3.125e9,
    )


def test_an_unknown_unchanged_or_hostile_decider_is_refused(world, users):
    client = session_client(users["operator"])
    unknown = set_decider(client, world["alpha"], "sometimes")
    assert unknown.status_code == 422 and "decider" in unknown.content.decode()
    assert_refused(set_decider(client, world["alpha"], "cost"), 409, "decider", "already cost")
    for hostile in (-1, 10**12, "many", True):
        refused = set_decider(client, world["alpha"], "cost", threshold_tokens=hostile)
        assert refused.status_code == 422, hostile
        assert "threshold_tokens" in refused.content.decode()
    link = set_decider(client, world["alpha"], "cost", kv_link="pigeon")
    assert link.status_code == 422 and "kv_link" in link.content.decode()
    assert Cluster.objects.get(pk=world["alpha"]).decider_threshold_tokens == 256
    viewer = set_decider(session_client(users["viewer"]), world["alpha"], "never")
    assert viewer.status_code == 403


def test_the_clusters_link_choices_are_enginesims_links() -> None:
    assert sorted(Cluster.KvLink.values) == sorted(LINKS)


def test_an_operator_sets_the_decider_from_the_cluster_page(world, users):
    client = session_client(users["operator"])
    client.post(
        f"/clusters/{world['alpha']}/role/",
        {"instance": "i0", "role": "prefill", "reason": "split"},
    )
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert 'data-testid="decider-form"' in page
    url = f"/clusters/{world['alpha']}/decider/"
    response = client.post(url, {"decider": "prefix_threshold", "reason": "llm-d's rule"})
    assert response.status_code == 302
    assert AuditEvent.objects.order_by("-id")[0].action == "cluster.decider"
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert "Decider: <strong>prefix_threshold</strong>" in page
    refused = client.post(url, {"decider": "sometimes", "reason": "x"})
    assert refused.status_code == 400 and "decider must be one of" in refused.content.decode()
    hostile = {"decider": "prefix_threshold", "threshold_tokens": "1e3", "reason": "x"}
    refused = client.post(url, hostile)
    text = refused.content.decode()
    assert refused.status_code == 400 and 'data-error="threshold_tokens"' in text
    assert "is not a whole number" in text and 'value="1e3"' in text  # kept as typed
    client.post(url, {**hostile, "threshold_tokens": "512", "kv_link": "nvlink"})
    cluster = Cluster.objects.get(pk=world["alpha"])
    assert (cluster.decider_threshold_tokens, cluster.kv_link) == (512, "nvlink")
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert '<strong data-field="threshold_tokens">512</strong>' in page


def set_decode_policy(client, cluster_id: int, policy_id):
    return client.put(
        f"/api/v1/clusters/{cluster_id}/decode-policy",
        {"policy_id": policy_id, **REASON},
        content_type="application/json",
    )


def test_the_decode_policy_is_audited_and_reaches_the_routers_decode_stage(world, users):
    client = session_client(users["operator"])
    set_role(client, world["i0"], "prefill")
    assert parse_config(newest_document(world["alpha"])).stages.decode_policy.kind == "decode_room"
    response = set_decode_policy(client, world["alpha"], world["ll"])
    assert response.status_code == 200, response.content
    assert (response.json()["name"], response.json()["kind"]) == ("ll", "least_load")
    row = AuditEvent.objects.order_by("-id")[0]
    assert row.action == "policy.decode" and row.reason == REASON["reason"]
    assert row.before == {"decode_policy": "the default (decode_room)"}
    assert row.after is not None and row.after["decode_policy"] == "ll"
    assert parse_config(newest_document(world["alpha"])).stages.decode_policy.kind == "least_load"
    back = set_decode_policy(client, world["alpha"], None)  # the routers' default again
    assert back.status_code == 200 and back.json()["kind"] == "decode_room"
    assert "decode_policy" not in newest_document(world["alpha"])["disaggregation"]


def test_an_unknown_foreign_or_unchanged_decode_policy_is_refused(world, users):
    client = session_client(users["operator"])
    assert_refused(set_decode_policy(client, world["alpha"], 10**9), 404, "policy_id", "does not")
    beta_policy = Cluster.objects.get(pk=world["beta"]).policies.first()
    assert beta_policy is not None  # another cluster's policy is not this one's to choose
    assert_refused(set_decode_policy(client, world["alpha"], beta_policy.pk), 404, "policy_id", "")
    assert_refused(set_decode_policy(client, world["alpha"], None), 409, "policy_id", "already")
    for hostile in ("ll", -1, True, 1.5, 10**30):
        assert set_decode_policy(client, world["alpha"], hostile).status_code == 422, hostile
    viewer = set_decode_policy(session_client(users["viewer"]), world["alpha"], world["ll"])
    assert viewer.status_code == 403
    assert Cluster.objects.get(pk=world["alpha"]).decode_policy_id is None


def create_canary(client, cluster_id: int, **fields):
    body = {
        "name": "decode-canary",
        "baseline_policy_id": fields.pop("baseline"),
        "candidate_policy_id": fields.pop("candidate"),
        "baseline_instances": ["i0", "i1"],
        "candidate_instances": ["i2"],
        **fields,
        **REASON,
    }
    return client.post(
        f"/api/v1/clusters/{cluster_id}/canaries", body, content_type="application/json"
    )


def test_a_canary_of_the_decode_stage_runs_and_promotes_its_decode_policy(world, users):
    client = session_client(users["operator"])
    set_role(client, world["i0"], "prefill")
    CanarySplitModel = Cluster.objects.get(pk=world["alpha"]).canaries.model
    CanarySplitModel.objects.filter(pk=world["draft"]).delete()
    same = create_canary(client, world["alpha"], baseline=world["lm"], candidate=world["lm"])
    assert_refused(same, 400, "candidate_policy_id", "decode policy")
    response = create_canary(
        client,
        world["alpha"],
        baseline=world["lm"],
        candidate=world["lm"],
        candidate_decode_policy_id=world["rr"],
    )
    assert response.status_code == 201, response.content
    canary = response.json()
    assert canary["candidate_decode_policy_id"] == world["rr"]
    started = client.post(f"/api/v1/canaries/{canary['id']}/start", REASON, "application/json")
    assert started.status_code == 200, started.content
    arms = parse_config(newest_document(world["alpha"])).canary.arms  # type: ignore[union-attr]
    assert arms[0].decode_policy is None  # the baseline decodes under the cluster's
    assert arms[1].decode_policy is not None and arms[1].decode_policy.kind == "round_robin"
    promoted = client.post(f"/api/v1/canaries/{canary['id']}/promote", REASON, "application/json")
    assert promoted.status_code == 200, promoted.content
    assert Cluster.objects.get(pk=world["alpha"]).decode_policy_id == world["rr"]
    document = newest_document(world["alpha"])
    assert document["canary"] is None
    assert parse_config(document).stages.decode_policy.kind == "round_robin"


def test_a_decode_canary_on_a_colocated_cluster_is_refused(world, users):
    client = session_client(users["operator"])
    refused = create_canary(
        client,
        world["alpha"],
        baseline=world["lm"],
        candidate=world["rr"],
        candidate_decode_policy_id=world["ll"],
    )
    assert_refused(refused, 400, "candidate_decode_policy_id", "no decode stage")


def test_an_operator_sets_the_decode_policy_from_the_cluster_page(world, users):
    client = session_client(users["operator"])
    client.post(
        f"/clusters/{world['alpha']}/role/", {"instance": "i0", "role": "prefill", "reason": "x"}
    )
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert 'data-testid="decode-policy-form"' in page
    assert '<strong data-field="decode_policy">decode_room (the default)</strong>' in page
    url = f"/clusters/{world['alpha']}/decode-policy/"
    response = client.post(url, {"policy": str(world["ll"]), "reason": "least load decodes"})
    assert response.status_code == 302
    page = client.get(f"/clusters/{world['alpha']}/").content.decode()
    assert '<strong data-field="decode_policy">ll (least_load)</strong>' in page
    for hostile in ("ll", "-3", "1e3"):
        refused = client.post(url, {"policy": hostile, "reason": "x"})
        assert refused.status_code == 400, hostile
        assert "policy" in refused.content.decode()
    canary_page = client.get(f"/clusters/{world['alpha']}/canary/").content.decode()
    assert 'data-testid="candidate-decode-policy"' in canary_page
