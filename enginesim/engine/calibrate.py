"""Fit the cost model's efficiencies and fixed costs to public vLLM measurements.

    python -m enginesim.engine.calibrate [--csv PATH] [--holdout PATH] [--write]

Each CSV row becomes a calibration point of one kind, predicted from the cost model:

- ``decode``: a median inter-token latency (or the TPOT at concurrency 1) = one decode
  step of ``concurrency`` requests at context ``input + output / 2``.
- ``ttft1``: the TTFT at concurrency 1 = ``t_request`` + chunked prefill of the prompt (what
  the engine core produces for a lone request).
- ``speed1``: batch-1 offline speed (Qwen's speed benchmark) = tokens / (prefill + 2047
  decode steps over the growing context).
- ``e2e``: an offline batch's end-to-end latency (vLLM CI latency test).
- ``loop_tpot``: closed-loop runs at concurrency c, replayed through the
  engine core itself; the row's statistic (p50, p95, mean) of the simulated requests.
- ``saturation``: all prompts sent at once = total tok/s of the engine core itself.
The simulated kinds test the core and the cost model together. Only one constant is fitted
on them: V1 Ampere's compute efficiency, from the A100 saturation rows (no analytic V1
Ampere row measures compute); see ``fit``.
The accuracy bound: every fit and hold-out point within ``BOUND_PCT`` except the few in
``OUT_OF_BOUND``, each with the reason no physically sensible parameter reaches it
(tests/enginesim/test_calibration.py holds the committed calibration.json to it).

Parameters (calibration.json): per GPU architecture (Hopper, Ampere, Ada) the compute and
memory efficiencies, plus Hopper's fp8 GEMM efficiency and, for Ampere, a V1 compute
efficiency apart from the V0 one (the only architecture with compute rows of both eras);
per vLLM era (V1 >= 0.8, V0) the per-step overhead ``t_fixed``; shared: ``t_per_seq``, the
per-request overhead ``t_request`` (fitted on the V1 TTFTs; the offline kinds speed1/e2e
have no HTTP and do not pay it) and the fused-MoE factor ``eta_moe``.

Roles: ``fit`` rows determine the constants (least squares on log errors); ``holdout``
rows are other sources, GPUs and models, kept out of the fit to measure how it
generalises; ``cross-check`` rows are not vLLM (SGLang on H20); ``unused`` rows say why.
The calibration README sets aside a validation part of the measurements that is not in
this CSV; pass it with ``--holdout`` to score it the same way.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from engine_interface import percentile
from enginesim.engine.config import EngineConfig
from enginesim.engine.costmodel import (
    CALIBRATION_FILE,
    Calibration,
    CostModel,
    GPUEfficiency,
    StepBatch,
)

# the shared measurements beside the repository (../shared), where CI has them too
DEFAULT_CSV = (
    Path(__file__).resolve().parents[3] / "shared" / "calibration" / "vllm_public_measurements.csv"
)
REPORT_FILE = CALIBRATION_FILE.with_name("calibration_report.txt")
GPU_KEYS = {"H100": "h100", "A100": "a100", "H200": "h200", "H20": "h20", "L40S": "l40s"}
SPEED_DECODE_TOKENS = 2048


@dataclass(frozen=True)
class Point:
    row: int  # 0-based data row in the CSV
    kind: str
    role: str
    observed: float
    unit: str  # "ms" or "tok/s"
    gpu: str
    model: str
    dtype: str
    era: str
    input_len: float
    output_len: float
    concurrency: int
    source: str
    quality: str
    label: str
    reason: str = ""
    csv_name: str = ""
    stat: str = "median"


# ----------------------------------------------------------------- classification


def _num(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _era(version: str) -> str:
    if version.startswith("main"):
        return "v1"  # vLLM CI on main: the V1 engine
    match = re.match(r"0\.(\d+)", version)
    if match:
        return "v1" if int(match.group(1)) >= 8 else "v0"
    return "v0" if "not stated" in version else "v1"


def _dtype(row: dict) -> str:
    return "fp8" if row["dtype"].lower().startswith("fp8") else "bf16"


def _unused(row: dict, reason: str) -> tuple[str, str, float, str, str]:
    return ("-", "unused", math.nan, "", reason)


def _classify(row: dict) -> tuple[str, str, float, str, str]:
    """(kind, role, observed, unit, reason) of one CSV row."""
    source = row["source"]
    conc = _num(row["concurrency"])
    in_len, out_len = _num(row["input_len"]), _num(row["output_len"])
    if row["model_key"] == "Llama-3-70B" or row["tensor_parallel"] != "1":
        return _unused(row, "70B / tensor parallel: not a modelled single-GPU setup")
    if "sglang" in row["engine"]:
        return (
            "speed1",
            "cross-check",
            float(row["throughput_total_tok_s"]),
            "tok/s",
            "SGLang, not vLLM; README: decode ~3x below roofline, loose",
        )
    if "silybench" in source:
        return _classify_silybench(row, conc, in_len, out_len)
    if "speed_benchmark" in source:
        return ("speed1", "fit", float(row["throughput_out_tok_s"]), "tok/s", "")
    if "TechBroMoho" in source:
        if conc == 1:
            return (
                "decode",
                "fit",
                float(row["tpot_ms"]),
                "ms",
                "TPOT p50 at c=1; the only L40S source, so it fits the Ada efficiencies",
            )
        return ("loop_tpot", "holdout", float(row["tpot_ms"]), "ms", "TPOT p50, closed loop")
    if "gpustack" in source:
        return _classify_gpustack(row, conc, in_len, out_len)
    if "tenstorrent" in source:
        return (
            "decode",
            "fit",
            float(row["tpot_ms"]),
            "ms",
            "MoE TPOT mean at c=1, the only in-file MoE rows (TTFT suspect: prefix hits)",
        )
    if "buildkite" in source and in_len == 32:
        latency = re.search(r"latency mean ([\d.]+) ms", row["note"])
        if latency and row["model_key"] == "Llama-3.1-8B":
            return ("e2e", "holdout", float(latency.group(1)), "ms", "batch-8 latency test")
    if "prompt_10/" in source:
        return (
            "decode",
            "fit",
            float(row["tpot_ms"]),
            "ms",
            "median TPOT at c=10 (multi-step run: median only); the one V0 row on a GPU "
            "whose eta_memory other rows pin, so it separates V0's t_fixed from A100's "
            "eta_memory",
        )
    return _unused(row, "ShareGPT saturation / multi-step / throughput-only: no step statistic")


def _classify_silybench(row, conc, in_len, out_len):
    kv_limited = (in_len == 2048 and conc >= 128) or (
        in_len == 8192 and conc >= 32 and _dtype(row) == "bf16"
    )
    if kv_limited:
        return _unused(row, "KV-capacity-limited (README): batch size unknown")
    return ("decode", "fit", float(row["itl_ms"]), "ms", "ITL median")


def _classify_gpustack(row, conc, in_len, out_len):
    if in_len is None:
        return _unused(row, "ShareGPT saturation without per-request lengths")
    if conc is not None:  # the latency file, c = 1..8
        if conc == 1:
            return ("decode", "holdout", float(row["itl_ms"]), "ms", "ITL median, ShareGPT")
        return (
            "loop_tpot",
            "holdout",
            float(row["tpot_ms"]),
            "ms",
            "TPOT mean, ShareGPT mean lengths",
        )
    if row["dtype"].startswith("bf16") and row["gpu_family"] == "A100":
        return (
            "saturation",
            "fit",
            float(row["throughput_total_tok_s"]),
            "tok/s",
            "all prompts at once, simulated with the engine core (output as generated); "
            "the only V1 A100 prefill rows, so they fit V1 Ampere's compute efficiency",
        )
    if row["dtype"].startswith("bf16"):
        return (
            "saturation",
            "holdout",
            float(row["throughput_total_tok_s"]),
            "tok/s",
            "all prompts at once, simulated with the engine core (output as generated)",
        )
    return _unused(row, "FP8 weight-only on A100 with ShareGPT lengths")


def load_points(path: Path = DEFAULT_CSV) -> list[Point]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    points = []
    for i, row in enumerate(rows):
        kind, role, observed, unit, reason = _classify(row)
        conc = _num(row["concurrency"]) or 1
        out_len = _num(row["output_len"]) or 0.0
        points.append(
            Point(
                row=i,
                kind=kind,
                role=role,
                observed=observed,
                unit=unit,
                gpu=GPU_KEYS[row["gpu_family"]],
                model=row["model_key"].lower(),
                dtype=_dtype(row),
                era=_era(row["vllm_version"]),
                input_len=_num(row["input_len"]) or 0.0,
                output_len=_generated_len(row) if kind == "saturation" else out_len,
                concurrency=int(conc),
                source=row["source"].split(" (")[0],
                quality=row["quality"],
                label=f"{row['gpu_family']} {row['model_key']} {_dtype(row)} "
                f"{row['input_len']}/{row['output_len']} c={row['concurrency'] or '-'}",
                reason=reason,
                csv_name=Path(path).name,
                stat=_stat(row, kind),
            )
        )
    return points


def _generated_len(row: dict) -> float:
    """Output tokens per request a saturation run really generated. The GPUStack runs did
    not pass ``--ignore-eos``: its 32k-prompt runs stopped at ~77 of the 100 tokens asked
    for. Output and total tok/s cover the same requests and duration, so their ratio gives
    it (``output_len`` when a throughput is missing)."""
    nominal = _num(row["output_len"]) or 0.0
    out_tps, total_tps = _num(row["throughput_out_tok_s"]), _num(row["throughput_total_tok_s"])
    in_len = _num(row["input_len"])
    if not (nominal and in_len and out_tps and total_tps and total_tps > out_tps):
        return nominal
    return min(nominal, in_len * out_tps / (total_tps - out_tps))


def _stat(row: dict, kind: str) -> str:
    if kind == "loop_tpot":
        return row["tpot_stat"]
    return "median"


# ----------------------------------------------------------------- the accuracy bound

BOUND_PCT = 15.0  # every fit and hold-out point, except OUT_OF_BOUND, within this
# (csv line, kind) -> why a physically sensible model misses it by more than BOUND_PCT
OUT_OF_BOUND: dict[tuple[int, str], str] = {
    (30, "loop_tpot"): "L40S streams 1,933 output tok/s at c=128 and 1,779 at c=256 (7.55 and "
    "6.95 req/s x 256): its throughput stops growing at c=128, where the model's GPU would "
    "give 2.5k and then 3.4k tok/s. A ceiling that flat is the host front-end (vLLM 0.10.2's "
    "API server streaming every token), not the GPU; silybench's H100 host streams 13.6k "
    "tok/s at c=256, so a front-end cost fitted here would describe this one machine",
    (31, "loop_tpot"): "as line 30: at c=256 the front-end ceiling sets TPOT (~256 / 1,779 "
    "tok/s = 144 ms, measured 142.8), with 0 preemptions: 170,944 KV tokens hold the "
    "~164k of 256 average contexts",
    **{
        (line, "saturation"): "this 'H100' is not the H100 SXM of the other H100 rows: its "
        "32k run decodes one stream at a time (peak output 24 tok/s; TPOT p99 44.3 ms beside a "
        "43.4 ms mean: pure decode steps), and each step, 32B weights + 32k KV, reads 1.7 "
        "TB/s, 51% of the SXM's HBM where silybench's H100 reaches 96%; its prefill is ~1.5x "
        "the same source's A100 where the datasheets give 3.2x. The source says only "
        "'NVIDIA H100 GPUs' (its Qwen3-8B page names an SXM); read as an H100 PCIe (2.0 TB/s, "
        "756 TF) the model still gives +23% to +91%, so no H100 the model knows reaches "
        "these rows, and fitting them would break the grade-A H100 rows"
        for line in (59, 60, 61, 62)
    },
    (63, "ttft1"): "GPUStack's ShareGPT TTFT at c=1 is 59 ms where silybench measures 14 ms "
    "for a 128-token prompt on the same GPU, model and V1 engine; the run used the chat "
    "endpoint, and at c=4 on the same machine and client vLLM measured 64 ms and SGLang "
    "27.7 ms: ~35 ms of vLLM 0.11 chat front-end plus ~20 ms of client latency, not engine "
    "time (its TPOT rows fit)",
}


def in_bound(p: Point) -> bool:
    """Whether the accuracy bound applies to ``p`` (vLLM rows the model is meant to match)."""
    return p.role in ("fit", "holdout") and (p.row + 2, p.kind) not in OUT_OF_BOUND


# ----------------------------------------------------------------- predictions


def _cost_model(p: Point, cals: dict[str, Calibration]) -> CostModel:
    return CostModel(p.gpu, p.model, cals[p.era], dtype=p.dtype)


def _budget(p: Point) -> int:
    return EngineConfig.for_hardware(p.gpu, p.model, dtype=p.dtype).max_num_batched_tokens


def _decode_ms(p: Point, cm: CostModel) -> float:
    context = int(p.input_len + p.output_len / 2)
    return 1e3 * cm.step_time(StepBatch.decode(p.concurrency, context))


def _ttft_ms(p: Point, cm: CostModel) -> float:
    chunk = _budget(p) if p.era == "v1" else None
    return 1e3 * (cm.prefill_time(int(p.input_len), chunk) + cm.calibration.t_request)


def _generation_time(cm: CostModel, prompt: int, output: int, chunk: int | None) -> float:
    decode = cm.decode_step_times(1, prompt, output - 1).sum() if output > 1 else 0.0
    return cm.prefill_time(prompt, chunk) + decode


def _speed1(p: Point, cm: CostModel) -> float:
    prompt = max(int(p.input_len), 1)
    chunk = _budget(p) if p.era == "v1" else None
    total = _generation_time(cm, prompt, SPEED_DECODE_TOKENS, chunk)
    produced = SPEED_DECODE_TOKENS + (prompt if p.role == "cross-check" else 0)
    return produced / total


def _e2e_ms(p: Point, cm: CostModel) -> float:
    batch, prompt, output = p.concurrency, int(p.input_len), int(p.output_len)
    prefill = cm.step_time(StepBatch.from_requests([prompt] * batch, [0] * batch, batch))
    decode = cm.decode_step_times(batch, batch * prompt, output - 1).sum()
    return 1e3 * (prefill + decode)


def _engine(p: Point, cm: CostModel):
    from enginesim.engine.core import EngineCore  # the core is only needed by simulated kinds

    config = EngineConfig.for_hardware(p.gpu, p.model, dtype=p.dtype, calibration=cm.calibration)
    return EngineCore(config)


def _saturation(p: Point, cm: CostModel) -> float:
    """Total tok/s of ``n`` random prompts sent at once (the row's prompt count, capped)."""
    n = 100 if p.input_len > 10_000 else 400
    engine = _engine(p, cm)
    rng = np.random.default_rng(p.row)
    output = round(p.output_len)  # a mean where a run stopped early; see _generated_len
    for i in range(n):
        engine.add_request(f"r{i}", rng.integers(0, 150_000, int(p.input_len)), output, now=0.0)
    end = 0.0
    while (t := engine.next_event_time()) is not None:
        engine.advance_to(t)
        end = t
    return n * (p.input_len + output) / end


def closed_loop(p: Point, cm: CostModel, num_requests: int) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT s, TPOT s) per request of a closed loop of ``p.concurrency`` clients."""
    engine = _engine(p, cm)
    rng = np.random.default_rng(p.row)
    prompt, output = max(int(p.input_len), 1), max(int(p.output_len), 2)
    started, ttft, tpot = 0, [], []

    def start(now: float) -> None:
        nonlocal started
        engine.add_request(f"r{started}", rng.integers(0, 150_000, prompt), output, now)
        started += 1

    for _ in range(min(p.concurrency, num_requests)):
        start(0.0)
    while (t := engine.next_event_time()) is not None:
        for out in engine.advance_to(t):
            if out.finished:
                ttft.append(out.first_token_time - out.arrival_time)
                tpot.append((out.finish_time - out.first_token_time) / (output - 1))
                if started < num_requests:
                    start(out.finish_time)
    return np.array(ttft), np.array(tpot)


def _statistic(values: np.ndarray, stat: str) -> float:
    if stat == "mean":
        return float(values.mean())
    found = percentile(values, {"p95": 95, "p99": 99}.get(stat, 50))
    return float("nan") if found is None else found


def _loop_tpot_ms(p: Point, cm: CostModel) -> float:
    _, tpot = closed_loop(p, cm, num_requests=max(4 * p.concurrency, 50))
    return 1e3 * _statistic(tpot, p.stat)


PREDICTORS: dict[str, Callable[[Point, CostModel], float]] = {
    "decode": _decode_ms,
    "ttft1": _ttft_ms,
    "speed1": _speed1,
    "e2e": _e2e_ms,
    "loop_tpot": _loop_tpot_ms,
    "saturation": _saturation,
}


def predict(p: Point, cals: dict[str, Calibration]) -> float:
    return PREDICTORS[p.kind](p, _cost_model(p, cals))


def ttft_points(points: list[Point], path: Path = DEFAULT_CSV) -> list[Point]:
    """Extra ``ttft1`` points from the concurrency-1 rows that publish a TTFT."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    extra = []
    for p in points:
        row = rows[p.row]
        if p.kind != "decode" or p.concurrency != 1 or not row["ttft_ms"]:
            continue
        if "tenstorrent" in row["source"]:
            continue  # README: TTFTs below the compute floor (prefix-cache hits)
        extra.append(
            replace(
                p,
                kind="ttft1",
                observed=float(row["ttft_ms"]),
                reason=f"TTFT {row['ttft_stat']} at c=1",
            )
        )
    return extra


