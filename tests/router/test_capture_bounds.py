"""The router's capture buffer, in process: the
block hashes leave the router as keyed digests only, a prompt sends at most
MAX_CAPTURE_BLOCKS blocks, a stream entry at most CAPTURE_BATCH_BLOCKS, and while Redis
is away the buffer is bounded in blocks as well as in requests."""

from __future__ import annotations

import numpy as np

from router_worker import capture as capture_module
from router_worker.capture import CaptureBuffer
from router_worker.contract import telemetry as contract
from router_worker.contract.capture import CaptureKey
from router_worker.contract.config import CaptureSpec
from router_worker.routing.features import RequestFeatures

SPEC = CaptureSpec(id=3, salt="s" * 32)


def _features(blocks: int, seed: int = 0) -> RequestFeatures:
    hashes = tuple(np.random.default_rng(seed).integers(1, 2**63, blocks, dtype=np.uint64).tolist())
    return RequestFeatures(
        request_id=f"r{seed}",
        prompt_tokens=blocks * 16,
        block_hashes=hashes,
        block_size=16,
        session_key="user-1",
        turn_index=None,
        arrival_time=1.0 + seed,
    )


def _add(buffer: CaptureBuffer, features: RequestFeatures) -> None:
    buffer.add(
        SPEC,
        features,
        output_tokens=4,
        instance="i0",
        arm="",
        status=200,
        ttft_s=0.1,
        tpot_s=0.01,
    )


def test_block_hashes_leave_the_router_keyed_and_capped():
    buffer = CaptureBuffer()
    small, huge = _features(40, 1), _features(contract.MAX_CAPTURE_BLOCKS + 5, 2)
    _add(buffer, small)
    _add(buffer, huge)
    [batch] = buffer.drain("c", "r0")
    assert batch.keyed
    sent = [contract.decode_block_hashes(r.block_hashes, 10**6) for r in batch.requests]
    assert sent[0] == tuple(CaptureKey(SPEC.salt).block_ids(small.block_hashes))
    assert not set(sent[0]) & set(small.block_hashes)  # no raw fingerprint
    assert len(sent[1]) == contract.MAX_CAPTURE_BLOCKS
    assert batch.requests[1].prompt_tokens == huge.prompt_tokens  # the length stays whole


def test_stream_entries_are_bounded_in_blocks():
    buffer = CaptureBuffer()
    for seed in range(6):
        _add(buffer, _features(contract.MAX_CAPTURE_BLOCKS, seed))
    batches = buffer.drain("c", "r0")
    per_entry = contract.CAPTURE_BATCH_BLOCKS // contract.MAX_CAPTURE_BLOCKS
    assert [len(b.requests) for b in batches] == [per_entry, 6 - per_entry]
    assert all(
        len(b.to_stream_fields()["data"]) < contract.MAX_CAPTURE_ENTRY_BYTES for b in batches
    )


def test_the_buffer_is_bounded_in_blocks_while_redis_is_away(monkeypatch):
    monkeypatch.setattr(capture_module, "CAPTURE_BUFFER_BLOCKS", 1000)
    buffer = CaptureBuffer()
    for seed in range(5):
        _add(buffer, _features(400, seed))
    assert len(buffer) == 2 and buffer.dropped == 3  # the newest two: 800 blocks
    [batch] = buffer.drain("c", "r0")
    assert [r.at for r in batch.requests] == [4.0, 5.0]
    _add(buffer, _features(400, 9))
    assert len(buffer) == 1 and buffer.dropped == 3  # drained: room again
