"""A cluster's traffic captures (their salts never leave the database through here)."""

from __future__ import annotations

from typing import Any

import numpy as np
from django.db.models import QuerySet

from controlplane.models import Cluster, TrafficCapture
from engine_interface.stats import percentile

from .clusters import cluster


def captures(cluster_id: int) -> QuerySet[TrafficCapture]:
    """Newest first."""
    return cluster(cluster_id).captures.order_by("-started_at", "-id").defer("salt")


def running(cluster_id: int) -> TrafficCapture | None:
    return captures(cluster_id).filter(state=TrafficCapture.State.CAPTURING).first()


def replayable(cluster_id: int) -> list[TrafficCapture]:
    """Captures holding requests, which a replay can take as its trace."""
    return list(captures(cluster_id).filter(requests__gt=0))


def capture(cluster_id: int, capture_id: int) -> TrafficCapture | None:
    return captures(cluster_id).filter(pk=capture_id).first()


def capture_document(cluster: Cluster) -> dict[str, Any] | None:
    """The ``capture`` section of the cluster's router config, while one runs."""
    running = cluster.captures.filter(state=TrafficCapture.State.CAPTURING).first()
    return None if running is None else {"id": running.pk, "salt": running.salt}


# ----------------------------------------------------------------- what a replay takes


def stored_rows(capture: TrafficCapture, until: int | None) -> Any:
    """The capture's stored rows, as far as ``until`` (a replay job's pin) if given."""
    rows = capture.rows.all()
    return rows.filter(pk__lte=until) if until is not None else rows


def last_row(capture: TrafficCapture) -> int:
    """The newest stored row's id: a replay job pins the capture there, so all its cells
    (and its fidelity check) replay the same requests while the capture goes on."""
    return capture.rows.order_by("-pk").values_list("pk", flat=True).first() or 0


def replay_max_model_len(trace: str) -> int | None:
    """The context length a replay of ``trace`` runs its engines with: for a capture, the
    one its routers scraped from the live engines (None: the model's own)."""
    if not trace.startswith("capture:"):
        return None
    name = trace.split(":", 1)[1]
    if not (name.isascii() and name.isdigit()):
        return None
    values = TrafficCapture.objects.filter(pk=int(name)).values_list("max_model_len", flat=True)
    return next(iter(values), None)


FIDELITY_METRICS = ("ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s")
WHOLE_CLUSTER_ARM = "default"  # router_worker.runtime.DEFAULT_ARM: no canary split it


def replayed_rows(capture: TrafficCapture, max_requests: int | None, until: int | None) -> Any:
    """The rows a replay of the capture takes: its first ``max_requests`` by arrival, as
    far as the job pinned it, in the replay's order."""
    rows = stored_rows(capture, until).order_by("at", "pk")
    return rows[:max_requests] if max_requests else rows


def whole_cluster_versions(
    capture_id: int, max_requests: int | None, until: int | None = None
) -> tuple[int, dict[int, int], int]:
    """Of the requests a replay of the capture takes: how many, how many were routed under
    each config version on the whole cluster (no canary arm), and how many carry no config
    version (captured by routers older than the field)."""
    capture = TrafficCapture.objects.filter(pk=capture_id).first()
    if capture is None:
        return 0, {}, 0
    taken = list(replayed_rows(capture, max_requests, until).values_list("config_version", "arm"))
    by_version: dict[int, int] = {}
    for version, arm in taken:
        if version is not None and arm == WHOLE_CLUSTER_ARM:
            by_version[version] = by_version.get(version, 0) + 1
    return len(taken), by_version, sum(version is None for version, _ in taken)


def selected_positions(
    capture_id: int, max_requests: int | None, until: int | None, versions: list[int]
) -> set[int]:
    """Positions, in the replay's order (its requests' indices), of the requests routed
    under one of ``versions`` on the whole cluster."""
    capture = TrafficCapture.objects.filter(pk=capture_id).first()
    if capture is None:
        return set()
    wanted = set(versions)
    rows = replayed_rows(capture, max_requests, until).values_list("config_version", "arm")
    return {
        position
        for position, (version, arm) in enumerate(rows)
        if version in wanted and arm == WHOLE_CLUSTER_ARM
    }


def live_latencies(
    capture_id: int,
    max_requests: int | None,
    until: int | None = None,
    versions: list[int] | None = None,
) -> dict[str, Any] | None:
    """What the routers measured for the requests a replay of the capture takes (its first
    ``max_requests`` by arrival), in the engines' own time: mean and p99 TTFT and TPOT of
    the answered ones (TTFT and TPOT are measured on streams). ``versions``: only those
    routed under one of these config versions on the whole cluster (one policy's)."""
    capture = TrafficCapture.objects.filter(pk=capture_id).first()
    if capture is None:
        return None
    rows = replayed_rows(capture, max_requests, until).values_list(
        "config_version", "arm", "status", "ttft_s", "tpot_s"
    )
    wanted = None if versions is None else set(versions)
    taken = [
        (status, ttft, tpot)
        for version, arm, status, ttft, tpot in rows
        if wanted is None or (version in wanted and arm == WHOLE_CLUSTER_ARM)
    ]
    scale = capture.engine_time_scale or 1.0
    ttft = [t / scale for status, t, _ in taken if status == 200 and t is not None]
    tpot = [t / scale for status, _, t in taken if status == 200 and t is not None]
    if not ttft:
        return None
    return {
        "requests": len(taken),
        "measured": len(ttft),
        "ttft_mean_s": float(np.mean(ttft)),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": float(np.mean(tpot)) if tpot else None,
        "tpot_p99_s": percentile(tpot, 99),
    }
