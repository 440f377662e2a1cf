"""GPU KV block pool with a prefix cache, and the optional shared global KV tier.

The pool tracks counts and hashes, not block ids: a block is either free and uncached,
cached (hash -> reference count; at zero references it sits in the LRU free list and can
be evicted), or private to one request (allocated, not, or not yet, holding a full
cached prompt block). Allocation takes never-used / uncached free blocks first and then
evicts the least recently freed cached block. vLLM keeps both kinds in one LRU queue;
uncached freed blocks are few (partial and decode blocks), so the difference is small.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from enginesim.engine.events import AllBlocksCleared, BlockRemoved, KVEvent


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True,
                 record_events: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.record_events = record_events  # False: nobody reads KV events (no publisher)
        self.free_uncached = num_blocks
        self.refcount: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.events: list[KVEvent] = []
        self._evicted: list[int] = []

    @property
    def num_free(self) -> int:
        return self.free_uncached + len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def count_cached_prefix(self, hashes: Sequence[int], max_blocks: int) -> int:
        """Number of leading ``hashes`` present in the cache (read-only)."""
        if not self.enable_caching:
            return 0
        refcount = self.refcount
        n = 0
        for h in hashes[:max_blocks]:
            if h not in refcount:
                break
            n += 1
        return n

    def count_evictable(self, hashes: Iterable[int]) -> int:
        refcount = self.refcount
        return sum(1 for h in hashes if refcount[h] == 0)

    def touch(self, hashes: Iterable[int]) -> None:
        """Take a reference on cached blocks (prefix hit); unreferenced ones leave the LRU."""
        refcount, evictable = self.refcount, self.evictable
        for h in hashes:
            if refcount[h] == 0:
                del evictable[h]
            refcount[h] += 1

    def allocate(self, n: int) -> bool:
        """Take ``n`` free blocks, evicting LRU cached blocks if needed; False if too few."""
        if n <= 0:
            return n == 0
        if n > self.num_free:
            return False
        from_uncached = min(n, self.free_uncached)
        self.free_uncached -= from_uncached
        popitem, refcount = self.evictable.popitem, self.refcount
        evicted = [popitem(last=False)[0] for _ in range(n - from_uncached)]
        for h in evicted:
            del refcount[h]
        if self.record_events:
            self._evicted.extend(evicted)
        return True

    def cache(self, block_hash: int) -> bool:
        """Register one allocated block as holding ``block_hash``; False if already cached."""
        if not self.enable_caching or block_hash in self.refcount:
            return False
        self.refcount[block_hash] = 1
        return True

    def cache_run(self, hashes: Sequence[int]) -> list[int]:
        """``cache`` for consecutive blocks; returns the hashes newly cached."""
        if not self.enable_caching:
            return []
        refcount = self.refcount
        stored = [h for h in hashes if h not in refcount]
        for h in stored:
            refcount[h] = 1
        return stored

    def release(self, hashes: Sequence[int], num_private: int) -> None:
        """Free a request's blocks; later blocks of the chain become evictable first."""
        self.free_uncached += num_private
        refcount, evictable = self.refcount, self.evictable
        for h in reversed(hashes):
            refs = refcount[h] - 1
            refcount[h] = refs
            if refs == 0:
                evictable[h] = None

    def reset(self) -> bool:
        """Drop every cached block; refused (False) while any block is in use, like vLLM."""
        if self.num_free != self.num_blocks:
            return False
        self.free_uncached = self.num_blocks
        self.refcount.clear()
        self.evictable.clear()
        self._evicted.clear()
        if self.record_events:
            self.events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        if self._evicted:
            self.events.append(BlockRemoved(self._evicted))
            self._evicted = []
        events, self.events = self.events, []
        return events


class GlobalKVTier:
    """A KV store shared by several engines (e.g. a CPU/remote pool, SMetric's setting).

    Holds up to ``capacity_blocks`` block hashes in LRU order. Engines write every block
    they compute through to it and, on a local miss, load the consecutive blocks it holds
    at ``bandwidth`` bytes/s instead of recomputing them.
    """

    def __init__(self, capacity_blocks: int, bandwidth: float) -> None:
        if capacity_blocks <= 0 or bandwidth <= 0:
            raise ValueError("GlobalKVTier needs a positive capacity and bandwidth")
        self.capacity_blocks = capacity_blocks
        self.bandwidth = bandwidth
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.hits = 0
        self.stores = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def count_prefix(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """Number of consecutive ``hashes[start:stop]`` held by the tier (read-only)."""
        blocks = self._blocks
        n = 0
        for h in hashes[start:stop]:
            if h not in blocks:
                break
            n += 1
        return n

    def touch(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            self._blocks.move_to_end(h)
            self.hits += 1

    def store(self, block_hash: int) -> None:
        blocks = self._blocks
        if block_hash in blocks:
            blocks.move_to_end(block_hash)
            return
        blocks[block_hash] = None
        self.stores += 1
        if len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)

    def transfer_time(self, num_blocks: int, block_bytes: int) -> float:
        return num_blocks * block_bytes / self.bandwidth
