"""Many tenants on one fleet, live: the two-tenant and three-class tables of
bench/fairness/run.py against a real router in front of enginesim instances (wall clock,
real HTTP, this machine).

    .venv/bin/python -m bench.fairness.live [--duration 40] [--tables two,three] [--out DIR]

Fleet: :data:`INSTANCES` enginesim instances (H20, Qwen2-7B) at time scale
:data:`TIME_SCALE` (slowed, so the clients and the router stay cheap beside the engines);
one router (LMetric). The fleet's capacity is the replay's (bench/fairness/run.py's
measurement on the same fleet) over the time scale. Each request is a unique 2000-token
prompt and 100 output tokens, streamed; TTFT and TPOT are measured by the client. Modes:
FCFS (flow control off), flow control with a 0.25 s prefill backlog, and flow control with
the TPOT leg (``tpot_slo_s``: run.py's SLO as it is, since the engines' /metrics report
simulated seconds at any time scale), plus a baseline alone. Goodput: requests/s (wall)
meeting run.py's SLO × the time scale (the clients measure wall seconds).

* **two**: the compliant tenant sends a third of the capacity, the flooding one five times
  that (together 2× the capacity); baseline: the compliant tenant alone.
* **three**: one tenant per class (critical, standard, sheddable), each at 2/3 of the
  capacity (2× overload); baseline: the critical tenant alone (its unloaded p90).

Every request's fate is counted: served, 429, 503, lost (no answer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.fairness.run import INSTANCES, SLO, capacity
from devharness import Fleet, start_router

TIME_SCALE = 2.0
MODEL = "Qwen/Qwen2-7B-Instruct"
FILLER = "lorem " * 1330  # ~2000 tokens with the approximate tokenizer (4 bytes a token)
KEYS = {
    "compliant": "syk_complnt0_" + "c" * 40,
    "flood": "syk_flood000_" + "f" * 40,
    "crit": "syk_critical_" + "k" * 40,
    "std": "syk_standard_" + "s" * 40,
    "shed": "syk_shedable_" + "h" * 40,
}
TENANTS = [
    {"name": "compliant"},
    {"name": "flood", "max_queued": 1024},
    {"name": "crit", "priority": "critical", "max_queued": 1024},
    {"name": "std", "max_queued": 1024},
    {"name": "shed", "priority": "sheddable"},
]


def router_config(fleet: Fleet, flow: dict[str, Any]) -> dict[str, Any]:
    import hashlib

    keys = [
        {"sha256": hashlib.sha256(key.encode()).hexdigest(), "tenant": tenant}
        for tenant, key in KEYS.items()
    ]
    return {
        "cluster": "fairness",
        "model": MODEL,
        "instances": fleet.instances(),
        "policy": {"kind": "lmetric"},
        "router": {"kv_events": False, "max_concurrency": 4096, "max_queue": 4096},
        "client_auth": {"required": True, "keys": keys},
        "tenants": TENANTS,
        "flow": flow,
    }


Result = tuple[str, int, float | None, float | None]  # tenant, status, TTFT, TPOT


async def one(client: httpx.AsyncClient, url: str, tenant: str) -> Result:
    body = {
        "model": MODEL,
        "prompt": f"{uuid.uuid4().hex} {FILLER}",
        "max_tokens": 100,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    start = time.monotonic()
    first = last = None
    tokens = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            async for chunk in response.aiter_bytes():
                count = chunk.count(b'"text":"')
                if count:
                    last = time.monotonic() - start
                    first = last if first is None else first
                    tokens += count
            tpot = (last - first) / (tokens - 1) if first and last and tokens > 1 else None
            return tenant, response.status_code, first, tpot
    except httpx.HTTPError:
        return tenant, 0, None, None  # lost: no answer


async def load(url: str, rates: dict[str, float], duration: float) -> list[tuple]:
    rng = random.Random(0)
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        tasks = []
        begin = time.monotonic()
        arrivals = sorted(
            (t, tenant)
            for tenant, rate in rates.items()
            for t in np.cumsum([rng.expovariate(rate) for _ in range(int(rate * duration * 2))])
            if t < duration
        )
        for at, tenant in arrivals:
            delay = begin + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, url, tenant)))
        return list(await asyncio.gather(*tasks))


def summarise(results: list[tuple], tenant: str, duration: float) -> dict[str, Any]:
    own = [r for r in results if r[0] == tenant]
    ttfts = [r[2] for r in own if r[1] == 200 and r[2] is not None]
    tpots = [r[3] for r in own if r[1] == 200 and r[3] is not None]
    good = sum(
        r[1] == 200
        and r[2] is not None
        and r[2] <= SLO.ttft_s * TIME_SCALE
        and (r[3] is None or r[3] <= SLO.tpot_s * TIME_SCALE)
        for r in own
    )
    return {
        "requests": len(own),
        "p90_ttft_s": float(np.percentile(ttfts, 90)) if ttfts else None,
        "p90_tpot_s": float(np.percentile(tpots, 90)) if tpots else None,
        "goodput": good / duration,
        "served": sum(r[1] == 200 for r in own),
        "429": sum(r[1] == 429 for r in own),
        "503": sum(r[1] == 503 for r in own),
        "lost": sum(r[1] not in (200, 429, 503) for r in own),
    }


Runs = dict[str, tuple[dict[str, Any], dict[str, float]]]
TIGHT = {"max_backlog_s": 0.25}
# The engines' /metrics report simulated (the hardware's) seconds at any time scale, so
# the TPOT leg's SLO is run.py's as it is; the clients measure wall seconds.
TPOT_LEG = {"tpot_slo_s": SLO.tpot_s}


def two_tenants(cap: float) -> Runs:
    compliant = 2 * cap / 6
    return {
        "compliant alone": ({"enabled": False}, {"compliant": compliant}),
        "FCFS": ({"enabled": False}, {"compliant": compliant, "flood": 5 * compliant}),
        "flow control, 0.25 s backlog": (TIGHT, {"compliant": compliant, "flood": 5 * compliant}),
        "flow control, TPOT SLO": (TPOT_LEG, {"compliant": compliant, "flood": 5 * compliant}),
    }


def three_classes(cap: float) -> Runs:
    rate = 2 * cap / 3
    every = {"crit": rate, "std": rate, "shed": rate}
    return {
        "critical alone": ({"enabled": False}, {"crit": rate}),
        "FCFS": ({"enabled": False}, every),
        "flow control, 0.25 s backlog": (TIGHT, every),
        "flow control, TPOT SLO": (TPOT_LEG, every),
    }


TABLES = {
    "two": ("Live: two tenants, one sending 5×, together 2× capacity", two_tenants),
    "three": ("Live: three classes, each at 2/3 of capacity (2× overload)", three_classes),
}


def measure(fleet: Fleet, directory: Path, runs: Runs, duration: float) -> list[dict[str, Any]]:
    """Each run against a fresh router: every tenant's row."""
    rows = []
    for mode, (flow, rates) in runs.items():
        router = start_router(directory, router_config(fleet, flow), redis_url=None)
        try:
            results = asyncio.run(load(router.url + "/v1/completions", rates, duration))
        finally:
            router.stop()
        for tenant in rates:
            rows.append({"mode": mode, "tenant": tenant, **summarise(results, tenant, duration)})
            print(rows[-1], flush=True)
    return rows


