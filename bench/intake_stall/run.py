"""Do big prompts stall other clients' streams? Intake on the event loop vs in a worker.

One client streams completions back to back (a short prompt, 64 tokens each) through a
router while another sends max-size prompts (8 MiB of text, ``max_tokens`` 1) one after
the other. The table gives the streaming client's gaps between SSE chunks (from one
stream's last chunk to the next one's first included) and the
router's event-loop lag (its ``switchyard_router_loop_lag_seconds`` histogram: how late a
10 ms timer fired) while the big prompts were being taken in, for:

- ``inline``: ``router.offload_body_bytes`` set above the body limit, so every body is
  parsed, tokenized and hashed on the event loop (the router before the intake worker processes);
- ``worker``: the default (bodies from 64 KiB go to a worker process, router/intake.py);

with the big prompts forwarded to the engines (``engines``) or naming an unknown model, so
that the router refuses them with a 404 once taken in (``router only``: the engines' own
handling of 8 MiB prompts, which stalls enginesim's streams too, is out of the figures);
each with the approximate tokenizer (the default) and an exact one (a HF ``tokenizers``
WordLevel tokenizer.json written by the bench, whitespace pre-tokenizer; its speed on the
measured machine is in the report).
The engines (enginesim, 2 instances at 20x speed) tokenize the big prompts too, in a
thread; that load is the same in every row. The first big prompt of each ``worker`` row
also starts the worker process (a spawn), which the rows include.

The report also times the intake alone, in this process (what the intake worker spares
the event loop): one 8 MiB body taken in (parse, field checks, tokenization, block hashing)
as text with each tokenizer and as a list of token ids.

    .venv/bin/python -m bench.intake_stall.run [--big 3] [--mib 8]
    .venv/bin/python -m bench.intake_stall.run --assemble    # README.md from results.json

Writes ``README.md`` (the tables and their reading, all from this run) and
``results.json`` under ``--out`` (default: this study's folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lib.loadclient import MODEL
from bench.lib.matrix import machine
from devharness import Fleet, start_router
from engine_interface import percentile, read_histogram, read_samples
from router_worker.intake import IntakeSettings, take_in_with
from router_worker.tokenization import DEFAULT_TEMPLATE

ADMIN_TOKEN = "bench-intake-stall"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

WORDS = [f"w{i}" for i in range(5000)]


def write_tokenizer(directory: Path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {word: i for i, word in enumerate(WORDS)}
    vocab["[UNK]"] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def big_body(mib: int, model: str = MODEL) -> bytes:
    size = mib * 1024 * 1024 - 256
    text = " ".join(WORDS) + " "
    prompt = (text * (size // len(text) + 1))[:size]
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()


def loop_lag(url: str) -> dict[float, float]:
    """Cumulative bucket counts of the router's loop-lag histogram: {le: count}."""
    name = "switchyard_router_loop_lag_seconds"
    text = httpx.get(url + "/metrics", timeout=10, headers=ADMIN_HEADERS).text
    samples, _ = read_samples(text, [name])
    histogram = read_histogram(samples, name)
    return dict(histogram.buckets) if histogram is not None else {}


def lag_summary(before: dict[float, float], after: dict[float, float]) -> tuple[int, str]:
    """(samples later than 50 ms, the largest bucket any sample fell in)."""
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    total = delta[float("inf")]
    late = int(total - max((c for le, c in delta.items() if le <= 0.05), default=0))
    worst = "-"
    previous = 0.0
    for le in sorted(delta):
        if delta[le] > previous:
            worst = f"<= {le * 1000:.0f} ms" if le != float("inf") else "> largest bucket"
        previous = delta[le]
    return late, worst


async def stream_until(url: str, done: asyncio.Event, gaps: list[float]) -> int:
    """Streams back to back; a gap runs from one chunk to the next, across streams too
    (a router stalled between two streams delays the next one's first chunk)."""
    body = {"model": MODEL, "prompt": "steady stream " * 8, "max_tokens": 64, "stream": True}
    count, last = 0, None
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        while not done.is_set():
            async with client.stream("POST", url + "/v1/completions", json=body) as response:
                async for _chunk in response.aiter_bytes():
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
            count += 1
    return count


