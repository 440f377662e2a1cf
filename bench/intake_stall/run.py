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
measured machine is in bench/intake_stall/README.md).
The engines (enginesim, 2 instances at 20x speed) tokenize the big prompts too, in a
thread; that load is the same in every row. The first big prompt of each ``worker`` row
also starts the worker process (a spawn), which the rows include.

    .venv/bin/python -m bench.intake_stall.run [--big 3] [--mib 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from devharness import stop_process
from engine_interface import percentile, read_histogram, read_samples
from tests.router.conftest import ADMIN_HEADERS, MODEL, launch_router, router_config, start_fleet

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--big", type=int, default=3, help="max-size prompts per row")
    parser.add_argument("--mib", type=int, default=8, help="size of each big prompt")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="sy-intake-bench-"))
    tokenizer_path = write_tokenizer(directory)
    targets = {"engines": big_body(args.mib), "router only": big_body(args.mib, "unknown")}
    fleet = start_fleet(2)
    rows = []
    try:
        for tier, tokenizer in (("approx", None), ("exact", tokenizer_path)):
            for target, raw in targets.items():
                for mode, offload in (("inline", 1024**3), ("worker", 64 * 1024)):
                    document = router_config(fleet, "lmetric")
                    document["router"].update(
                        offload_body_bytes=offload,
                        tokenizer_path=tokenizer,
                        max_body_bytes=(args.mib + 1) * 1024 * 1024,
                        first_byte_timeout_s=300,
                    )
                    router = launch_router(directory, document)
                    try:
                        result = asyncio.run(measure(router.url, raw, args.big))
                    finally:
                        stop_process(router.proc)
                    rows.append((tier, target, mode, result))
    finally:
        stop_process(fleet.proc)
    print(
        f"\n{args.big} prompts of {args.mib} MiB each, one after another, beside one client "
        "streaming 64-token completions back to back\n"
    )
    print(
        "| tokenizer | big prompts reach | intake | streams done | chunk gap p50 | p99 | max "
        "| loop lag > 50 ms (samples) | worst loop lag | big prompts (s) | big statuses |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for tier, target, mode, r in rows:
        print(
            f"| {tier} | {target} | {mode} | {r['streams']} | {r['p50'] * 1000:.1f} ms | "
            f"{r['p99'] * 1000:.1f} ms | {r['max'] * 1000:.0f} ms | {r['late']} | "
            f"{r['worst']} | {r['elapsed']:.1f} | {r['statuses']} |"
        )


if __name__ == "__main__":
    main()
