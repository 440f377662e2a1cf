"""Idempotent seeding of the demo cluster (used by `make demo`).

The demo's story: the cluster starts on a plain policy (round robin, ``DemoSpec.policy``),
as a fleet that never tuned its routing would. The demo captures its own traffic from the
start; replayed over the policies, the capture shows which would serve it better, and the
replay's page offers a canary of that one against the live policy. A seeded draft canary
has the same shape (the live policy as baseline, LMetric as candidate), for whoever wants
to try a canary before a replay. A second, small cluster (``DisaggDemoSpec``) is
prefill/decode disaggregated, with its own router and live view."""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from controlplane.models import CanarySplit, Cluster, Policy, RouterDeployment, TrafficCapture
from router_worker.routing.policies import REGISTRY

from . import canaries, captures, clusters, policies, supervision
from .audit import Actor

SEEDER = Actor.system("demo-seed")
REASON = "demo seed"
# One policy of every kind in the policy registry; parameters from each policy's Params
# class (the control plane completes cost coefficients), except these.
PARAM_OVERRIDES: dict[str, dict] = {"linear": {"w": 0.7}}


def demo_policies() -> dict[str, dict]:
    """Every registered policy kind with the parameters the demo gives it."""
    return {kind: PARAM_OVERRIDES.get(kind, {}) for kind in sorted(REGISTRY)}


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
    policy: str = "round_robin"  # the kind the cluster starts on
    canary_candidate: str = "lmetric"  # the seeded canary's candidate (baseline: live)


@dataclass(frozen=True)
class DisaggDemoSpec:
    """The demo's second, small cluster: prefill/decode disaggregated (the first half of
    its instances prefill, the rest decode), its own router, llm-d's prefix-threshold
    decider (a prompt with more than 256 tokens uncached on the decode pool is split), so
    what a request does depends on its prompt rather than on a load the demo cannot spare."""

    cluster: str = "h20-qwen2-7b-pd"
    model: str = "Qwen/Qwen2-7B-Instruct"
    gpu: str = "h20"
    instances: int = 4
    engine_host: str = "127.0.0.1"
    engine_base_port: int = 9200
    kv_events_base_port: int | None = 5800
    router_host: str = "localhost"
    router_port: int = 8001
    time_scale: float = 1.0
    policy: str = "lmetric"  # the prefill stage's (and a fallback's); decode: decode_room
    decider: str = "prefix_threshold"

    def role(self, index: int) -> str:
        return "prefill" if index < self.instances // 2 else "decode"


# What an earlier run leaves under SWITCHYARD_VAR_DIR that would outlive a reset database:
# routers' last applied config (versions count from 1 again), capture exports (capture
# ids too), Celery beat's schedule.
VAR_LEFTOVERS = ("router", "captures", "celerybeat-schedule")


def reset() -> list[str]:
    """Start the demo afresh: empty the control plane's database (every table but the
    migrations), its Redis database (routers' state, telemetry streams, queued tasks) and
    the files an earlier run left in the var directory. What was reset, for the banner."""
    import redis
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.flushdb()
    finally:
        client.close()
    var = Path(settings.SWITCHYARD_VAR_DIR)
    for name in VAR_LEFTOVERS:
        path = var / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    database = settings.DATABASES["default"]["NAME"]
    return [f"database {database}", f"Redis {settings.REDIS_URL.rsplit('@', 1)[-1]}"]


@transaction.atomic
def seed(spec: DemoSpec) -> Cluster:
    cluster = Cluster.objects.filter(name=spec.cluster).first()
    if cluster is None:
        cluster = clusters.create_cluster(
            SEEDER, name=spec.cluster, model=spec.model, gpu_type=spec.gpu, reason=REASON
        )
    if cluster.engine_time_scale != spec.time_scale:
        cluster.engine_time_scale = spec.time_scale
        cluster.save(update_fields=["engine_time_scale"])
    _seed_instances(cluster, spec)
    by_kind = _seed_policies(cluster)
    if cluster.active_policy is None:
        policies.activate_policy(SEEDER, cluster.pk, by_kind[spec.policy].pk, reason=REASON)
        cluster.refresh_from_db()
    _seed_canary(cluster, by_kind, spec)
    _seed_router(cluster, spec)
    _seed_capture(cluster, spec)
    return cluster


