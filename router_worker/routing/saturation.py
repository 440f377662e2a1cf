"""Fleet saturation: how far behind a cluster's instances are, as one router sees them.

The autoscaling signal (README, "Dashboards, alerts, traces and autoscaling"): the router
exports it as Prometheus gauges that an HPA or KEDA scales on; it is a function of the
view alone, so the replay simulator can compute it too. Over the instances eligible for
routing (healthy):

* ``pending_prefill_s``: the mean over them of pending prefill tokens ÷ that instance's
  effective prefill throughput (``ClusterView.prefill_tps``): seconds of queued prefill
  work each holds, the part of TTFT that grows when the fleet is short of instances;
* ``kv_pressure``: the mean KV cache usage (0-1) the engines report, over the instances
  that reported one (0 when none has): a fleet near 1 preempts and recomputes;
* ``instances``: how many are eligible.

A mean, not a maximum, so that the signal falls as instances are added, which is what an
autoscaler's ratio (current × signal / target) assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from router_worker.routing.indicators import ClusterView


@dataclass(frozen=True)
class Saturation:
    instances: int
    pending_prefill_s: float
    kv_pressure: float


def fleet_saturation(view: ClusterView) -> Saturation:
    eligible = view.eligible
    count = int(eligible.sum())
    if count == 0:
        return Saturation(0, 0.0, 0.0)
    tps = view.prefill_tps[eligible]
    pending = view.pending_prefill[eligible] / np.where(tps > 0, tps, np.inf)
    usage = view.kv_usage[eligible]
    reported = usage[~np.isnan(usage)]
    kv = float(reported.mean()) if reported.size else 0.0
    return Saturation(count, float(pending.mean()), kv)
