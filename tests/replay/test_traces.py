"""Trace readers on real trace lines, selection, and token synthesis."""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginesim.replay.traces import (
    TraceFormatError,
    TraceRecord,
    block_token_ids,
    detect_format,
    read_trace,
    select,
    synthesize_tokens,
)
from router_worker.routing import hash_blocks
from tests.replay.helpers import AZURE_CODE, CONVERSATION, SYNTHETIC, head_lines


def test_mooncake_reader_on_real_lines(trace_head):
    path = trace_head(CONVERSATION, 5)
    records = read_trace(path)
    assert detect_format(path) == "mooncake"
    first = json.loads(head_lines(CONVERSATION, 1)[0])
    assert len(records) == 5
    assert records[0].arrival_s == first["timestamp"] / 1000
    assert records[0].input_tokens == 6758 and records[0].output_tokens == 500
    assert records[0].hash_ids == tuple(first["hash_ids"])
    assert records[0].hash_block_size == 512
    assert all(r.hash_ids[0] == 0 for r in records)  # the shared system prompt block
    assert records[0].session_id is None and records[0].turn is None


def test_mooncake_synthetic_millisecond_timestamps(trace_head):
    records = read_trace(trace_head(SYNTHETIC, 3))
    assert [r.arrival_s for r in records] == [0.0, 0.0, 0.04]
    assert len(records[0].hash_ids) == -(-records[0].input_tokens // 512)


def test_azure_reader_on_real_lines(trace_head):
    path = trace_head(AZURE_CODE, 4, ".csv")  # header + 3 rows
    records = read_trace(path)
    assert detect_format(path) == "azure"
    assert [(r.input_tokens, r.output_tokens) for r in records] == [
        (4808, 10),
        (3180, 8),
        (110, 27),
    ]
    # 18:17:03.9799600 → .0319600 → .0781490: relative seconds, sub-ms precision kept
    assert records[1].arrival_s == pytest.approx(0.052, abs=1e-6)
    assert records[2].arrival_s == pytest.approx(0.098189, abs=1e-6)
    assert all(r.hash_ids == () for r in records)


def test_bailian_reader_follows_parent_chain(tmp_path):
    # The Bailian files are Git LFS objects we could not fetch; lines follow its README schema.
    rows = [
        {
            "chat_id": 7,
            "parent_chat_id": -1,
            "timestamp": 0.5,
            "input_length": 40,
            "output_length": 9,
            "type": "text",
            "turn": 1,
            "hash_ids": [1, 2, 3],
        },
        {
            "chat_id": 9,
            "parent_chat_id": -1,
            "timestamp": 1.0,
            "input_length": 20,
            "output_length": 3,
            "type": "search",
            "turn": 1,
            "hash_ids": [4, 5],
        },
        {
            "chat_id": 8,
            "parent_chat_id": 7,
            "timestamp": 2.25,
            "input_length": 70,
            "output_length": 5,
            "type": "text",
            "turn": 2,
            "hash_ids": [1, 2, 3, 6, 7],
        },
    ]
    path = tmp_path / "bailian.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    records = read_trace(path)
    assert detect_format(path) == "bailian"
    assert [r.session_id for r in records] == ["chat-7", "chat-9", "chat-7"]
    assert [r.turn for r in records] == [0, 0, 1]
    assert records[2].arrival_s == 2.25 and records[2].hash_block_size == 16
    assert records[1].kind == "search"


def test_unknown_format_is_refused(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"foo": 1}\n')
    with pytest.raises(TraceFormatError, match="unrecognised"):
        read_trace(path)


def test_select_window_rate_scale_and_limit():
    records = [TraceRecord(i, float(t), 10, 1) for i, t in enumerate([0, 1, 2, 3, 4, 5])]
    chosen = select(records, start_s=1.0, end_s=5.0, rate_scale=2.0, max_requests=3)
    assert [r.arrival_s for r in chosen] == [0.0, 0.5, 1.0]
    assert [r.index for r in chosen] == [0, 1, 2]
    with pytest.raises(ValueError):
        select(records, rate_scale=0)


def test_synthesis_preserves_trace_prefix_sharing_exactly():
    a = TraceRecord(0, 0.0, 3 * 512 + 100, 1, (0, 1, 2, 3), 512)
    b = TraceRecord(1, 0.0, 4 * 512 + 7, 1, (0, 1, 2, 9, 10), 512)
    ta, tb = synthesize_tokens(a), synthesize_tokens(b)
    assert len(ta) == a.input_tokens and len(tb) == b.input_tokens
    assert np.array_equal(ta[: 3 * 512], tb[: 3 * 512])
    assert not np.array_equal(ta[3 * 512 : 3 * 512 + 100], tb[3 * 512 : 3 * 512 + 100])
    ha, hb = hash_blocks(ta, 16), hash_blocks(tb, 16)
    shared = sum(1 for x, y in zip(ha, hb, strict=False) if x == y)
    assert shared == 3 * 512 // 16  # exactly the trace's three shared blocks
    # the last block is partial: it is the head of the same id's full block
    c = TraceRecord(2, 0.0, 4 * 512, 1, (0, 1, 2, 3), 512)
    assert np.array_equal(synthesize_tokens(c)[: len(ta)], ta)


def test_distinct_ids_give_distinct_blocks_and_valid_tokens():
    blocks = block_token_ids(np.arange(200_000), 16)
    assert len(np.unique(blocks, axis=0)) == 200_000
    assert blocks.min() >= 1000 and blocks.max() < 1000 + 65536


def test_records_without_prefix_info_share_nothing():
    a, b = TraceRecord(0, 0.0, 600, 1), TraceRecord(1, 0.0, 600, 1)
    ha = hash_blocks(synthesize_tokens(a), 16)
    hb = hash_blocks(synthesize_tokens(b), 16)
    assert not set(ha) & set(hb)


def test_synthesis_on_real_conversation_prefixes(trace_head):
    records = read_trace(trace_head(CONVERSATION, 20))
    hashes = [hash_blocks(synthesize_tokens(r), 16) for r in records]
    for i in range(len(records)):
        for j in range(i):
            common = 0
            for x, y in zip(records[i].hash_ids, records[j].hash_ids, strict=False):
                if x != y:
                    break
                common += 1
            full = min(common * 512, records[i].input_tokens, records[j].input_tokens) // 16
            shared = sum(1 for x, y in zip(hashes[i], hashes[j], strict=False) if x == y)
            assert shared == full, (i, j)
