"""Many tenants on one fleet, in replay: the router's flow control against first come,
first served (FCFS) and against per-tenant rate limits alone.

    .venv/bin/python -m bench.fairness.run [--out bench/fairness] [--duration 120]

The replay simulator runs the live router's flow-control code (router_worker.routing.flow
and .quota). Fleet: :data:`INSTANCES` × H20 serving Qwen2-7B under LMetric; every request
has a 2000-token prompt and a 100-token answer, arrivals are Poisson per tenant. The
fleet's capacity (requests/s) is measured first: what it completes under a load far past
it. Goodput: requests/s meeting TTFT ≤ :data:`SLO` .ttft_s and TPOT ≤ .tpot_s.

Tables (each written to README.md):

1. Two tenants of equal weight; the flooding one sends 5× the compliant one's rate, the
   two together 2× the capacity: the compliant tenant's p90 TTFT and goodput against it
   running alone, Jain's index over the service each received (prompt + output tokens,
   each divided by its max-min fair share of what was served), per mode.
2. Three classes (critical, standard, sheddable), each at 2/3 of the capacity (2×
   overload): the critical class's p90 TTFT against FCFS and against it running alone.
3. The cost of fairness: total goodput with flow control against FCFS at 70% and 100% of
   the capacity (two tenants, 1:3).
4. Every request accounted for: served, 429, 503, lost, per run.
5. Flow control's CPU per request on a calm fleet (µs, this machine).
"""

from __future__ import annotations

import argparse
import json
import random
import timeit
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from enginesim.replay.metrics import Slo, slo_met, ttft_of
from enginesim.replay.simulator import RequestResult, SimConfig, Simulator
from enginesim.replay.traces import TraceRecord
from router_worker.routing import ClusterState
from router_worker.routing.flow import FleetLoad, FlowController, FlowParams, FlowRequest
from router_worker.routing.flow import TenantSettings as Tenant
from router_worker.routing.quota import QuotaLedger

INSTANCES = 4
POLICY = "lmetric"
PROMPT, OUTPUT = 2000, 100
SLO = Slo(ttft_s=2.0, tpot_s=0.1)
FLOW = FlowParams()  # the defaults
TIGHT = FlowParams(max_backlog_s=0.25)  # a quarter second of prefill queued at most
Rates = Mapping[str, tuple[float, str | None]]  # tenant -> (requests/s, priority asked)


def workload(rates: Rates, duration: float, seed: int = 0) -> list[TraceRecord]:
    rng = random.Random(seed)
    events = []
    for tenant, (rate, priority) in sorted(rates.items()):
        t = rng.expovariate(rate)
        while t < duration:
            events.append((t, tenant, priority))
            t += rng.expovariate(rate)
    events.sort()
    return [
        TraceRecord(k, t, PROMPT, OUTPUT, tenant=tenant, priority=priority)
        for k, (t, tenant, priority) in enumerate(events)
    ]


def replay(
    records: list[TraceRecord], flow: FlowParams | None, tenants: Sequence[Tenant] = ()
) -> list[RequestResult]:
    config = SimConfig(instances=INSTANCES, flow=flow, tenants=tuple(tenants))
    requests = Simulator(records, POLICY, config).run().requests
    for record, request in zip(records, requests, strict=True):
        request.tenant = record.tenant or request.tenant  # FCFS runs do not set it
    return requests


def capacity(duration: float) -> float:
    """Requests/s the fleet completes under a load far past what it can serve."""
    requests = replay(workload({"probe": (100.0, None)}, duration / 4), None)
    done = [r for r in requests if r.status == "ok"]
    return len(done) / max(r.finish_s or 0.0 for r in done)


def of(requests: list[RequestResult], tenant: str | None = None) -> list[RequestResult]:
    return [r for r in requests if tenant is None or r.tenant == tenant]


def p90(requests: list[RequestResult]) -> float:
    done = [ttft_of(r) for r in requests if r.status == "ok"]
    return float(np.percentile(done, 90)) if done else float("nan")


def goodput(requests: list[RequestResult], duration: float) -> float:
    return slo_met([r for r in requests if r.status == "ok"], SLO.ttft_s, SLO.tpot_s) / duration


