"""KV cache events in vLLM's semantics (vllm/distributed/kv_events.py).

``BlockStored`` when full blocks get computed and enter the prefix cache (one event per
request per step, the blocks in chain order, ``parent_block_hash`` = hash of the block
before the first, None at the start of a prompt); ``BlockRemoved`` when cached blocks are
evicted from the LRU free list; ``AllBlocksCleared`` on ``reset_prefix_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
