"""Many tenants on one fleet, in replay: the router's flow control against first come,
first served (FCFS) and against per-tenant rate limits alone.

    .venv/bin/python -m bench.fairness.run [--out bench/fairness] [--duration 120]

The replay simulator runs the live router's flow-control code (router_worker.routing.flow
and .quota). Fleet: :data:`INSTANCES` × H20 serving Qwen2-7B under LMetric; every request
has a 2000-token prompt and a 100-token answer, arrivals are Poisson per tenant. The
fleet's capacity (requests/s) is measured first: what it completes under a load far past
it. Goodput: requests/s meeting TTFT ≤ :data:`SLO` .ttft_s and TPOT ≤ .tpot_s (or the TPOT
SLO a table names).

Modes: FCFS (no flow control), flow control at its defaults (no TPOT SLO: the backlog
bound stays ``max_backlog_s``), with ``max_backlog_s`` 0.25 s, and with the TPOT leg
(``tpot_slo_s`` set to the SLO goodput is scored against: the backlog bound adapts, AIMD,
to keep the engines' measured step time under ``tpot_target`` × the SLO).

Tables (each written to README.md):

1. Two tenants of equal weight; the flooding one sends 5× the compliant one's rate, the
   two together 2× the capacity: the compliant tenant's p90 TTFT and goodput against it
   running alone, Jain's index over the service each received (prompt + output tokens,
   each divided by its max-min fair share of what was served), per mode.
2. The same across overloads (:data:`OVERLOADS`): the compliant tenant keeps its rate (a
   third of the capacity, as at 2×), the flood sends the rest.
3. Three classes (critical, standard, sheddable): the critical class at 2/3 of the
   capacity, the two others sharing the rest of each overload: the critical class's p90
   TTFT against it running alone.
4. The cost of fairness: total goodput with flow control against FCFS at 70% and 100% of
   the capacity (two tenants, 1:3).
5. The TPOT leg under other TPOT SLOs (:data:`TPOT_SLOS`), everything scored against it.
6. How ``tpot_target`` was chosen: on the selection cells only (two tenants at 1.5× and
   2.5×, TPOT SLO 0.1 s); every other cell above is held out.
7. Every request accounted for: served, 429, 503, lost, per run.
8. Flow control's CPU per request on a calm fleet (µs, this machine).
"""

from __future__ import annotations

import argparse
import json
import os
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
OVERLOADS = (1.5, 2.0, 2.5, 3.0)
LOADS = (0.7, 1.0)
TPOT_SLOS = (0.05, 0.1, 0.2)
TARGETS = (0.5, 0.6, 0.7, 0.8, 0.9)  # tpot_target's candidates
# Where tpot_target is chosen: two tenants at these overloads, this TPOT SLO.
SELECTION_OVERLOADS = (1.5, 2.5)
SELECTION_SLO_S = 0.1
Rates = Mapping[str, tuple[float, str | None]]  # tenant -> (requests/s, priority asked)


def tpot_leg(tpot_slo_s: float, **params: float) -> FlowParams:
    """Flow control at its defaults with the TPOT SLO set (the leg on)."""
    return FlowParams(tpot_slo_s=tpot_slo_s, **params)


def modes(slo_s: float = SLO.tpot_s) -> dict[str, FlowParams]:
    return {
        "flow control": FLOW,
        "flow control, 0.25 s backlog": TIGHT,
        f"flow control, TPOT SLO {slo_s:g} s": tpot_leg(slo_s),
    }


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


_RUNS: dict[tuple[str, str, str], list[RequestResult]] = {}


def replay(
    records: list[TraceRecord], flow: FlowParams | None, tenants: Sequence[Tenant] = ()
) -> list[RequestResult]:
    """The replay's requests (memoised: tables share runs)."""
    key = (
        json.dumps([(r.arrival_s, r.tenant, r.priority) for r in records]),
        "" if flow is None else flow.model_dump_json(),
        json.dumps([t.model_dump() for t in tenants]),
    )
    if key in _RUNS:
        return _RUNS[key]
    config = SimConfig(instances=INSTANCES, flow=flow, tenants=tuple(tenants))
    requests = Simulator(records, POLICY, config).run().requests
    for record, request in zip(records, requests, strict=True):
        request.tenant = record.tenant or request.tenant  # FCFS runs do not set it
    _RUNS[key] = requests
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