def table(title: str, rows: list[dict[str, Any]], cap: float, duration: float) -> list[str]:
    lines = [
        "",
        f"## {title} (`bench/fairness/live.py`)",
        "",
        f"{INSTANCES} enginesim instances at time scale {TIME_SCALE:g} (wall seconds; divide "
        f"TTFTs by {TIME_SCALE:g} for the hardware's), capacity {cap:.2f} requests/s wall, "
        f"{duration:g} s of arrivals per run. The TPOT leg's SLO "
        f"{TPOT_LEG['tpot_slo_s']:g} s (the engines report simulated seconds); goodput: "
        f"requests/s meeting TTFT ≤ "
        f"{SLO.ttft_s * TIME_SCALE:g} s and TPOT ≤ {SLO.tpot_s * TIME_SCALE:g} s (wall).",
        "",
        "| mode | tenant | requests | p90 TTFT (s) | p90 TPOT (s) | goodput | served | 429 "
        "| 503 | lost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"

    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['tenant']} | {r['requests']} | {cell(r['p90_ttft_s'])} | "
            f"{cell(r.get('p90_tpot_s'))} | {cell(r.get('goodput'))} | {r['served']} | "
            f"{r['429']} | {r['503']} | {r['lost']} |"
        )
    alone = next((r for r in rows if r["mode"].endswith("alone")), None)
    if alone is not None and alone["p90_ttft_s"]:
        ratios = [
            f"{r['mode']} {r['p90_ttft_s'] / alone['p90_ttft_s']:.2f}×"
            for r in rows
            if r["tenant"] == alone["tenant"] and r is not alone and r["p90_ttft_s"]
        ]
        lines += ["", f"{alone['tenant']}'s p90 TTFT against running alone: {', '.join(ratios)}."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--tables", default="two,three", help="which: two, three or both")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.tables.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in TABLES]
    if unknown or not chosen:
        parser.error(f"--tables: choose from {', '.join(TABLES)}, not {args.tables!r}")
    cap = capacity(120.0) / TIME_SCALE  # requests per wall second
    path = args.out / "live.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    measured = stored if isinstance(stored, dict) else {"two": stored}  # the older list: two
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, Fleet(INSTANCES, time_scale=TIME_SCALE) as fleet:
        for name in chosen:
            title, runs = TABLES[name]
            measured[name] = measure(fleet, Path(tmp), runs(cap), args.duration)
            lines += table(title, measured[name], cap, args.duration)
    text = "\n".join(lines) + "\n"
    path.write_text(json.dumps(measured, indent=2) + "\n")
    with open(args.out / "README.md", "a", encoding="utf-8") as readme:
        readme.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