def jain(requests: list[RequestResult], weights: Mapping[str, float], until: float) -> float:
    """Jain's index over each tenant's service while the overload lasts (tokens of its
    requests finished by ``until``, the last arrival) divided by its max-min fair share
    (weighted water-filling of what was served over what each asked for)."""
    served = dict.fromkeys(weights, 0.0)
    asked = dict.fromkeys(weights, 0.0)
    for r in requests:
        size = r.prompt_tokens + r.output_tokens_asked
        asked[r.tenant] += size
        if r.status == "ok" and r.finish_s is not None and r.finish_s <= until:
            served[r.tenant] += size
    fair = water_fill(sum(served.values()), asked, weights)
    x = np.array([served[t] / fair[t] for t in weights if fair[t] > 0])
    return float(x.sum() ** 2 / (len(x) * (x**2).sum()))


def water_fill(total: float, asked: Mapping[str, float], weights: Mapping[str, float]):
    fair = dict.fromkeys(asked, 0.0)
    open_ = set(asked)
    left = total
    while open_ and left > 1e-9:
        weight = sum(weights[t] for t in open_)
        share = {t: left * weights[t] / weight for t in open_}
        capped = {t for t in open_ if asked[t] - fair[t] <= share[t]}
        if not capped:
            for t in open_:
                fair[t] += share[t]
            break
        for t in capped:
            left -= asked[t] - fair[t]
            fair[t] = asked[t]
        open_ -= capped
    return fair


def fates(requests: list[RequestResult]) -> dict[str, int]:
    count = {"served": 0, "429": 0, "503": 0, "lost": 0}
    for r in requests:
        key = {"ok": "served", "throttled": "429", "shed": "503"}.get(r.status, "lost")
        count[key] += 1
    return count


def two_tenants(cap: float, duration: float) -> tuple[list[dict[str, Any]], dict]:
    compliant_rate = 2 * cap / 6  # 5x + 1x = 2x the capacity
    rates = {"compliant": (compliant_rate, None), "flood": (5 * compliant_rate, None)}
    records = workload(rates, duration)
    tenants = [Tenant(name="compliant"), Tenant(name="flood")]
    per_minute = int(cap / 2 * 60)  # each tenant's fair half, as a rate limit
    limited = [t.model_copy(update={"requests_per_minute": per_minute}) for t in tenants]
    solo = replay(workload({"compliant": (compliant_rate, None)}, duration), None)
    solo_p90, solo_good = p90(solo), goodput(solo, duration)
    modes = {
        "FCFS": replay(records, None),
        "rate limits alone": replay(records, FlowParams(enabled=False), limited),
        "flow control": replay(records, FLOW, tenants),
        "flow control, 0.25 s backlog": replay(records, TIGHT, tenants),
    }
    weights = {"compliant": 1.0, "flood": 1.0}
    rows = []
    for mode, requests in modes.items():
        compliant = of(requests, "compliant")
        rows.append(
            {
                "mode": mode,
                "compliant_p90_ttft_s": p90(compliant),
                "vs_solo": p90(compliant) / solo_p90,
                "compliant_goodput": goodput(compliant, duration),
                "compliant_goodput_solo": solo_good,
                "jain": jain(requests, weights, duration),
                "total_goodput": goodput(requests, duration),
                **fates(requests),
            }
        )
    return rows, {"solo_p90_ttft_s": solo_p90, "rates": rates}


def three_classes(cap: float, duration: float) -> list[dict[str, Any]]:
    rate = 2 * cap / 3
    rates = {
        "crit": (rate, None),
        "std": (rate, None),
        "shed": (rate, None),
    }
    records = workload(rates, duration)
    tenants = [
        Tenant(name="crit", priority="critical"),
        Tenant(name="std"),
        Tenant(name="shed", priority="sheddable"),
    ]
    unloaded = p90(replay(workload({"crit": (rate, None)}, duration), None))
    rows = []
    for mode, flow in (
        ("FCFS", None),
        ("flow control", FLOW),
        ("flow control, 0.25 s backlog", TIGHT),
    ):
        requests = replay(records, flow, tenants if flow else ())
        rows.append(
            {
                "mode": mode,
                "critical_p90_ttft_s": p90(of(requests, "crit")),
                "vs_unloaded": p90(of(requests, "crit")) / unloaded,
                "standard_p90_ttft_s": p90(of(requests, "std")),
                "sheddable_served": fates(of(requests, "shed"))["served"],
                **fates(requests),
            }
        )
    rows.append({"mode": "critical alone", "critical_p90_ttft_s": unloaded})
    return rows


