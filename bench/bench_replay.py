"""Replay benchmark: the eight routing policies on every shared trace with prefix
information, at two loads, written to ``bench/replay_report/`` (markdown + PNGs).

    .venv/bin/python bench/bench_replay.py [--out bench/replay_report] [--quick]

Loads: the rate scale at which the calibration policy keeps the GPUs ~50% and ~80% busy
over the arrival span (engine step time / (instances × time from first to last arrival):
the offered load, which, unlike busy over the makespan, does not drop when one instance's
backlog stretches the tail). Found by two proportional steps on a calibration window:
the conversation trace's first third (its prefix reuse is steady), the whole synthetic
trace (its reuse builds up: 5% of its first 300 requests' tokens repeat a prefix, 65%
overall, so a head window under-predicts the load a cache-aware policy sees). Nothing in
the engine model or the traces is tuned; every policy runs with its default parameters
and the same seed. ``--quick`` runs the first 600 requests only (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from enginesim.replay import metrics, plots
from enginesim.replay.cli import run_policy
from enginesim.replay.simulator import SimConfig, SimResult
from enginesim.replay.traces import TraceRecord, load_trace, read_trace, select
from router_worker.routing import REGISTRY

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "traces"
TRACES = ("mooncake_conversation_t0-2700s.jsonl", "mooncake_synthetic_trace.jsonl")
CALIBRATION_WINDOW = {TRACES[0]: 1 / 3, TRACES[1]: 1.0}  # fraction of the trace's time
# Qwen2-7B-Instruct serves 131072 tokens with YaRN; Mooncake prompts reach 125k.
CONFIG = SimConfig(instances=16, gpu="h20", model="qwen2-7b", max_model_len=131072, seed=0)
# The best mean TTFT in a 600-request pilot on both traces (cache_aware and smetric tied).
CALIBRATION_POLICY = "cache_aware"
LOADS = (("~50% busy", 0.5), ("~80% busy", 0.8))
COLUMNS = (("TTFT mean", "ttft_mean_s", ".2f"), ("p50", "ttft_p50_s", ".2f"),
           ("p90", "ttft_p90_s", ".2f"), ("p99", "ttft_p99_s", ".2f"),
           ("TPOT mean", "tpot_mean_s", ".4f"), ("TPOT p99", "tpot_p99_s", ".4f"),
           ("out tok/s", "throughput_tok_s", ".0f"), ("hit", "hit_ratio", ".3f"),
           ("load CV", "load_cv", ".2f"), ("hotspots", "hotspot_events", "d"),
           ("busy", "busy_fraction", ".2f"), ("done", "completed", "d"),
           ("rejected", "rejected", "d"), ("wall s", "wall_s", ".1f"),
           ("cpu s", "cpu_s", ".1f"))


def busy_at(records: list[TraceRecord], scale: float) -> float:
    """Offered load: engine busy time / (instances × arrival span)."""
    scaled = select(records, rate_scale=scale)
    result = run_policy(scaled, CALIBRATION_POLICY, CONFIG, progress=False)
    return result.busy_time / (CONFIG.instances * scaled[-1].arrival_s)


def calibrate(path: Path, target: float, limit: int | None) -> tuple[float, list[str]]:
    """Rate scale giving ``target`` offered load on the calibration window; with its log."""
    records = read_trace(path)[:limit]
    fraction = CALIBRATION_WINDOW[path.name]
    window = [r for r in records if r.arrival_s <= records[-1].arrival_s * fraction]
    scale, log = 1.0, []
    for _ in range(2):
        busy = busy_at(window, scale)
        log.append(f"scale {scale:.3f} → busy {busy:.3f}")
        scale *= target / busy
    return float(f"{scale:.3g}"), log


def run_all(records: list[TraceRecord]) -> list[tuple[SimResult, dict[str, Any]]]:
    runs = []
    for policy in REGISTRY:
        cpu = time.process_time()
        result = run_policy(records, policy, CONFIG, progress=False)
        summary = metrics.summarize(result)
        summary["cpu_s"] = time.process_time() - cpu
        print(f"  {policy:<12} TTFT mean {summary['ttft_mean_s']:.3f}s p99 "
              f"{summary['ttft_p99_s']:.2f}s hit {summary['hit_ratio']:.3f} busy "
              f"{summary['busy_fraction']:.2f} wall {summary['wall_s']:.1f}s "
              f"cpu {summary['cpu_s']:.1f}s", flush=True)
        runs.append((result, summary))
    return runs


def table(summaries: list[dict[str, Any]], lower: dict[str, Any]) -> list[str]:
    lines = ["| policy | " + " | ".join(title for title, _, _ in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for summary in [*summaries, lower]:
        cells = []
        for _, key, spec in COLUMNS:
            value = summary.get(key)
            cells.append("–" if value is None else format(value, spec))
        name = summary["policy"]
        name = "*lower bound*" if name == "lower_bound" else f"`{name}`"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def ranking(summaries: list[dict[str, Any]], key: str) -> str:
    ordered = sorted(summaries, key=lambda s: s[key])
    return " < ".join(f"`{s['policy']}` {s[key]:.2f}" for s in ordered)


def section(name: str, load: str, scale: float, log: list[str],
            summaries: list[dict[str, Any]], lower: dict[str, Any], stem: str) -> list[str]:
    return [
        f"### {name} — {load} (rate scale {scale:g})", "",
        f"Calibration ({CALIBRATION_POLICY}, offered load on the calibration window): "
        + "; ".join(log) + ".", "",
        *table(summaries, lower), "",
        f"Mean TTFT, best first: {ranking(summaries, 'ttft_mean_s')}.", "",
        f"p99 TTFT, best first: {ranking(summaries, 'ttft_p99_s')}.", "",
        f"![TTFT CDF]({stem}_ttft_cdf.png)", "",
        f"![pending prefill per instance]({stem}_pending.png)", "",
    ]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores (shared), Python {platform.python_version()}"


def header() -> list[str]:
    return [
        "# Replay report: eight policies on the shared Mooncake traces", "",
        f"Generated by `bench/bench_replay.py` on {machine()}.", "",
        f"Cluster: {CONFIG.instances}× {CONFIG.gpu.upper()} serving {CONFIG.model} "
        f"(max_model_len {CONFIG.max_model_len}), vLLM v1 defaults from enginesim; router "
        f"block size {CONFIG.router_block_size}, scrapes every {CONFIG.scrape_interval_s:g} s, "
        f"no telemetry delay, no KV events (shadow index only), seed {CONFIG.seed}; every "
        "policy with its default parameters. Times are virtual seconds; `wall s`/`cpu s` are "
        "this machine's cost of simulating one policy. The lower bound is each request "
        "prefilled alone on an idle instance with an infinite cache of every earlier "
        "request (no policy can beat it).", ""]


def run_trace(trace: str, out: Path, limit: int | None) -> None:
    """Both loads of one trace → ``<stem>.md``, ``<stem>.json`` and four PNGs in ``out``."""
    path = TRACE_DIR / trace
    engine_config = CONFIG.engine_config(None)
    lines, data = [f"## {trace}", ""], {}
    for load, target in LOADS:
        scale, log = calibrate(path, target, limit)
        print(f"{trace} {load}: rate scale {scale} ({'; '.join(log)})", flush=True)
        records = load_trace(path, rate_scale=scale, max_requests=limit)
        runs = run_all(records)
        summaries = [summary for _, summary in runs]
        lower, bound = metrics.lower_bound_summary(records, engine_config)
        stem = f"{Path(trace).stem}_{int(target * 100)}"
        results = [result for result, _ in runs]
        plots.ttft_cdf(results, out / f"{stem}_ttft_cdf.png",
                       f"{trace}, {load} (scale {scale:g})", bound)
        plots.pending_grid(results, out / f"{stem}_pending.png",
                           f"{trace}, {load}: pending prefill tokens per instance")
        lines += section(trace, load, scale, log, summaries, lower, stem)
        data[stem] = {"rate_scale": scale, "policies": summaries, "lower_bound": lower}
    (out / f"{Path(trace).stem}.md").write_text("\n".join(lines) + "\n")
    (out / f"{Path(trace).stem}.json").write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "replay_report")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trace", action="append", choices=TRACES,
                        help="run only these traces (the README keeps the others' sections)")
    parser.add_argument("--assemble", action="store_true",
                        help="run nothing; rebuild README.md from the sections and NOTES.md")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for trace in [] if args.assemble else args.trace or TRACES:
        run_trace(trace, args.out, 600 if args.quick else None)
    sections = [args.out / f"{Path(trace).stem}.md" for trace in TRACES]
    notes = args.out / "NOTES.md"
    parts = ["\n".join(header()), *(p.read_text() for p in sections if p.exists())]
    if notes.exists():
        parts.append(notes.read_text())
    (args.out / "README.md").write_text("\n".join(parts))
    print(f"wrote {args.out}/README.md")
    return 0

if __name__ == "__main__":
    sys.exit(main())
