"""Where does LMetric's product lose to load-only routing, and does the detector fix it?

    .venv/bin/python -m bench.hotspot.run [--quick] [--jobs 2] [--out DIR]

The LMetric paper's failure mode (docs/algorithms.md, "lmetric's hotspot detector"): one
prefix class takes a large share of the traffic while few instances cache it; its P-token
there stays near zero, so the product keeps sending the class to them while their batches
fill and requests queue. This sweep overlays a shared-prefix burst (enginesim's hotspot
generator) on a window of the real Mooncake conversation trace and varies prefix length,
suffix length, output length, the burst's share of arrivals and the background load. Per
point it replays

* ``lmetric`` with the detector (the default policy),
* ``lmetric[no_hotspot]``: the plain product,
* ``lmetric[eager]``: the detector without two guards (a class cached on more than half
  the instances may be hot; two class requests in the window suffice),
* ``least_load``: load-only routing,

and reports mean TTFT and TPOT of the requests arriving during the burst, the detector's
latency (burst start → first ``confirmed``), the time spent in fallback, the transitions,
and over how many instances each policy spread the burst. The burst ramps up over
``RAMP_S`` (a step burst spreads its prefix by itself while the first prefill runs; see
enginesim.replay.synth). The points where the plain product loses to load-only routing
are where the detector must pay off. Writes ``README.md`` and ``results.json`` under
``--out`` and prints the table; ``--quick`` runs two points; ``--assemble`` rebuilds
README.md from results.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.matrix import CONVERSATION
from engine_interface import percentile
from enginesim.replay.metrics import tpot_of, ttft_of
from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.synth import BurstParams, hotspot_burst
from enginesim.replay.traces import read_trace, select

TRACE = CONVERSATION
CONFIG = SimConfig(instances=16, gpu="h20", model="qwen2-7b", max_model_len=131072, seed=1)
BACKGROUND_S = 480.0  # trace seconds of background, before rate scaling
BURST_AT_S, BURST_S, RAMP_S = 120.0, 120.0, 60.0  # in replay (scaled) seconds
# "eager": the detector without two of its guards (a class cached on more than half the
# instances may be hot; two class requests in the window suffice), to see what they cost.
POLICIES = {
    "lmetric": {},
    "lmetric[no_hotspot]": {"hotspot": {"enabled": False}},
    "lmetric[eager]": {"hotspot": {"max_hit_fraction": 1.0, "min_class_requests": 2}},
    "least_load": {},
}


@dataclass(frozen=True)
class Point:
    prefix_tokens: int
    suffix_tokens: int
    output_tokens: int
    share: float  # burst requests / all requests during the burst
    background_scale: float  # rate scale of the background trace
    model: str = "qwen2-7b"

    def label(self) -> str:
        model = "" if self.model == CONFIG.model else f", {self.model}"
        return (
            f"prefix {self.prefix_tokens // 1024}k, suffix {self.suffix_tokens}, "
            f"out {self.output_tokens}, share {self.share:.0%}, "
            f"bg ×{self.background_scale:g}{model}"
        )


def workload(point: Point) -> list[Any]:
    background = select(read_trace(TRACE), end_s=BACKGROUND_S, rate_scale=point.background_scale)
    background_rate = len(background) / background[-1].arrival_s
    burst_rate = background_rate * point.share / (1 - point.share)
    params = BurstParams(
        at_s=BURST_AT_S,
        duration_s=BURST_S,
        burst_rate=burst_rate,
        prefix_tokens=point.prefix_tokens,
        suffix_tokens=float(point.suffix_tokens),
        output_tokens=float(point.output_tokens),
        ramp_s=RAMP_S,
        seed=3,
    )
    return hotspot_burst(background, params)


def run(args: tuple[Point, str]) -> tuple[Point, str, dict[str, Any]]:
    point, policy = args
    records = workload(point)
    kind = policy.split("[")[0]
    config = replace(CONFIG, model=point.model, policy_params={kind: POLICIES[policy]})
    result = Simulator(records, kind, config).run()
    events = result.hotspot_log
    in_burst = [
        r
        for r in result.requests
        if r.status == "ok" and BURST_AT_S <= r.arrival_s < BURST_AT_S + BURST_S
    ]
    ttft = np.array([ttft_of(r) for r in in_burst])
    burst_tpot = [tpot_of(r) for r in in_burst if r.output_tokens > 1]
    confirmed = [e.time for e in events if e.kind == "confirmed"]
    hot = [
        r
        for r, record in zip(result.requests, records, strict=True)
        if record.kind == "hotspot" and r.status == "ok"
    ]
    served = np.unique([r.instance for r in hot], return_counts=True)[1]
    tpot = [tpot_of(r) for r in hot if r.output_tokens > 1]
    return (
        point,
        policy,
        {
            "class_ttft_mean_s": float(np.mean([ttft_of(r) for r in hot])),
            "class_tpot_mean_s": float(np.mean(tpot)) if tpot else None,
            "class_instances": int((served >= 0.05 * len(hot)).sum()),
            "burst_ttft_mean_s": float(ttft.mean()) if len(ttft) else None,
            "burst_ttft_p99_s": percentile(ttft, 99),
            "burst_tpot_mean_s": float(np.mean(burst_tpot)) if burst_tpot else None,
            "burst_requests": len(in_burst),
            "detection_s": (min(confirmed) - BURST_AT_S) if confirmed else None,
            "fallback_s": _fallback_time(events),
            "transitions": {
                kind: sum(e.kind == kind for e in events)
                for kind in ("suspected", "confirmed", "dismissed", "cleared")
            },
            "fallback_decisions": result.decision_reasons.get("hotspot_fallback", 0),
        },
    )


def _fallback_time(events: Sequence[Any]) -> float:
    """Seconds any class spent confirmed (confirmed → cleared, per class)."""
    started: dict[str, float] = {}
    total = 0.0
    last = max((e.time for e in events), default=0.0)
    for event in events:
        if event.kind == "confirmed":
            started[event.class_id] = event.time
        elif event.kind == "cleared" and event.class_id in started:
            total += event.time - started.pop(event.class_id)
    return total + sum(last - t for t in started.values())


def grid(quick: bool) -> list[Point]:
    if quick:
        return [Point(24_576, 64, 5000, 0.9, 1.0), Point(8192, 512, 500, 0.5, 0.5)]
    main = [
        Point(*values)
        for values in itertools.product(
            (8192, 24_576), (64, 512), (500, 5000), (0.5, 0.9), (0.5, 1.0)
        )
    ]
    # the paper's headline model: a third of the KV room per token (96 KiB, 61 GB weights)
    headline = [
        Point(*values, model="qwen3-30b-a3b")
        for values in itertools.product((24_576,), (64,), (500, 5000), (0.5, 0.9), (0.5, 1.0))
    ]
    return main + headline


def fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


ORDER = ("lmetric[no_hotspot]", "least_load", "lmetric", "lmetric[eager]")


def table(rows: dict[Point, dict[str, dict[str, Any]]]) -> list[str]:
    names = "plain / least_load / lmetric / eager"
    lines = [
        f"| point | burst TTFT mean: {names} | burst TPOT mean: {names} | lmetric vs "
        "plain, TTFT / TPOT | detected after | fallback | suspected/confirmed/"
        "dismissed/cleared (eager confirmed) | class on: plain / least_load / lmetric |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for point, runs in rows.items():
        plain, detector = runs["lmetric[no_hotspot]"], runs["lmetric"]
        ttft = " / ".join(fmt(runs[name]["burst_ttft_mean_s"], ".2f") for name in ORDER)
        tpot = " / ".join(fmt(runs[name]["burst_tpot_mean_s"], ".3f") for name in ORDER)
        gains = " / ".join(
            fmt(_gain(detector[key], plain[key]), "+.0%")
            for key in ("burst_ttft_mean_s", "burst_tpot_mean_s")
        )
        counts = detector["transitions"]
        spread = " / ".join(
            str(runs[name]["class_instances"])
            for name in ("lmetric[no_hotspot]", "least_load", "lmetric")
        )
        lines.append(
            f"| {point.label()} | {ttft} | {tpot} | {gains} | "
            f"{fmt(detector['detection_s'], '.1f')} s | {detector['fallback_s']:.0f} s | "
            f"{counts['suspected']}/{counts['confirmed']}/{counts['dismissed']}/"
            f"{counts['cleared']} ({runs['lmetric[eager]']['transitions']['confirmed']}) | "
            f"{spread} |"
        )
    return lines


def _gain(value: float | None, baseline: float | None) -> float | None:
    """Relative change against the baseline (negative = lower = better)."""
    return None if value is None or not baseline else value / baseline - 1


def document(data: dict[str, Any]) -> str:
    """README.md from results.json alone."""
    rows = {Point(**row["point"]): row["runs"] for row in data["rows"]}
    lines = [
        "# Hotspot sweep",
        "",
        f"Generated by `python -m bench.hotspot.run{' --quick' if data['quick'] else ''}` in "
        f"{data['wall_s'] / 60:.1f} min. Background: the Mooncake "
        f"conversation trace's first {BACKGROUND_S:g} s at the rate scale shown; burst "
        f"from {BURST_AT_S:g} s for {BURST_S:g} s (replay time). TTFT columns: mean "
        "TTFT (s) of every request arriving during the burst. `class on`: instances that "
        "served at least 5% of the burst's requests.",
        "",
        *table(rows),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="default: bench/hotspot, or "
        "bench/out/hotspot with --quick (the committed report stays untouched)",
    )
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: README.md from results.json"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.out is None:
        here = Path(__file__).resolve().parent
        args.out = here.parent / "out" / "hotspot" if args.quick else here
    if args.assemble:
        data = json.loads((args.out / "results.json").read_text())
        (args.out / "README.md").write_text(document(data))
        return 0
    started = time.perf_counter()
    points = grid(args.quick)
    rows: dict[Point, dict[str, dict[str, Any]]] = {p: {} for p in points}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for point, policy, summary in pool.map(
            run, [(p, policy) for p in points for policy in POLICIES]
        ):
            rows[point][policy] = summary
            print(
                f"{point.label():<55} {policy:<20} burst TTFT "
                f"{fmt(summary['burst_ttft_mean_s'], '.2f')} s "
                f"confirmed {summary['transitions']['confirmed']}",
                flush=True,
            )
    data = {
        "quick": args.quick,
        "wall_s": time.perf_counter() - started,
        "rows": [{"point": asdict(p), "runs": r} for p, r in rows.items()],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    text = document(data)
    (args.out / "README.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
