"""Synthetic traces for what the public traces lack.

``python -m enginesim.replay.synth agentic --out FILE [--sessions N] [--seed S] ...``
``python -m enginesim.replay.synth hotspot --background TRACE --out FILE [--at S] ...``

**Agentic sessions** (:class:`AgenticParams`, Bailian/Qwen JSONL, 16-token blocks). The
public Mooncake traces have no session ids and the Bailian files are not obtainable
here, yet SMetric and session stickiness need multi-turn agent traffic. Each session:

* starts from one of ``system_prompts`` shared system prompts (an agent's instructions
  plus tool schemas: ``system_tokens`` long, shared by every session using it), prompt k
  chosen with Zipf popularity ∝ 1/k^``system_zipf`` (0: uniformly);
* runs a geometric number of turns (mean ``mean_turns``, at most ``max_turns``);
* turn 1 adds a user message; each later turn adds, with probability ``tool_turn_prob``,
  a tool output (long: ``tool_tokens`` mean) after a short tool-execution gap
  (``tool_gap_s`` mean), else a user message (``user_tokens`` mean) after a human think
  gap (``think_gap_s`` mean);
* every turn's prompt is the previous prompt + the previous reply + the new message, so
  context grows and consecutive turns share all but the tail (block ids are assigned
  along the session's token stream, so equal ids mean equal prefixes, as in the trace);
* replies are ``reply_tokens`` mean (tool calls and answers alike).
Sessions start as a Poisson process at ``session_rate`` per second. Lengths are
lognormal with sigma ``length_sigma``; gaps exponential. The defaults are round numbers
of the order SMetric's and the Bailian paper's descriptions give for agent workloads
(long shared system prompts, tens of turns, tool outputs of thousands of tokens), not a
fit to any private trace.

**Hotspot burst** (:class:`BurstParams`, Mooncake JSONL, 512-token blocks). Real traces
rarely contain the case LMetric's detector exists for: one long prefix suddenly taking
most of the traffic. :func:`hotspot_burst` overlays on a background trace (a real one by
default) ``burst_rate`` requests per second for ``duration_s`` from ``at_s``, all
starting with the same ``prefix_tokens`` prefix (e.g. a long document everyone asks
about), each with a private suffix of ``suffix_tokens`` mean and ``output_tokens`` mean.
The prefix ids are taken above the background's largest id, so they share nothing else,
and differ from seed to seed.
With ``ramp_s`` the burst's rate grows linearly from 0 over that many seconds, as a
document that becomes popular does: the first requests put the prefix on one or two
instances, where the product keeps sending the rest (the paper's hotspot); a step burst
instead spreads the prefix while its first prefill is still in flight.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from enginesim.replay.traces import (
    BAILIAN_BLOCK,
    MOONCAKE_BLOCK,
    TraceRecord,
    read_trace,
)


@dataclass(frozen=True)
class AgenticParams:
    sessions: int = 200
    session_rate: float = 0.5  # new sessions per second
    system_prompts: int = 4
    system_zipf: float = 0.0  # popularity of system prompt k ∝ 1/k^s; 0 = uniform
    system_tokens: int = 4096
    mean_turns: float = 8.0
    max_turns: int = 40
    tool_turn_prob: float = 0.7
    user_tokens: float = 200.0
    tool_tokens: float = 1500.0
    reply_tokens: float = 150.0
    think_gap_s: float = 20.0
    tool_gap_s: float = 2.0
    length_sigma: float = 0.6
    max_context: int = 120_000
    seed: int = 0


@dataclass(frozen=True)
class BurstParams:
    at_s: float = 300.0
    duration_s: float = 120.0
    burst_rate: float = 8.0  # requests per second on the hot prefix
    prefix_tokens: int = 16_384
    suffix_tokens: float = 400.0
    output_tokens: float = 200.0
    length_sigma: float = 0.6
    ramp_s: float = 0.0  # the rate grows linearly from 0 to burst_rate over this long
    seed: int = 0


_IDS_PER_SEED = 1 << 24  # block ids one burst may use (8 billion tokens of 512-token blocks)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> int:
    """A positive integer with the given mean (lognormal with log-stddev ``sigma``)."""
    return max(1, round(float(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma))))


class _IdSource:
    def __init__(self, start: int = 0) -> None:
        self.next = start

    def take(self, count: int) -> list[int]:
        ids = list(range(self.next, self.next + count))
        self.next += count
        return ids


# ----------------------------------------------------------------- agentic sessions


def agentic_sessions(params: AgenticParams) -> list[dict]:
    """Bailian-format rows (dicts) of ``params.sessions`` agent sessions, sorted by time."""
    rng = np.random.default_rng(params.seed)
    ids = _IdSource()
    system_blocks = params.system_tokens // BAILIAN_BLOCK
    systems = [ids.take(system_blocks) for _ in range(params.system_prompts)]
    popularity = 1.0 / np.arange(1, params.system_prompts + 1) ** params.system_zipf
    popularity /= popularity.sum()
    rows: list[dict] = []
    start = 0.0
    for session in range(params.sessions):
        start += rng.exponential(1.0 / params.session_rate)
        choice = (
            rng.choice(params.system_prompts, p=popularity)
            if params.system_zipf
            else rng.integers(params.system_prompts)
        )  # (the uniform draw of old)
        system = systems[int(choice)]
        rows.extend(_session_rows(rng, ids, params, session, start, system))
    rows.sort(key=lambda row: (row["timestamp"], row["chat_id"]))
    return rows


def _session_rows(
    rng: np.random.Generator,
    ids: _IdSource,
    params: AgenticParams,
    session: int,
    start: float,
    system: list[int],
) -> list[dict]:
    turns = min(int(rng.geometric(1.0 / params.mean_turns)), params.max_turns)
    stream = list(system)  # block ids along the session's token stream
    length = len(system) * BAILIAN_BLOCK
    now, parent, rows = start, -1, []
    for turn in range(1, turns + 1):
        tool = turn > 1 and rng.random() < params.tool_turn_prob
        message = _lognormal(
            rng, params.tool_tokens if tool else params.user_tokens, params.length_sigma
        )
        if turn > 1:
            now += rng.exponential(params.tool_gap_s if tool else params.think_gap_s)
        length += message
        reply = _lognormal(rng, params.reply_tokens, params.length_sigma)
        if length + reply > params.max_context:
            break
        blocks = -(-length // BAILIAN_BLOCK)
        # Ids follow block positions of the session's token stream: a turn's partial last
        # block is the head of the same block, completed, in the next turn.
        stream.extend(ids.take(max(0, blocks - len(stream))))
        chat_id = session * 1000 + turn
        rows.append(
            {
                "chat_id": chat_id,
                "parent_chat_id": parent,
                "timestamp": round(now, 3),
                "input_length": length,
                "output_length": reply,
                "type": "tool" if tool else "text",
                "turn": turn,
                "hash_ids": stream[:blocks],
            }
        )
        parent = chat_id
        length += reply
    return rows


# ----------------------------------------------------------------- hotspot burst


def hotspot_burst(background: Sequence[TraceRecord], params: BurstParams) -> list[TraceRecord]:
    """``background`` plus a burst of requests sharing one long prefix; sorted by time."""
    rng = np.random.default_rng(params.seed)
    top = max((max(r.hash_ids, default=0) for r in background), default=0)
    # each seed its own prefix: a second burst (the load generator adds 1 to the seed per
    # burst) must not find the first one's prefix already cached everywhere
    ids = _IdSource(top + 1 + params.seed * _IDS_PER_SEED)
    prefix_blocks = params.prefix_tokens // MOONCAKE_BLOCK
    prefix = ids.take(prefix_blocks)
    burst: list[TraceRecord] = []
    now = params.at_s
    while True:
        now += rng.exponential(1.0 / params.burst_rate)
        if now >= params.at_s + params.duration_s:
            break
        if params.ramp_s > 0 and rng.random() > (now - params.at_s) / params.ramp_s:
            continue  # thinning: the rate ramps up linearly over ramp_s
        suffix = _lognormal(rng, params.suffix_tokens, params.length_sigma)
        length = prefix_blocks * MOONCAKE_BLOCK + suffix
        blocks = prefix + ids.take(-(-length // MOONCAKE_BLOCK) - prefix_blocks)
        burst.append(
            TraceRecord(
                0,
                now,
                length,
                _lognormal(rng, params.output_tokens, params.length_sigma),
                tuple(blocks),
                MOONCAKE_BLOCK,
                kind="hotspot",
            )
        )
    merged = sorted([*background, *burst], key=lambda r: r.arrival_s)
    return [replace(r, index=i) for i, r in enumerate(merged)]


def mooncake_rows(records: Sequence[TraceRecord]) -> list[dict]:
    return [
        {
            "timestamp": round(r.arrival_s * 1000),
            "input_length": r.input_tokens,
            "output_length": r.output_tokens,
            "hash_ids": list(r.hash_ids),
        }
        for r in records
    ]


# ----------------------------------------------------------------- command line


def write_jsonl(rows: Sequence[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, separators=(", ", ": ")) + "\n")


def _add_params(parser: argparse.ArgumentParser, params_class: type) -> None:
    for item in fields(params_class):
        parser.add_argument(
            f"--{item.name.replace('_', '-')}", type=type(item.default), default=item.default
        )


def _params(args: argparse.Namespace, params_class: type) -> object:
    return params_class(**{item.name: getattr(args, item.name) for item in fields(params_class)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enginesim.replay.synth")
    sub = parser.add_subparsers(dest="kind", required=True)
    agentic = sub.add_parser("agentic", help="multi-turn agent sessions (Bailian format)")
    _add_params(agentic, AgenticParams)
    hotspot = sub.add_parser("hotspot", help="a hot-prefix burst over a background trace")
    hotspot.add_argument("--background", required=True, type=Path)
    _add_params(hotspot, BurstParams)
    for command in (agentic, hotspot):
        command.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.kind == "agentic":
        rows = agentic_sessions(_params(args, AgenticParams))  # type: ignore[arg-type]
    else:
        records = hotspot_burst(read_trace(args.background), _params(args, BurstParams))  # type: ignore[arg-type]
        rows = mooncake_rows(records)
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} requests to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
