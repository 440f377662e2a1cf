"""Idempotent seeding of the demo cluster (used by `make demo`)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from controlplane.models import CanarySplit, Cluster, RouterDeployment, TrafficCapture

from . import canaries, captures, clusters, policies, supervision
from .audit import Actor

SEEDER = Actor.system("demo-seed")
REASON = "demo seed"
# Sensible parameters per kind; defaults elsewhere come from each policy's Params class.
DEMO_POLICIES: dict[str, dict] = {
    "lmetric": {},
    "smetric": {},
    "round_robin": {},
    "least_load": {},
    "linear": {"w": 0.7},
    "cache_aware": {},
    "preble": {},
    "dualmap": {},
}


@dataclass(frozen=True)
class DemoSpec:
    cluster: str = "h20-qwen2-7b"
    model: str = "Qwen/Qwen2-7B-Instruct"
    gpu: str = "h20"
    instances: int = 16
    engine_host: str = "127.0.0.1"
    engine_base_port: int = 9100
    kv_events_base_port: int | None = 5600
    router_host: str = "localhost"
    router_port: int = 8000
    time_scale: float = 1.0  # the engines' --time-scale (wall seconds per engine second)


@transaction.atomic
def seed(spec: DemoSpec) -> Cluster:
    cluster = Cluster.objects.filter(name=spec.cluster).first()
    if cluster is None:
        cluster = clusters.create_cluster(
            SEEDER, name=spec.cluster, model=spec.model, gpu_type=spec.gpu, reason=REASON
        )
    _seed_instances(cluster, spec)
    by_kind = _seed_policies(cluster)
    if cluster.active_policy is None:
        policies.activate_policy(SEEDER, cluster.pk, by_kind["lmetric"].pk, reason=REASON)
    _seed_canary(cluster, by_kind, spec)
    _seed_router(cluster, spec)
    _seed_capture(cluster, spec)
    return cluster


def _seed_instances(cluster: Cluster, spec: DemoSpec) -> None:
    existing = set(cluster.instances.values_list("name", flat=True))
    for index in range(spec.instances):
        name = f"i{index:02d}"
        if name in existing:
            continue
        kv = (
            f"tcp://{spec.engine_host}:{spec.kv_events_base_port + index}"
            if spec.kv_events_base_port
            else ""
        )
        clusters.add_instance(
            SEEDER,
            cluster.pk,
            name=name,
            kv_events=kv,
            reason=REASON,
            url=f"http://{spec.engine_host}:{spec.engine_base_port + index}",
        )


def _seed_policies(cluster: Cluster) -> dict:
    by_kind = {p.kind: p for p in cluster.policies.all()}
    for kind, params in DEMO_POLICIES.items():
        if kind not in by_kind:
            by_kind[kind] = policies.create_policy(
                SEEDER,
                cluster.pk,
                name=kind.replace("_", "-"),
                kind=kind,
                params=params,
                description=f"demo {kind}",
                reason=REASON,
            )
    return by_kind


def _seed_canary(cluster: Cluster, by_kind: dict, spec: DemoSpec) -> None:
    if cluster.canaries.exists():
        return
    names = [f"i{index:02d}" for index in range(spec.instances)]
    half = len(names) // 2
    canaries.create_canary(
        SEEDER,
        cluster.pk,
        name="lmetric-vs-round-robin",
        baseline_policy_id=by_kind["round_robin"].pk,
        candidate_policy_id=by_kind["lmetric"].pk,
        baseline_instances=names[:half],
        candidate_instances=names[half:],
        reason=REASON,
    )
    assert cluster.canaries.filter(state=CanarySplit.State.DRAFT).exists()


def _seed_capture(cluster: Cluster, spec: DemoSpec) -> None:
    """The demo captures its own traffic from the start (Capture tab), to be replayed."""
    if not cluster.captures.filter(state=TrafficCapture.State.CAPTURING).exists():
        captures.start_capture(
            SEEDER,
            cluster.pk,
            name="demo traffic",
            engine_time_scale=spec.time_scale,
            reason=REASON,
        )


def _seed_router(cluster: Cluster, spec: DemoSpec) -> None:
    router = cluster.routers.filter(name="router-0").first()
    if router is None:
        router = RouterDeployment.objects.create(
            cluster=cluster, name="router-0", host=spec.router_host, port=spec.router_port
        )
    elif (router.host, router.port) != (spec.router_host, spec.router_port):
        router.host, router.port = spec.router_host, spec.router_port
        router.save(update_fields=["host", "port"])
    supervision.issue_router_token(router.pk)  # invalidate any token of an earlier run


def reset_login(username: str, role: str, *, superuser: bool = False) -> str:
    """Create or reset a user with a fresh password in the role's group; return it."""
    password = secrets.token_urlsafe(12)
    user, _ = get_user_model().objects.get_or_create(username=username)
    user.is_active = True
    user.is_staff = user.is_superuser = superuser
    user.set_password(password)
    user.save()
    group, _ = Group.objects.get_or_create(name=role)
    user.groups.add(group)
    return password
