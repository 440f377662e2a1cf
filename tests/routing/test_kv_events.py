import msgpack
import pytest

from router_worker.routing import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_kv_event_batch,
    encode_kv_event_batch,
)


def test_positional_encoding_as_vllm_sends_it():
    payload = msgpack.packb(
        [
            12.5,
            [
                ["BlockStored", [11, 12], None, list(range(32)), 16, None, "GPU"],
                ["BlockRemoved", [11], "GPU"],
                ["AllBlocksCleared"],
            ],
            0,
        ]
    )
    batch = decode_kv_event_batch(payload)
    assert batch.ts == 12.5 and batch.data_parallel_rank == 0
    stored, removed, cleared = batch.events
    assert stored == BlockStored((11, 12), None, tuple(range(32)), 16, None, "GPU")
    assert removed == BlockRemoved((11,), "GPU")
    assert cleared == AllBlocksCleared()


def test_map_encoding_and_bytes_hashes():
    payload = msgpack.packb(
        {
            "ts": 1.0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [b"\x01" * 32],
                    "parent_block_hash": b"\x00" * 32,
                    "token_ids": [1] * 16,
                    "block_size": 16,
                    "lora_id": None,
                    "medium": None,
                    "lora_name": None,
                }
            ],
        }
    )
    batch = decode_kv_event_batch(payload)
    assert batch.data_parallel_rank is None
    event = batch.events[0]
    assert isinstance(event, BlockStored)
    assert event.block_hashes == (b"\x01" * 32,)
    assert event.parent_block_hash == b"\x00" * 32


def test_trailing_defaults_may_be_omitted_and_unknown_tags_skipped():
    payload = msgpack.packb(
        [3.0, [["BlockStored", [1], None, [0] * 16, 16], ["SomethingNew", 1, 2]]]
    )
    batch = decode_kv_event_batch(payload)
    assert len(batch.events) == 1 and batch.skipped_events == 1
    assert isinstance(batch.events[0], BlockStored) and batch.events[0].medium is None


@pytest.mark.parametrize(
    "payload", [b"\xc1", msgpack.packb(42), msgpack.packb({"ts": 1}), msgpack.packb([1.0, [17]])]
)
def test_garbage_raises_a_clear_error(payload):
    with pytest.raises(KVEventDecodeError):
        decode_kv_event_batch(payload)


@pytest.mark.parametrize("positional", [True, False])
def test_encode_decode_round_trip(positional):
    batch = KVEventBatch(
        2.0,
        (
            BlockStored((5,), 4, tuple(range(16)), 16, 3, "GPU"),
            BlockRemoved((5,), None),
            AllBlocksCleared(),
        ),
        1,
    )
    assert decode_kv_event_batch(encode_kv_event_batch(batch, positional=positional)) == batch