# ----------------------------------------------------------------- fitting

ARCHS = ("hopper", "ampere", "ada")
FP8_ARCHS = ("hopper",)  # the only architecture with fp8 (W8A8) measurements
PARAMS = (
    *(f"eta_compute_{a}" for a in ARCHS),
    *(f"eta_memory_{a}" for a in ARCHS),
    *(f"eta_compute_fp8_{a}" for a in FP8_ARCHS),
    "t_fixed_v1",
    "t_fixed_v0",
    "t_per_seq",
    "t_request",
    "eta_moe",
)
START = (0.6,) * 3 + (0.8,) * 3 + (0.5,) + (0.002, 0.004, 1e-5, 0.005, 0.8)
LOWER = (0.1,) * 3 + (0.3,) * 3 + (0.1,) + (0.0, 0.0, 0.0, 0.0, 0.1)
UPPER = (1.0,) * 3 + (1.0,) * 3 + (1.0,) + (0.02, 0.02, 1e-4, 0.05, 1.0)


def calibrations_from(theta: np.ndarray) -> dict[str, Calibration]:
    values = dict(zip(PARAMS, (float(x) for x in theta), strict=True))
    gpus = {
        a: GPUEfficiency(
            values[f"eta_compute_{a}"],
            values[f"eta_memory_{a}"],
            values.get(f"eta_compute_fp8_{a}"),
        )
        for a in ARCHS
    }
    shared: dict[str, Any] = {
        "gpus": gpus,
        "t_per_seq": values["t_per_seq"],
        "eta_moe": values["eta_moe"],
        "t_request": values["t_request"],
    }
    return {
        era: Calibration(t_fixed=values[f"t_fixed_{era}"], era=era, **shared)
        for era in ("v1", "v0")
    }