def goodput(requests: list[RequestResult], duration: float, tpot_s: float = SLO.tpot_s) -> float:
    return slo_met([r for r in requests if r.status == "ok"], SLO.ttft_s, tpot_s) / duration


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


def two_tenant_records(cap: float, over: float, duration: float) -> list[TraceRecord]:
    """The compliant tenant at a third of the capacity (2 × cap / 6), the flood at the rest
    of ``over`` × cap (5× the compliant one at 2×)."""
    compliant_rate = 2 * cap / 6
    rates = {
        "compliant": (compliant_rate, None),
        "flood": (over * cap - compliant_rate, None),
    }
    return workload(rates, duration)


TWO = [Tenant(name="compliant"), Tenant(name="flood")]


def two_tenant_row(
    requests: list[RequestResult],
    solo: list[RequestResult],
    duration: float,
    tpot_s: float = SLO.tpot_s,
) -> dict[str, Any]:
    compliant = of(requests, "compliant")
    return {
        "compliant_p90_ttft_s": p90(compliant),
        "vs_solo": p90(compliant) / p90(solo),
        "compliant_goodput": goodput(compliant, duration, tpot_s),
        "compliant_goodput_solo": goodput(solo, duration, tpot_s),
        "jain": jain(requests, {"compliant": 1.0, "flood": 1.0}, duration),
        "total_goodput": goodput(requests, duration, tpot_s),
        **fates(requests),
    }


def solo_run(cap: float, duration: float) -> list[RequestResult]:
    return replay(workload({"compliant": (2 * cap / 6, None)}, duration), None)


def two_tenants(cap: float, duration: float) -> tuple[list[dict[str, Any]], dict]:
    records = two_tenant_records(cap, 2.0, duration)
    per_minute = int(cap / 2 * 60)  # each tenant's fair half, as a rate limit
    limited = [t.model_copy(update={"requests_per_minute": per_minute}) for t in TWO]
    solo = solo_run(cap, duration)
    runs = {
        "FCFS": replay(records, None),
        "rate limits alone": replay(records, FlowParams(enabled=False), limited),
        **{mode: replay(records, params, TWO) for mode, params in modes().items()},
    }
    rows = [
        {"mode": mode, **two_tenant_row(requests, solo, duration)}
        for mode, requests in runs.items()
    ]
    return rows, {"solo_p90_ttft_s": p90(solo)}


def overloads(cap: float, duration: float) -> list[dict[str, Any]]:
    solo = solo_run(cap, duration)
    rows = []
    for over in OVERLOADS:
        records = two_tenant_records(cap, over, duration)
        for mode, params in modes().items():
            requests = replay(records, params, TWO)
            rows.append(
                {"overload": over, "mode": mode, **two_tenant_row(requests, solo, duration)}
            )
    return rows


def three_classes(cap: float, duration: float) -> list[dict[str, Any]]:
    tenants = [
        Tenant(name="crit", priority="critical"),
        Tenant(name="std"),
        Tenant(name="shed", priority="sheddable"),
    ]
    crit = 2 * cap / 3
    unloaded = p90(replay(workload({"crit": (crit, None)}, duration), None))
    rows = []
    for over in OVERLOADS:
        rest = (over * cap - crit) / 2
        rates = {"crit": (crit, None), "std": (rest, None), "shed": (rest, None)}
        records = workload(rates, duration)
        runs = {"FCFS": None} if over == 2.0 else {}
        for mode, flow in {**runs, **modes()}.items():
            requests = replay(records, flow, tenants if flow else ())
            rows.append(
                {
                    "overload": over,
                    "mode": mode,
                    "critical_p90_ttft_s": p90(of(requests, "crit")),
                    "vs_unloaded": p90(of(requests, "crit")) / unloaded,
                    "critical_goodput": goodput(of(requests, "crit"), duration),
                    "standard_p90_ttft_s": p90(of(requests, "std")),
                    "sheddable_served": fates(of(requests, "shed"))["served"],
                    "total_goodput": goodput(requests, duration),
                    **fates(requests),
                }
            )
    rows.append({"mode": "critical alone", "critical_p90_ttft_s": unloaded})
    return rows