async def send_big(url: str, raw: bytes, rounds: int) -> list[int]:
    statuses = []
    async with httpx.AsyncClient(timeout=300, trust_env=False) as client:
        for _ in range(rounds):
            response = await client.post(
                url + "/v1/completions", content=raw, headers={"content-type": "application/json"}
            )
            statuses.append(response.status_code)
    return statuses


async def measure(url: str, raw: bytes, rounds: int) -> dict[str, Any]:
    gaps: list[float] = []
    done = asyncio.Event()
    streamer = asyncio.create_task(stream_until(url, done, gaps))
    await asyncio.sleep(1.0)  # streams flowing before the first big prompt
    gaps.clear()
    before = loop_lag(url)
    started = time.perf_counter()
    statuses = await send_big(url, raw, rounds)
    elapsed = time.perf_counter() - started
    after = loop_lag(url)
    done.set()
    streams = await streamer
    late, worst = lag_summary(before, after)
    ordered = sorted(gaps)
    return {
        "streams": streams,
        "p50": percentile(ordered, 50) or 0.0,
        "p99": percentile(ordered, 99) or 0.0,
        "max": ordered[-1] if ordered else 0.0,
        "late": late,
        "worst": worst,
        "statuses": statuses,
        "elapsed": elapsed,
    }