SIMULATED = ("loop_tpot", "saturation")  # predicted by running the engine core


def fit(points: list[Point]) -> dict[str, Calibration]:
    """Stage 1: every constant on the analytic fit rows. Stage 2: V1 Ampere's compute
    efficiency, which no analytic row measures, on the simulated fit rows (the GPUStack
    A100 saturation runs), with everything else held at stage 1's values."""
    analytic = [p for p in points if p.role == "fit" and p.kind not in SIMULATED]

    def residuals(theta: np.ndarray) -> np.ndarray:
        cals = calibrations_from(theta)
        return np.array([math.log(predict(p, cals) / p.observed) for p in analytic])

    result = least_squares(residuals, np.array(START), bounds=(LOWER, UPPER))
    cals = calibrations_from(result.x)
    simulated = [p for p in points if p.role == "fit" and p.kind in SIMULATED]
    return _fit_v1_ampere_compute(cals, simulated) if simulated else cals


def _with_v1_ampere_compute(cals: dict[str, Calibration], eta: float) -> dict[str, Calibration]:
    v1 = cals["v1"]
    gpus = {**v1.gpus, "ampere": replace(v1.gpus["ampere"], eta_compute=eta)}
    return {**cals, "v1": replace(v1, gpus=gpus)}


def _fit_v1_ampere_compute(
    cals: dict[str, Calibration], points: list[Point]
) -> dict[str, Calibration]:
    """The V0 Ampere rows (vLLM 0.4-0.6, 129k-token prompts) and the V1 ones (0.11) disagree
    by about 1.5x on prefill: the eras' attention kernels and chunked-prefill schedules
    differ, so V1 Ampere gets its own compute efficiency."""
    strays = [p.label for p in points if (p.gpu, p.era) != ("a100", "v1")]
    if strays:
        raise ValueError(f"simulated fit rows must be V1 A100 rows, not {strays}")

    def residuals(theta: np.ndarray) -> np.ndarray:
        trial = _with_v1_ampere_compute(cals, float(theta[0]))
        return np.array([math.log(predict(p, trial) / p.observed) for p in points])

    start = cals["v1"].gpus["ampere"].eta_compute
    result = least_squares(residuals, np.array([start]), bounds=([0.1], [1.0]), diff_step=1e-3)
    return _with_v1_ampere_compute(cals, float(result.x[0]))