def load_records(cap: float, load: float, duration: float) -> list[TraceRecord]:
    total = load * cap
    return workload({"a": (total / 4, None), "b": (3 * total / 4, None)}, duration)


TENANTS_AB = [Tenant(name="a"), Tenant(name="b")]


def cost_of_fairness(cap: float, duration: float) -> list[dict[str, Any]]:
    rows = []
    for load in LOADS:
        records = load_records(cap, load, duration)
        fcfs = replay(records, None)
        for name, params in modes().items():
            flow = replay(records, params, TENANTS_AB)
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


def other_slos(cap: float, duration: float) -> list[dict[str, Any]]:
    """The TPOT leg set to each TPOT SLO, scored against it; beside flow control without
    it (the same runs for every SLO, scored against each)."""
    solo = solo_run(cap, duration)
    rows = []
    for slo_s in TPOT_SLOS:
        for over in OVERLOADS:
            records = two_tenant_records(cap, over, duration)
            for mode, params in (("flow control", FLOW), ("TPOT leg", tpot_leg(slo_s))):
                requests = replay(records, params, TWO)
                row = two_tenant_row(requests, solo, duration, slo_s)
                rows.append(
                    {"tpot_slo_s": slo_s, "cell": f"two tenants, {over:g}×", "mode": mode, **row}
                )
        for load in LOADS:
            records = load_records(cap, load, duration)
            fcfs = goodput(replay(records, None), duration, slo_s)
            for mode, params in (("flow control", FLOW), ("TPOT leg", tpot_leg(slo_s))):
                requests = replay(records, params, TENANTS_AB)
                rows.append(
                    {
                        "tpot_slo_s": slo_s,
                        "cell": f"load {load:g}",
                        "mode": mode,
                        "total_goodput": goodput(requests, duration, slo_s),
                        "fcfs_goodput": fcfs,
                        "vs_fcfs": goodput(requests, duration, slo_s) / max(fcfs, 1e-9),
                        "jain": jain(requests, {"a": 1.0, "b": 1.0}, duration),
                        **fates(requests),
                    }
                )
    return rows


def selection(cap: float, duration: float) -> dict[str, Any]:
    """The TPOT leg for each ``tpot_target`` candidate on the selection cells."""
    solo = solo_run(cap, duration)
    slo_s = SELECTION_SLO_S
    rows = []
    for target in TARGETS:
        for over in SELECTION_OVERLOADS:
            records = two_tenant_records(cap, over, duration)
            requests = replay(records, tpot_leg(slo_s, tpot_target=target), TWO)
            row = two_tenant_row(requests, solo, duration, slo_s)
            share = row["compliant_goodput"] / row["compliant_goodput_solo"]
            rows.append({"tpot_target": target, "overload": over, "share_of_solo": share, **row})
    return {"rows": rows, "chosen": choose(rows), "default": FlowParams().tpot_target}


def choose(rows: list[dict[str, Any]]) -> float:
    """The candidate whose worst selection cell gives the compliant tenant the largest
    share of its solo goodput; ties (to 3 digits) go to the lower worst p90 TTFT against
    solo, then to the larger total goodput over the cells."""

    def score(target: float) -> tuple[float, float, float]:
        cells = [r for r in rows if r["tpot_target"] == target]
        return (
            round(min(r["share_of_solo"] for r in cells), 3),
            -max(r["vs_solo"] for r in cells),
            sum(r["total_goodput"] for r in cells),
        )

    return max(sorted({r["tpot_target"] for r in rows}), key=score)