def cost_of_fairness(cap: float, duration: float) -> list[dict[str, Any]]:
    rows = []
    tenants = [Tenant(name="a"), Tenant(name="b")]
    for load in (0.7, 1.0):
        total = load * cap
        records = workload({"a": (total / 4, None), "b": (3 * total / 4, None)}, duration)
        fcfs = replay(records, None)
        for name, params in (("flow control", FLOW), ("flow control, 0.25 s backlog", TIGHT)):
            flow = replay(records, params, tenants)
            rows.append(
                {
                    "load": load,
                    "mode": name,
                    "fcfs_goodput": goodput(fcfs, duration),
                    "flow_goodput": goodput(flow, duration),
                    "ratio": goodput(flow, duration) / max(goodput(fcfs, duration), 1e-9),
                    **{f"flow_{k}": v for k, v in fates(flow).items()},
                }
            )
    return rows


def cpu_per_request() -> dict[str, float]:
    """µs of flow control per request on a calm fleet: the load read, the offer (admitted
    at once) and the quota check, as the live gate runs them."""

    state = ClusterState()
    for k in range(16):
        state.add_instance(f"i{k}")
    controller = FlowController(FLOW, [Tenant(name="t", requests_per_minute=10**9)])
    quota = QuotaLedger()
    settings = controller.settings("t")
    request = FlowRequest("r", "t", "standard", 2000, 8000, 0.0)

    def one() -> None:
        quota.take(settings, 2000, 1.0)
        controller.offer(request, FleetLoad.of(state), 1.0)

    count = 20_000
    best = min(timeit.repeat(one, number=count, repeat=5))
    return {"us_per_request": best / count * 1e6, "instances": 16}


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> list[str]:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}"
        return "" if value is None else str(value)

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return out


def report(results: dict[str, Any]) -> str:
    cap = results["capacity_rps"]
    lines = [
        "# Many tenants on one fleet (replay)",
        "",
        "Generated by `python -m bench.fairness.run` (see its docstring for the method). "
        f"Fleet: {INSTANCES} × H20, Qwen2-7B, {POLICY}; requests of {PROMPT} prompt and "
        f"{OUTPUT} output tokens; {results['duration_s']:g} s of Poisson arrivals; measured "
        f"capacity {cap:.2f} requests/s. Goodput: requests/s meeting TTFT ≤ {SLO.ttft_s:g} s "
        f"and TPOT ≤ {SLO.tpot_s:g} s. Flow control at its defaults (`FlowParams()`: "
        f"saturated past {FLOW.max_backlog_s:g} s of queued prefill) and with "
        f"`max_backlog_s={TIGHT.max_backlog_s:g}`.",
        "",
        "## Two tenants of equal weight, one sending 5× the other, together 2× capacity",
        "",
        f"The compliant tenant alone: p90 TTFT {results['solo_p90_ttft_s']:.2f} s.",
        "",
        *table(
            results["two_tenants"],
            (
                "mode",
                "compliant_p90_ttft_s",
                "vs_solo",
                "compliant_goodput",
                "compliant_goodput_solo",
                "jain",
                "total_goodput",
            ),
        ),
        "",
        "## Three classes under 2× overload",
        "",
        *table(
            results["three_classes"],
            (
                "mode",
                "critical_p90_ttft_s",
                "vs_unloaded",
                "standard_p90_ttft_s",
                "sheddable_served",
            ),
        ),
        "",
        "## The cost of fairness: total goodput against FCFS",
        "",
        *table(results["cost"], ("load", "mode", "fcfs_goodput", "flow_goodput", "ratio")),
        "",
        "## Every request accounted for",
        "",
        *table(
            [{"run": f"two tenants, {r['mode']}", **r} for r in results["two_tenants"]]
            + [{"run": f"three classes, {r['mode']}", **r} for r in results["three_classes"][:-1]]
            + [
                {
                    "run": f"cost, load {r['load']}, {r['mode']}",
                    **{k[5:]: v for k, v in r.items() if k.startswith("flow_")},
                }
                for r in results["cost"]
            ],
            ("run", "served", "429", "503", "lost"),
        ),
        "",
        "## Flow control's CPU per request, fleet not saturated",
        "",
        f"{results['cpu']['us_per_request']:.1f} µs per request (the load read over "
        f"{results['cpu']['instances']} instances, the quota check and the offer; best of "
        "5 runs of 20,000 on this machine).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--duration", type=float, default=120.0)
    args = parser.parse_args(argv)
    cap = capacity(args.duration)
    two, extra = two_tenants(cap, args.duration)
    results = {
        "duration_s": args.duration,
        "capacity_rps": cap,
        "two_tenants": two,
        **extra,
        "three_classes": three_classes(cap, args.duration),
        "cost": cost_of_fairness(cap, args.duration),
        "cpu": cpu_per_request(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = report(results)
    (args.out / "README.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
