"""KV index: which router block hashes each instance holds.

One index per cluster. Instances are identified by *slots* (small ints handed
out by :class:`~router_worker.routing.indicators.ClusterState`); every slot has
an LRU of block hashes bounded by its capacity in blocks.

Lookup in time linear in the prompt's blocks
--------------------------------------------
``holders[block_hash]`` is a Python-int bitmask of the slots holding that block.
``longest_prefixes`` ANDs the masks of the request's blocks in order (a C-level
``accumulate``) and stops at the first all-zero mask, so one lookup costs
O(prompt blocks) big-int ANDs (a 1024-slot mask is 16 machine words) plus
O(instances) to write the answer, never blocks × instances. Because each
prefix mask is a subset of the previous one it is also numerically no larger,
so run boundaries are found by bisection.

Shadow updates and eviction order
---------------------------------
``insert(slot, blocks)`` records what the router itself sent (dispatch). The
blocks are touched last-to-first, so a prompt's leading blocks end up most
recently used and LRU eviction removes tails before shared prefixes, the way
vLLM frees a finished request's blocks (tail first).

Engine events
-------------
vLLM ``BlockStored`` / ``BlockRemoved`` name blocks by *engine* hashes, which
differ from ours (sha256, salts, LoRA). Each slot keeps an engine-hash →
router-hash map: a ``BlockStored`` is translated by continuing our chain from
the router hash of its ``parent_block_hash`` (or from the root when it has
none) over its ``token_ids``; so events from real vLLM and from enginesim both
land on the same keys as the router's own hashes. A stored event whose parent
is unknown cannot be translated and is counted in ``unresolved_events``. Blocks
kept on another medium (e.g. CPU offload) are ignored: the local index tracks
the GPU prefix cache only.

:class:`GlobalTier` is the optional view of a shared (global) KV tier for
SMetric: a set of router block hashes with a longest-prefix query.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat, takewhile
from operator import and_, neg

import numpy as np

from router_worker.routing.features import extend_chain
from router_worker.routing.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

GPU_MEDIA = (None, "GPU", "gpu")


class KVIndex:
    """Per-cluster index of block hashes held by each slot, each slot an LRU."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._holders: dict[int, int] = {}
        self._lru: list[OrderedDict[int, None] | None] = []
        self._capacity: list[int] = []
        self._engine_map: list[dict[object, int]] = []
        self.unresolved_events = 0
        self.unsupported_events = 0

    # ----- slots -----------------------------------------------------------
    def add_slot(self, capacity_blocks: int) -> int:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        self._lru.append(OrderedDict())
        self._capacity.append(capacity_blocks)
        self._engine_map.append({})
        return len(self._lru) - 1

    def remove_slot(self, slot: int) -> None:
        self.clear(slot)
        self._lru[slot] = None

    def set_capacity(self, slot: int, capacity_blocks: int) -> None:
        self._capacity[slot] = capacity_blocks
        self._evict_over_capacity(slot)

    @property
    def num_slots(self) -> int:
        return len(self._lru)

    def held_count(self, slot: int) -> int:
        lru = self._lru[slot]
        return 0 if lru is None else len(lru)

    def holds(self, slot: int, block_hash: int) -> bool:
        return bool(self._holders.get(block_hash, 0) >> slot & 1)

    # ----- lookup -------------------------------------------------------------
    def longest_prefixes(self, block_hashes: Sequence[int]) -> np.ndarray:
        """For every slot, the number of leading blocks of ``block_hashes`` it holds."""
        result = np.zeros(len(self._lru), dtype=np.int64)
        holder_masks = map(self._holders.get, block_hashes, repeat(0))  # C-level loop
        prefix_masks = list(takewhile(bool, accumulate(holder_masks, and_)))
        start = 0
        while start < len(prefix_masks):
            mask = prefix_masks[start]
            end = bisect_right(prefix_masks, -mask, lo=start, key=neg)
            # slots in this run's mask hold at least `end` blocks; those not in
            # the next run's mask hold exactly `end`.
            following = prefix_masks[end] if end < len(prefix_masks) else 0
            _assign_bits(result, mask & ~following, end)
            start = end
        return result

    # ----- shadow updates ---------------------------------------------------
    def insert(self, slot: int, block_hashes: Sequence[int]) -> None:
        """Record that ``slot`` now holds ``block_hashes`` (touching them as most recent)."""
        lru = self._lru[slot]
        if lru is None:
            return
        bit = 1 << slot
        holders = self._holders
        for block_hash in reversed(block_hashes):
            if block_hash in lru:
                lru.move_to_end(block_hash)
            else:
                lru[block_hash] = None
                holders[block_hash] = holders.get(block_hash, 0) | bit
        self._evict_over_capacity(slot)

    def remove(self, slot: int, block_hashes: Iterable[int]) -> None:
        lru = self._lru[slot]
        if lru is None:
            return
        for block_hash in block_hashes:
            if block_hash in lru:
                del lru[block_hash]
                self._drop_holder(block_hash, slot)

    def clear(self, slot: int) -> None:
        lru = self._lru[slot]
        if lru is None:
            return
        for block_hash in lru:
            self._drop_holder(block_hash, slot)
        lru.clear()
        self._engine_map[slot].clear()

    def _evict_over_capacity(self, slot: int) -> None:
        lru = self._lru[slot]
        assert lru is not None
        while len(lru) > self._capacity[slot]:
            block_hash, _ = lru.popitem(last=False)
            self._drop_holder(block_hash, slot)

    def _drop_holder(self, block_hash: int, slot: int) -> None:
        mask = self._holders.get(block_hash, 0) & ~(1 << slot)
        if mask:
            self._holders[block_hash] = mask
        else:
            self._holders.pop(block_hash, None)

    # ----- engine events ----------------------------------------------------
    def apply_event(self, slot: int, event: KVEvent) -> None:
        """Apply one decoded vLLM KV event reported by the instance in ``slot``."""
        if self._lru[slot] is None:
            return
        if isinstance(event, BlockStored):
            self._apply_stored(slot, event)
        elif isinstance(event, BlockRemoved):
            self._apply_removed(slot, event)
        elif isinstance(event, AllBlocksCleared):
            self.clear(slot)

    def _apply_stored(self, slot: int, event: BlockStored) -> None:
        if event.medium not in GPU_MEDIA:
            return
        per_engine_block = event.block_size // self.block_size
        if event.block_size % self.block_size or per_engine_block == 0:
            self.unsupported_events += 1
            return
        engine_map = self._engine_map[slot]
        parent: int | None = None
        if event.parent_block_hash is not None:
            parent = engine_map.get(event.parent_block_hash)
            if parent is None:
                self.unresolved_events += 1
                return
        router_hashes = extend_chain(parent, event.token_ids, self.block_size)
        for i, engine_hash in enumerate(event.block_hashes):
            mine = router_hashes[i * per_engine_block : (i + 1) * per_engine_block]
            if len(mine) < per_engine_block:
                break
            engine_map[engine_hash] = mine[-1]
            # Earlier router blocks of a multi-block engine block share its fate.
            self.insert(slot, mine)

    def _apply_removed(self, slot: int, event: BlockRemoved) -> None:
        if event.medium not in GPU_MEDIA:
            return
        engine_map = self._engine_map[slot]
        for engine_hash in event.block_hashes:
            router_hash = engine_map.pop(engine_hash, None)
            if router_hash is not None:
                self.remove(slot, (router_hash,))


def _assign_bits(result: np.ndarray, mask: int, value: int) -> None:
    while mask:
        low = mask & -mask
        result[low.bit_length() - 1] = value
        mask ^= low


class GlobalTier:
    """Optional view of a shared KV tier: which router block hashes it holds (LRU)."""

    def __init__(self, capacity_blocks: int | None = None) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def insert(self, block_hashes: Sequence[int]) -> None:
        for block_hash in reversed(block_hashes):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        if self.capacity_blocks is not None:
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)

    def remove(self, block_hashes: Iterable[int]) -> None:
        for block_hash in block_hashes:
            self._blocks.pop(block_hash, None)

    def longest_prefix(self, block_hashes: Sequence[int]) -> int:
        """Number of leading blocks of ``block_hashes`` the tier holds."""
        held = 0
        for block_hash in block_hashes:
            if block_hash not in self._blocks:
                break
            held += 1
        return held

    def __len__(self) -> int:
        return len(self._blocks)