def cpu_per_request() -> dict[str, Any]:
    """µs of flow control per request on a calm fleet: the load read, the offer (admitted
    at once) and the quota check, as the live gate runs them; without a TPOT SLO and with
    one (its leg moves the bound on every offer: the clock advances a millisecond a
    request, the engines' step time is known and under target)."""
    state = ClusterState()
    for k in range(16):
        state.add_instance(f"i{k}")
        state.on_scrape(f"i{k}", 0.0, itl_totals=(0.0, 0.0))
        state.on_scrape(f"i{k}", 1.0, itl_totals=(2.0, 100.0))
    return {
        "instances": 16,
        "us_per_request": _cpu(FLOW, state),
        "us_per_request_tpot": _cpu(tpot_leg(0.1), state),
        "load_average": os.getloadavg()[0],
    }


def _cpu(params: FlowParams, state: ClusterState) -> float:
    controller = FlowController(params, [Tenant(name="t", requests_per_minute=10**9)])
    quota = QuotaLedger()
    settings = controller.settings("t")
    request = FlowRequest("r", "t", "standard", 2000, 8000, 0.0)
    clock = [1.0]

    def one() -> None:
        clock[0] += 0.001
        quota.take(settings, 2000, clock[0])
        controller.offer(request, FleetLoad.of(state), clock[0])

    count = 20_000
    return min(timeit.repeat(one, number=count, repeat=5)) / count * 1e6


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
    chosen = results["selection"]
    cpu = results["cpu"]
    slo = SLO.tpot_s
    two_columns = (
        "mode",
        "compliant_p90_ttft_s",
        "vs_solo",
        "compliant_goodput",
        "compliant_goodput_solo",
        "jain",
        "total_goodput",
    )
    lines = [
        "# Many tenants on one fleet (replay)",
        "",
        "Generated by `python -m bench.fairness.run` (see its docstring for the method). "
        f"Fleet: {INSTANCES} × H20, Qwen2-7B, {POLICY}; requests of {PROMPT} prompt and "
        f"{OUTPUT} output tokens; {results['duration_s']:g} s of Poisson arrivals; measured "
        f"capacity {cap:.2f} requests/s. Goodput: requests/s meeting TTFT ≤ {SLO.ttft_s:g} s "
        f"and TPOT ≤ {slo:g} s (unless a table names another TPOT SLO). Flow control at "
        f"its defaults (`FlowParams()`: saturated past {FLOW.max_backlog_s:g} s of queued "
        f"prefill), with `max_backlog_s={TIGHT.max_backlog_s:g}`, and with the TPOT leg "
        f"(`tpot_slo_s` set to the TPOT SLO: the backlog bound adapts, AIMD, to keep the "
        f"engines' measured step time under `tpot_target` = {FlowParams().tpot_target:g} "
        "× the SLO).",
        "",
        f"**Held out.** `tpot_target` was chosen on two cells only (two tenants at "
        f"{' and '.join(f'{o:g}×' for o in SELECTION_OVERLOADS)}, TPOT SLO "
        f"{SELECTION_SLO_S:g} s; table below): chosen {chosen['chosen']:g}, the "
        f"default {chosen['default']:g}. Every other cell (2× and 3×, the three classes, "
        "the loads, the other SLOs) is held out.",
        "",
        "## Two tenants of equal weight, one sending 5× the other, together 2× capacity",
        "",
        f"The compliant tenant alone: p90 TTFT {results['solo_p90_ttft_s']:.2f} s.",
        "",
        *table(results["two_tenants"], two_columns),
        "",
        "## Two tenants across overloads",
        "",
        "The compliant tenant keeps its rate (a third of the capacity); the flood sends the "
        "rest of each overload (at 2× the table above).",
        "",
        *table(results["overloads"], ("overload", *two_columns)),
        "",
        "## Three classes",
        "",
        "The critical class at 2/3 of the capacity (alone: the last row); standard and "
        "sheddable share the rest of each overload (at 2×, each class 2/3).",
        "",
        *table(
            results["three_classes"],
            (
                "overload",
                "mode",
                "critical_p90_ttft_s",
                "vs_unloaded",
                "critical_goodput",
                "standard_p90_ttft_s",
                "sheddable_served",
                "total_goodput",
            ),
        ),
        "",
        "## The cost of fairness: total goodput against FCFS",
        "",
        *table(results["cost"], ("load", "mode", "fcfs_goodput", "flow_goodput", "ratio")),
        "",
        "## The TPOT leg under other TPOT SLOs",
        "",
        "Each SLO's TPOT leg (`tpot_slo_s` set to it) against flow control without it, both "
        "scored against that SLO; two tenants as above (the compliant tenant's goodput "
        "alone under that SLO beside it), and the 1:3 pair at loads 0.7 and 1.0 against "
        "FCFS.",
        "",
        *table(
            results["other_slos"],
            (
                "tpot_slo_s",
                "cell",
                "mode",
                "compliant_p90_ttft_s",
                "compliant_goodput",
                "compliant_goodput_solo",
                "total_goodput",
                "fcfs_goodput",
                "vs_fcfs",
                "jain",
            ),
        ),
        "",
        "## Choosing tpot_target (the selection cells)",
        "",
        "Each candidate's worst selection cell decides: the compliant tenant's goodput as a "
        "share of its solo goodput; ties (to 3 digits) go to the lower worst p90 TTFT "
        "against solo, then to the larger total goodput.",
        "",
        *table(
            chosen["rows"],
            (
                "tpot_target",
                "overload",
                "share_of_solo",
                "vs_solo",
                "compliant_p90_ttft_s",
                "total_goodput",
            ),
        ),
        "",
        "## Every request accounted for",
        "",
        *table(
            [{"run": f"two tenants, {r['mode']}", **r} for r in results["two_tenants"]]
            + [
                {"run": f"two tenants {r['overload']:g}×, {r['mode']}", **r}
                for r in results["overloads"]
            ]
            + [
                {"run": f"three classes {r['overload']:g}×, {r['mode']}", **r}
                for r in results["three_classes"][:-1]
            ]
            + [
                {
                    "run": f"cost, load {r['load']}, {r['mode']}",
                    **{k[5:]: v for k, v in r.items() if k.startswith("flow_")},
                }
                for r in results["cost"]
            ]
            + [
                {"run": f"TPOT SLO {r['tpot_slo_s']:g} s, {r['cell']}, {r['mode']}", **r}
                for r in results["other_slos"]
            ],
            ("run", "served", "429", "503", "lost"),
        ),
        "",
        "## Flow control's CPU per request, fleet not saturated",
        "",
        f"{cpu['us_per_request']:.1f} µs per request without a TPOT SLO, "
        f"{cpu['us_per_request_tpot']:.1f} µs with the TPOT leg (the load read over "
        f"{cpu['instances']} instances, the quota check and the offer; best of 5 runs of "
        f"20,000 on this machine, its load average {cpu['load_average']:.1f} on 2 cores).",
        "",
    ]
    return "\n".join(lines)


LIVE = "## Live:"  # bench/fairness/live.py appends its sections; a rerun here keeps them


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="rewrite README.md from the results.json in --out (no replay)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_results:
        results = json.loads((args.out / "results.json").read_text())
        results["selection"]["chosen"] = choose(results["selection"]["rows"])
    else:
        results = run_all(args.duration)
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = report(results)
    readme = args.out / "README.md"
    old = readme.read_text() if readme.exists() else ""
    live = old[old.index(LIVE) :] if LIVE in old else ""
    readme.write_text(text + ("\n" + live if live else ""))
    print(text)
    return 0


def run_all(duration: float) -> dict[str, Any]:
    cap = capacity(duration)
    two, extra = two_tenants(cap, duration)
    return {
        "duration_s": duration,
        "capacity_rps": cap,
        "two_tenants": two,
        **extra,
        "selection": selection(cap, duration),
        "overloads": overloads(cap, duration),
        "three_classes": three_classes(cap, duration),
        "cost": cost_of_fairness(cap, duration),
        "other_slos": other_slos(cap, duration),
        "cpu": cpu_per_request(),
    }


if __name__ == "__main__":
    raise SystemExit(main())
