"""What the control-plane tests share: a small but complete world built through the real
services, users of every role, API clients (session or token) acting as them, and the
check that a refusal names the field at fault."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from controlplane.models import (
    ArmMetricRollup,
    CanarySplit,
    ClientKey,
    Cluster,
    HotspotEvent,
    InstanceMetricRollup,
    ReplayJob,
    Tenant,
)
from controlplane.services import (
    canaries,
    captures,
    clusters,
    policies,
    router_deployments,
    tokens,
)
from controlplane.services.audit import Actor

ROLES = ("viewer", "operator", "admin")
SYSTEM = Actor.system("tests")


class HotspotEventFactory(factory.django.DjangoModelFactory[HotspotEvent]):
    class Meta:
        model = HotspotEvent

    event_id = factory.Sequence(lambda n: f"hs-{n}")
    at = factory.LazyFunction(timezone.now)
    transition = "suspected"
    prefix_class = "c1"
    prefix_hash = "abc123"
    x, x_bar, m, m_bar, window = 3.0, 1.0, 1, 3, 30.0
    instances = factory.LazyFunction(lambda: ["i0"])


@dataclass
class World:
    """Ids of everything the endpoint table refers to (see endpoints.py)."""

    ids: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, key: str) -> int:
        return self.ids[key]


def make_cluster(name: str, instance_names: list[str]) -> tuple[Cluster, dict]:
    cluster = clusters.create_cluster(SYSTEM, name=name, model="Qwen/Qwen2-7B", gpu_type="h20")
    made = {
        n: clusters.add_instance(
            SYSTEM, cluster.pk, name=n, url=f"http://127.0.0.1:91{i:02}", reason="setup"
        )
        for i, n in enumerate(instance_names)
    }
    lm = policies.create_policy(SYSTEM, cluster.pk, name="lm", kind="lmetric")
    rr = policies.create_policy(SYSTEM, cluster.pk, name="rr", kind="round_robin")
    policies.activate_policy(SYSTEM, cluster.pk, lm.pk, reason="setup")
    return cluster, {"instances": made, "lm": lm, "rr": rr}


def make_canary(
    cluster: Cluster,
    parts: dict,
    baseline: list[str],
    candidate: list[str],
    actions: tuple[str, ...] = (),
) -> CanarySplit:
    canary = canaries.create_canary(
        SYSTEM,
        cluster.pk,
        name=f"{cluster.name}-canary",
        baseline_policy_id=parts["lm"].pk,
        candidate_policy_id=parts["rr"].pk,
        baseline_instances=baseline,
        candidate_instances=candidate,
        weight_steps=[10, 50],
        reason="setup",
    )
    for action in actions:
        canary = canaries.transition(SYSTEM, canary.pk, action, reason="setup")
    return canary


def build_world() -> World:
    alpha, a = make_cluster("alpha", ["i0", "i1", "i2", "i3", "spare"])
    beta, b = make_cluster("beta", ["b0", "b1"])
    gamma, g = make_cluster("gamma", ["g0", "g1"])
    clusters.set_instance_state(SYSTEM, a["instances"]["i3"].pk, "draining", reason="setup")
    ll = policies.create_policy(SYSTEM, alpha.pk, name="ll", kind="least_load")
    draft = make_canary(alpha, a, ["i0", "i1"], ["i2"])
    running = make_canary(beta, b, ["b0"], ["b1"], ("start",))
    paused = make_canary(gamma, g, ["g0"], ["g1"], ("start", "pause"))
    token, router = router_deployments.create_router_deployment(
        SYSTEM, alpha.pk, name="r1", host="127.0.0.1", port=8100
    )
    replay = ReplayJob.objects.create(cluster=alpha, inputs={"trace": "t"})
    capture = captures.start_capture(SYSTEM, gamma.pk, name="world-capture", reason="setup")
    client_key = ClientKey.objects.create(
        cluster=alpha,
        name="world-key",
        prefix="w0rld000",
        key_hash="0" * 64,
        created_by="system:tests",
    )
    tenant = Tenant.objects.create(cluster=alpha, name="world-tenant", created_by="system:tests")
    _, api_token = tokens.create_api_token(SYSTEM, make_user("viewer", "token-owner"), "world")
    hotspot = HotspotEventFactory.create(cluster=alpha)
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=1)
    ArmMetricRollup.objects.create(cluster=alpha, arm="baseline", minute=minute, requests=5)
    InstanceMetricRollup.objects.create(cluster=alpha, instance="i0", minute=minute, requests=5)
    world = World(
        {
            "alpha": alpha.pk,
            "beta": beta.pk,
            "gamma": gamma.pk,
            "i0": a["instances"]["i0"].pk,
            "i3": a["instances"]["i3"].pk,
            "spare": a["instances"]["spare"].pk,
            "lm": a["lm"].pk,
            "rr": a["rr"].pk,
            "ll": ll.pk,
            "draft": draft.pk,
            "running": running.pk,
            "paused": paused.pk,
            "router": router.pk,
            "replay": replay.pk,
            "capture": capture.pk,
            "hotspot": hotspot.pk,
            "client_key": client_key.pk,
            "tenant": tenant.pk,
            "api_token": api_token.pk,
        }
    )
    world.router_token = token  # type: ignore[attr-defined]
    return world


def make_user(role: str | None, username: str | None = None):
    # No password: hashing one costs ~0.3 s, and tests log in with force_login or tokens.
    user = get_user_model().objects.create_user(username or f"user-{role}")
    if role is not None:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def session_client(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def token_client(user) -> Client:
    plaintext, _ = tokens.create_api_token(SYSTEM, user, "tests")
    return Client(headers={"Authorization": f"Bearer {plaintext}"})


def assert_refused(response, status: int, field: str, *words: str) -> None:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["field"] == field, error
    for word in words:
        assert word in error["message"], error