def write_calibration(
    cals: dict[str, Calibration], table: list[dict], path: Path = CALIBRATION_FILE
) -> None:
    fitted = [r for r in table if r["role"] == "fit"]
    data = {
        "comment": "Written by python -m enginesim.engine.calibrate --write; do not edit.",
        "eras": {
            era: {
                "gpus": {a: asdict(e) for a, e in c.gpus.items()},
                "t_fixed": c.t_fixed,
                "t_per_seq": c.t_per_seq,
                "t_request": c.t_request,
                "eta_moe": c.eta_moe,
            }
            for era, c in cals.items()
        },
        "fit_rows": len(fitted),
        "fit_median_abs_error_pct": _median_abs(fitted),
        "holdout_median_abs_error_pct": _median_abs([r for r in table if r["role"] == "holdout"]),
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


# ----------------------------------------------------------------- reporting


def _median_abs(rows: list[dict]) -> float | None:
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    median = percentile(errors, 50)
    return None if median is None else round(median, 1)


def error_table(points: list[Point], cals: dict[str, Calibration]) -> list[dict]:
    table = []
    for p in points:
        predicted = error = None
        if p.role != "unused":
            predicted = predict(p, cals)
            error = 100.0 * (predicted / p.observed - 1.0)
        note = OUT_OF_BOUND.get((p.row + 2, p.kind), p.reason)
        table.append(
            {
                "row": p.row,
                "role": p.role,
                "kind": p.kind,
                "label": p.label,
                "bounded": in_bound(p),
                "observed": p.observed,
                "predicted": predicted,
                "unit": p.unit,
                "error_pct": error,
                "quality": p.quality,
                "source": p.source,
                "note": note,
                "csv": p.csv_name,
            }
        )
    return table


def format_table(table: list[dict]) -> str:
    lines = [
        f"{'csv line':>4} {'role':<11} {'kind':<11} {'point':<44} {'observed':>10} "
        f"{'model':>10} {'unit':<5} {'err%':>7} q  source / note"
    ]
    for r in table:
        obs = "" if math.isnan(r["observed"]) else f"{r['observed']:.2f}"
        pred = "" if r["predicted"] is None else f"{r['predicted']:.2f}"
        err = "" if r["error_pct"] is None else f"{r['error_pct']:+.1f}"
        lines.append(
            f"{r['row'] + 2:>4} {r['role']:<11} {r['kind']:<11} {r['label'][:44]:<44} "
            f"{obs:>10} {pred:>10} {r['unit']:<5} {err:>7} {r['quality']}  "
            f"{r['source'][:40]}; {r['note']}"
        )
    return "\n".join(lines)


def summary(table: list[dict]) -> str:
    bounded = [abs(r["error_pct"]) for r in table if r["bounded"]]
    lines = [
        f"bounded n={len(bounded):>3}  within +-{BOUND_PCT:.0f}%: "
        f"{sum(e <= BOUND_PCT for e in bounded)}  max |err| {max(bounded):5.1f}%  "
        f"(out of bound by design: {len(OUT_OF_BOUND)}, see OUT_OF_BOUND)"
    ]
    for role in ("fit", "holdout", "cross-check"):
        rows = [r for r in table if r["role"] == role]
        errors = np.array([abs(r["error_pct"]) for r in rows])
        if len(errors):
            lines.append(
                f"{role:<11} n={len(rows):>3}  median |err| {percentile(errors, 50):5.1f}%  "
                f"mean |err| {errors.mean():5.1f}%  max |err| {errors.max():5.1f}%"
            )
    return "\n".join(lines)


def markdown_table(table: list[dict], before: dict[tuple[int, str], float] | None = None) -> str:
    """Measured vs model per point; ``before``: (row, kind) -> an earlier model's err%."""
    head = "| csv line | role | kind | point | measured | model | unit | err % |"
    rule = "|---:|---|---|---|---:|---:|---|---:|"
    if before is not None:
        head, rule = head + " before % |", rule + "---:|"
    lines = [head + " bound | q | note |", rule + "---|---|---|"]
    for r in table:
        if r["predicted"] is None:
            continue
        bound = "in" if r["bounded"] else "out" if r["role"] != "cross-check" else "-"
        cells = [
            str(r["row"] + 2),
            r["role"],
            r["kind"],
            r["label"],
            f"{r['observed']:.2f}",
            f"{r['predicted']:.2f}",
            r["unit"],
            f"{r['error_pct']:+.1f}",
        ]
        if before is not None:
            old = before.get((r["row"], r["kind"]))
            cells.append("" if old is None else f"{old:+.1f}")
        cells += [bound, r["quality"], r["note"].replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(cals: dict[str, Calibration]) -> str:
    lines = []
    for era, c in cals.items():
        effs = " ".join(
            f"{a}: eta_compute={e.eta_compute:.3f} eta_memory={e.eta_memory:.3f};"
            for a, e in c.gpus.items()
        )
        lines.append(
            f"{era}: {effs} eta_moe={c.eta_moe:.3f} t_fixed={1e3 * c.t_fixed:.3f} ms "
            f"t_per_seq={1e6 * c.t_per_seq:.1f} us t_request={1e3 * c.t_request:.2f} ms"
        )
    return "\n".join(lines)


def all_points(csv_path: Path, holdout_path: Path | None) -> list[Point]:
    points = load_points(csv_path)
    points += ttft_points(points, csv_path)
    if holdout_path is not None:
        extra = load_points(holdout_path)
        extra += ttft_points(extra, holdout_path)
        points += [replace(p, role="holdout") if p.role == "fit" else p for p in extra]
    return points


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument(
        "--holdout",
        type=Path,
        default=None,
        help="set-aside validation rows (same columns); scored, never fitted",
    )
    parser.add_argument("--write", action="store_true", help=f"write {CALIBRATION_FILE.name}")
    args = parser.parse_args(argv)
    points = all_points(args.csv, args.holdout)
    cals = fit(points)
    table = error_table(points, cals)
    print(describe(cals))
    print(format_table(table))
    print(summary(table))
    if args.write:
        write_calibration(cals, table)
        REPORT_FILE.write_text(f"{format_table(table)}\n{summary(table)}\n")
        print(f"wrote {CALIBRATION_FILE} and {REPORT_FILE}")


if __name__ == "__main__":
    main()
