"""Router-like state snapshots and events, written the way routers write them."""

from __future__ import annotations

import time

import redis

from router_worker.telemetry_contract import (
    EVENTS_STREAM,
    STATE_TTL_S,
    EventKind,
    InstanceSnapshot,
    RouterEvent,
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
) -> RouterEvent:
    event = RouterEvent.new(cluster, router, kind, time.time(), **payload)
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
