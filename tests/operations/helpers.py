"""What the operations tests share: routers as reconcile sees them, canary arms and their
minute rollups for the judge, and a check that a router's HTTP server answers."""

from __future__ import annotations

from datetime import timedelta

import httpx
import numpy as np
from django.utils import timezone

from controlplane.models import ArmMetricRollup, CanarySplit, RouterDeployment
from controlplane.services.audit import Actor
from controlplane.services.judge import ArmSample

ADMIN = Actor.system("test")


def router(
    cluster, name: str, port: int, heartbeat_age_s: float | None, applied: int | None
) -> RouterDeployment:
    beat = None if heartbeat_age_s is None else timezone.now() - timedelta(seconds=heartbeat_age_s)
    return RouterDeployment.objects.create(
        cluster=cluster,
        name=name,
        host="host-a",
        port=port,
        last_heartbeat=beat,
        applied_version=applied,
    )


RNG = np.random.default_rng(7)


def lognormal(median: float, n: int) -> list[float]:
    return list(np.exp(RNG.normal(np.log(median), 0.3, n)))


def arm(
    ttft_median: float,
    n: int = 200,
    errors: int = 0,
    tpot_median: float = 0.02,
    fallbacks: int = 0,
) -> ArmSample:
    return ArmSample(
        requests=n,
        errors=errors,
        hotspot_fallbacks=fallbacks,
        ttft_s=lognormal(ttft_median, n),
        tpot_s=lognormal(tpot_median, n),
    )


def feed(
    canary: CanarySplit,
    baseline: ArmSample,
    candidate: ArmSample,
    step_age: timedelta = timedelta(minutes=2),
) -> None:
    CanarySplit.objects.filter(pk=canary.pk).update(step_started_at=timezone.now() - step_age)
    minute = (timezone.now() - timedelta(minutes=2)).replace(second=0, microsecond=0)
    for name, sample in (("baseline", baseline), ("candidate", candidate)):
        ArmMetricRollup.objects.update_or_create(
            cluster=canary.cluster,
            arm=name,
            minute=minute,
            defaults={
                "requests": sample.requests,
                "errors": sample.errors,
                "hotspot_fallbacks": sample.hotspot_fallbacks,
                "ttft_samples": sample.ttft_s,
                "tpot_samples": sample.tpot_s,
            },
        )


def router_answers(port: int) -> bool:
    """The router's HTTP server is up (503 is fine: it has no config from the control plane
    in this test, and says so)."""
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    except httpx.HTTPError:
        return False
    return True
