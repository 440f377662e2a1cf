"""Router-like state snapshots and events, written the way routers write them; replay jobs
as their cells leave them."""

from __future__ import annotations

import time

import redis

from controlplane.models import ReplayCell, ReplayJob
from controlplane.services import replay_cells
from router_worker.telemetry_contract import (
    EVENTS_STREAM,
    STATE_TTL_S,
    EventKind,
    EventRecord,
    InstanceSnapshot,
    StateSnapshot,
    WindowStats,
    dumps_state,
    state_key,
)


def instance(
    name: str, pending: float = 0, pending_max: float | None = None, batch: float = 0, **extra
) -> InstanceSnapshot:
    return InstanceSnapshot(
        name=name,
        health=extra.pop("health", "healthy"),
        pending_prefill_tokens=pending,
        pending_prefill_tokens_max=pending if pending_max is None else pending_max,
        batch_size=batch,
        batch_size_max=extra.pop("batch_max", batch),
        in_flight=extra.pop("in_flight", 0),
        **extra,
    )


def window(requests: int = 10, **stats) -> WindowStats:
    base = {
        "seconds": 30.0,
        "requests": requests,
        "errors": 0,
        "requests_per_s": requests / 30,
        "output_tokens_per_s": 100.0,
    }
    return WindowStats(**{**base, **stats})


def snapshot(
    cluster: str,
    router: str,
    instances: list[InstanceSnapshot],
    *,
    ts: float | None = None,
    version: int | None = 1,
    policy: str = "lmetric",
    **extra,
) -> StateSnapshot:
    return StateSnapshot(
        ts=time.time() if ts is None else ts,
        cluster=cluster,
        router=router,
        config_version=version,
        policy=policy,
        instances=instances,
        window=extra.pop("window", window()),
        **extra,
    )


def write_state(client: redis.Redis, snap: StateSnapshot) -> None:
    client.set(state_key(snap.cluster, snap.router), dumps_state(snap), ex=STATE_TTL_S)


def write_event(
    client: redis.Redis, cluster: str, kind: EventKind, router: str = "r1", **payload
) -> EventRecord:
    event = EventRecord.new(cluster, router, kind, time.time(), **payload)
    client.xadd(EVENTS_STREAM, event.to_stream_fields())  # type: ignore[arg-type]  # stub: invariant dict
    return event


def hotspot_payload(transition: str = "confirmed", prefix_class: str = "c7") -> dict:
    return {
        "transition": transition,
        "prefix_class": prefix_class,
        "prefix_hash": "ab12cd34ef",
        "x": 4.0,
        "x_bar": 1.0,
        "m": 1,
        "m_bar": 3,
        "window": 30.0,
        "instances": ["i0"],
    }


# ----- replay jobs as their cells leave them ------------------------------------------------
def replay_summary(goodput: float) -> dict:
    return {"requests": 100, "completed": 100, "goodput_rps": goodput, "ttft_mean_s": 0.5}


def finished_job(cluster, goodputs: dict[str, list[list[float]]]) -> ReplayJob:
    """A job over the cluster's policies (by name) whose cells measured these goodputs,
    per policy a list over loads (×1, ×1.5) of per-seed values."""
    chosen = [p for p in cluster.policies.order_by("name") if p.name in goodputs]
    inputs = {
        "trace": "shared:x.jsonl",
        "policies": [p.spec() for p in chosen],
        "policy_ids": [p.pk for p in chosen],
        "active_policy_id": cluster.active_policy_id,
        "rate_scales": [1.0, 1.5],
        "seeds": [0, 1, 2],
    }
    job = ReplayJob.objects.create(cluster=cluster, inputs=inputs)
    for cell in replay_cells.create_cells(job):
        value = goodputs[chosen[cell.policy].name][inputs["rate_scales"].index(cell.rate_scale)]
        result = {
            "summary": replay_summary(value[cell.seed]),
            "ttft_percentiles": None,
            "instances": 3,
            "requests": 100,
            "percentiles": [50],
            "lower_bound": {},
        }
        ReplayCell.objects.filter(pk=cell.pk).update(state="succeeded", result=result)
    assert replay_cells.finish_job(job.pk) == "succeeded"
    job.refresh_from_db()
    return job
