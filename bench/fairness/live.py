"""Many tenants on one fleet, live: the two-tenant table of bench/fairness/run.py against a
real router in front of enginesim instances (wall clock, real HTTP, this machine).

    .venv/bin/python -m bench.fairness.live [--duration 40] [--out bench/fairness]

Fleet: :data:`INSTANCES` enginesim instances (H20, Qwen2-7B) at time scale
:data:`TIME_SCALE` (slowed, so the clients and the router stay cheap beside the engines);
one router (LMetric). The fleet's capacity is the replay's (bench/fairness/run.py's
measurement on the same fleet) over the time scale. The compliant tenant sends a third of
it, the flooding one five times that (together 2× the capacity), each request a unique
2000-token prompt and 100 output tokens, streamed; TTFT is measured by the client. Modes:
FCFS (flow control off) and flow control with a 0.25 s prefill backlog; plus the compliant
tenant alone. Every request's fate is counted: served, 429, 503, lost (no answer).
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

from bench.fairness.run import INSTANCES, capacity
from devharness import Fleet, start_router

TIME_SCALE = 2.0
MODEL = "Qwen/Qwen2-7B-Instruct"
FILLER = "lorem " * 1330  # ~2000 tokens with the approximate tokenizer (4 bytes a token)
KEYS = {"compliant": "syk_complnt0_" + "c" * 40, "flood": "syk_flood000_" + "f" * 40}


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
        "tenants": [{"name": "compliant"}, {"name": "flood", "max_queued": 1024}],
        "flow": flow,
    }


async def one(client: httpx.AsyncClient, url: str, tenant: str) -> tuple[str, int, float | None]:
    body = {
        "model": MODEL,
        "prompt": f"{uuid.uuid4().hex} {FILLER}",
        "max_tokens": 100,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    start = time.monotonic()
    first = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            async for chunk in response.aiter_bytes():
                if first is None and b'"text":"' in chunk:
                    first = time.monotonic() - start
            return tenant, response.status_code, first
    except httpx.HTTPError:
        return tenant, 0, None  # lost: no answer


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


def summarise(results: list[tuple], tenant: str) -> dict[str, Any]:
    own = [r for r in results if r[0] == tenant]
    ttfts = [r[2] for r in own if r[1] == 200 and r[2] is not None]
    return {
        "requests": len(own),
        "p90_ttft_s": float(np.percentile(ttfts, 90)) if ttfts else None,
        "served": sum(r[1] == 200 for r in own),
        "429": sum(r[1] == 429 for r in own),
        "503": sum(r[1] == 503 for r in own),
        "lost": sum(r[1] not in (200, 429, 503) for r in own),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args(argv)
    cap = capacity(120.0) / TIME_SCALE  # requests per wall second
    compliant = 2 * cap / 6
    runs: dict[str, tuple[dict[str, Any], dict[str, float]]] = {
        "compliant alone": ({"enabled": False}, {"compliant": compliant}),
        "FCFS": ({"enabled": False}, {"compliant": compliant, "flood": 5 * compliant}),
        "flow control, 0.25 s backlog": (
            {"max_backlog_s": 0.25},
            {"compliant": compliant, "flood": 5 * compliant},
        ),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Fleet(INSTANCES, time_scale=TIME_SCALE) as fleet:
        for mode, (flow, rates) in runs.items():
            router = start_router(Path(tmp), router_config(fleet, flow), redis_url=None)
            try:
                results = asyncio.run(load(router.url + "/v1/completions", rates, args.duration))
            finally:
                router.stop()
            for tenant in rates:
                rows.append({"mode": mode, "tenant": tenant, **summarise(results, tenant)})
                print(rows[-1], flush=True)
    lines = [
        "",
        "## Live: two tenants, one sending 5×, together 2× capacity (`bench/fairness/live.py`)",
        "",
        f"{INSTANCES} enginesim instances at time scale {TIME_SCALE:g} (wall seconds; divide "
        f"TTFTs by {TIME_SCALE:g} for the hardware's), capacity {cap:.2f} requests/s wall, "
        f"{args.duration:g} s of arrivals per run.",
        "",
        "| mode | tenant | requests | p90 TTFT (s) | served | 429 | 503 | lost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p90 = "–" if r["p90_ttft_s"] is None else f"{r['p90_ttft_s']:.2f}"
        lines.append(
            f"| {r['mode']} | {r['tenant']} | {r['requests']} | {p90} | {r['served']} | "
            f"{r['429']} | {r['503']} | {r['lost']} |"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "live.json").write_text(json.dumps(rows, indent=2) + "\n")
    with open(args.out / "README.md", "a", encoding="utf-8") as readme:
        readme.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