def intake_alone(mib: int, tokenizer_path: str, repeat: int = 3) -> list[dict[str, Any]]:
    """The intake of one ``mib`` MiB body in this process, best of ``repeat``: parse and
    checks, tokenization, block hashing."""
    ids = json.dumps({"model": MODEL, "prompt": [7] * (mib * 1024 * 1024 // 3), "max_tokens": 1})
    cases = [
        ("text", "approx", big_body(mib), None),
        ("text", "exact", big_body(mib), tokenizer_path),
        ("token ids", "-", ids.encode(), None),
    ]
    rows = []
    for prompt, tier, raw, path in cases:
        settings = IntakeSettings(path, DEFAULT_TEMPLATE, 16)
        take_in_with(raw, "completions", settings)  # loads the tokenizer once
        best: dict[str, Any] | None = None
        for _ in range(repeat):
            started = time.perf_counter()
            intake = take_in_with(raw, "completions", settings)
            total = time.perf_counter() - started
            if best is None or total < best["total_s"]:
                best = {
                    "prompt": prompt,
                    "tokenizer": tier,
                    "mib": len(raw) / 2**20,
                    "tokens": intake.prompt_tokens,
                    "total_s": total,
                    "tokenize_s": intake.tokenize_s,
                    "hash_s": intake.hash_s,
                }
        assert best is not None
        rows.append(best)
    return rows


def reading(rows: list[dict[str, Any]]) -> list[str]:
    """Inline against worker, per tokenizer and target: the streams' largest gap and p99."""
    by = {(r["tier"], r["target"], r["mode"]): r for r in rows}
    lines = []
    for tier, target in dict.fromkeys((r["tier"], r["target"]) for r in rows):
        inline, worker = by.get((tier, target, "inline")), by.get((tier, target, "worker"))
        if inline and worker:
            lines.append(
                f"- {tier} tokenizer, big prompts reach {target}: largest chunk gap "
                f"{inline['max'] * 1000:.0f} ms inline, {worker['max'] * 1000:.0f} ms with the "
                f"worker (p99 {inline['p99'] * 1000:.1f} against {worker['p99'] * 1000:.1f} ms); "
                f"{inline['streams']} against {worker['streams']} streams done; the big prompts "
                f"took {inline['elapsed']:.1f} s against {worker['elapsed']:.1f} s."
            )
    return lines


def document(data: dict[str, Any]) -> str:
    """README.md from results.json alone."""
    lines = [
        "# Big prompts vs other clients' streams",
        "",
        f"Generated by `python -m bench.intake_stall.run` on {data['machine']} (load average "
        f"{data['load']:.1f} at the start; enginesim with 2 instances at 20x speed on the same "
        f"cores). One client streams 64-token completions back to back while another sends "
        f"{data['big']} prompts of {data['mib']} MiB one after the other. `inline`: every body "
        "parsed, tokenized and hashed on the router's event loop (`offload_body_bytes` above "
        "the body limit); `worker`: the default, bodies from 64 KiB taken in by a worker "
        "process. `engines`: the big prompts are forwarded (enginesim refuses them with 400 "
        "after tokenizing them itself, which stalls its own streams too); `router only`: they "
        "name an unknown model, so the router answers 404 once it has taken them in and the "
        "figures are the router's alone. Chunk gaps run from one chunk to the next, across "
        "streams. Loop lag is the router's `switchyard_router_loop_lag_seconds` histogram "
        "over the same time (a 10 ms timer's lateness; on a shared machine it includes "
        "waiting for a CPU).",
        "",
        "| tokenizer | big prompts reach | intake | streams done | chunk gap p50 | p99 | max "
        "| loop lag > 50 ms (samples) | worst loop lag | big prompts (s) | big statuses |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['tier']} | {r['target']} | {r['mode']} | {r['streams']} | "
            f"{r['p50'] * 1000:.1f} ms | {r['p99'] * 1000:.1f} ms | {r['max'] * 1000:.0f} ms | "
            f"{r['late']} | {r['worst']} | {r['elapsed']:.1f} | {r['statuses']} |"
        )
    lines += ["", "Reading:", "", *reading(data["rows"]), ""]
    lines += [
        "## The intake alone",
        "",
        "One body taken in by `take_in_with` in the bench's own process (what a thread "
        "would run while holding the GIL, and the event loop without the worker), best of 3:",
        "",
        "| prompt | tokenizer | body MiB | tokens | total ms | parse and checks ms | "
        "tokenize ms | hash ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["intake"]:
        parse = r["total_s"] - r["tokenize_s"] - r["hash_s"]
        lines.append(
            f"| {r['prompt']} | {r['tokenizer']} | {r['mib']:.1f} | {r['tokens']:,} | "
            f"{r['total_s'] * 1000:.0f} | {parse * 1000:.0f} | {r['tokenize_s'] * 1000:.0f} | "
            f"{r['hash_s'] * 1000:.0f} |"
        )
    return "\n".join([*lines, ""])


def router_config(fleet: Fleet, offload: int, tokenizer: str | None, mib: int) -> dict[str, Any]:
    """An lmetric router over ``fleet`` (KV events off) taking bodies of up to ``mib`` + 1 MiB,
    those from ``offload`` bytes in its intake worker."""
    return {
        "cluster": "bench",
        "model": MODEL,
        "instances": fleet.instances(),
        "policy": {"kind": "lmetric", "params": {}},
        "router": {
            "scrape_interval_s": 0.2,
            "health_interval_s": 0.2,
            "breaker_open_s": 0.5,
            "kv_events": False,
            "offload_body_bytes": offload,
            "tokenizer_path": tokenizer,
            "max_body_bytes": (mib + 1) * 1024 * 1024,
            "first_byte_timeout_s": 300,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--big", type=int, default=3, help="max-size prompts per row")
    parser.add_argument("--mib", type=int, default=8, help="size of each big prompt")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: rebuild README.md from results.json"
    )
    args = parser.parse_args()
    if args.assemble:
        data = json.loads((args.out / "results.json").read_text())
        (args.out / "README.md").write_text(document(data))
        return
    load = os.getloadavg()[0]
    directory = Path(tempfile.mkdtemp(prefix="sy-intake-bench-"))
    tokenizer_path = write_tokenizer(directory)
    targets = {"engines": big_body(args.mib), "router only": big_body(args.mib, "unknown")}
    rows = []
    # KV events published as vLLM sends them (the router does not subscribe: its load only)
    with Fleet(2, time_scale=0.05, kv_events=True, kv_encoding="array") as fleet:
        for tier, tokenizer in (("approx", None), ("exact", tokenizer_path)):
            for target, raw in targets.items():
                for mode, offload in (("inline", 1024**3), ("worker", 64 * 1024)):
                    config = router_config(fleet, offload, tokenizer, args.mib)
                    router = start_router(directory, config, admin_token=ADMIN_TOKEN)
                    try:
                        result = asyncio.run(measure(router.url, raw, args.big))
                    finally:
                        router.stop()
                    rows.append({"tier": tier, "target": target, "mode": mode, **result})
    data = {
        "machine": machine(),
        "load": load,
        "big": args.big,
        "mib": args.mib,
        "rows": rows,
        "intake": intake_alone(args.mib, tokenizer_path),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    text = document(data)
    (args.out / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