@transaction.atomic
def seed_disaggregated(spec: DisaggDemoSpec) -> Cluster:
    """The disaggregated cluster (``DisaggDemoSpec``), idempotently: what an operator
    changed since (roles, decider, policy) is kept."""
    if spec.instances < 2:
        raise ValueError("a disaggregated demo cluster needs a prefill and a decode instance")
    cluster = Cluster.objects.filter(name=spec.cluster).first()
    created = cluster is None
    if cluster is None:
        cluster = clusters.create_cluster(
            SEEDER, name=spec.cluster, model=spec.model, gpu_type=spec.gpu, reason=REASON
        )
    if cluster.engine_time_scale != spec.time_scale:
        cluster.engine_time_scale = spec.time_scale
        cluster.save(update_fields=["engine_time_scale"])
    added = _seed_instances(cluster, spec, prefix="pd")
    for instance in cluster.instances.filter(name__in=added):
        role = spec.role(int(instance.name[2:]))
        clusters.set_instance_role(SEEDER, instance.pk, role, reason=REASON)
    by_kind = _seed_policies(cluster, kinds=(spec.policy, "round_robin"))
    if cluster.active_policy is None:
        policies.activate_policy(SEEDER, cluster.pk, by_kind[spec.policy].pk, reason=REASON)
    if created and spec.decider != Cluster.Decider.COST:
        clusters.set_decider(SEEDER, cluster.pk, spec.decider, reason=REASON)
    _seed_router(cluster, spec, name="router-pd")
    cluster.refresh_from_db()
    return cluster


def _seed_instances(
    cluster: Cluster, spec: DemoSpec | DisaggDemoSpec, prefix: str = "i"
) -> list[str]:
    """The spec's instances the cluster lacks, added; their names."""
    existing = set(cluster.instances.values_list("name", flat=True))
    added = []
    for index in range(spec.instances):
        name = f"{prefix}{index:02d}"
        if name in existing:
            continue
        added.append(name)
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
    return added


def _seed_policies(cluster: Cluster, kinds: tuple[str, ...] | None = None) -> dict:
    """The demo's policies (of ``kinds``, or every kind) the cluster lacks, added."""
    by_kind = {p.kind: p for p in cluster.policies.all()}
    for kind, params in demo_policies().items():
        if kind not in by_kind and (kinds is None or kind in kinds):
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


def _seed_canary(cluster: Cluster, by_kind: dict[str, Policy], spec: DemoSpec) -> None:
    """A draft canary from the live policy (baseline) to a plausible next one."""
    if cluster.canaries.exists() or cluster.active_policy is None:
        return
    baseline = cluster.active_policy
    candidate = by_kind[spec.canary_candidate]
    if candidate.pk == baseline.pk:
        candidate = by_kind["lmetric" if baseline.kind != "lmetric" else "least_load"]
    names = [f"i{index:02d}" for index in range(spec.instances)]
    half = len(names) // 2
    canaries.create_canary(
        SEEDER,
        cluster.pk,
        name=f"{baseline.name}-to-{candidate.name}",
        baseline_policy_id=baseline.pk,
        candidate_policy_id=candidate.pk,
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


def _seed_router(cluster: Cluster, spec: DemoSpec | DisaggDemoSpec, name: str = "router-0") -> None:
    router = cluster.routers.filter(name=name).first()
    if router is None:
        router = RouterDeployment.objects.create(
            cluster=cluster, name=name, host=spec.router_host, port=spec.router_port
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
