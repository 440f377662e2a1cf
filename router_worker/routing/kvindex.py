"""KV index: which router block hashes each instance holds.

One index per cluster. Instances are identified by *slots* (small ints handed
out by :class:`~router_worker.routing.indicators.ClusterState`); every slot has
an LRU of block hashes bounded by its capacity in blocks.

Prefix-closed masks: lookup in O(log n) per distinct hit length
----------------------------------------------------------------
``holders[h]`` is a Python-int bitmask of the slots holding block ``h``. Block
hashes are chained (:mod:`~router_worker.routing.features`): block ``k``'s
hash names the whole prefix ``blocks[0..k]``, so every block has exactly one
parent, recorded when the block is inserted. Alongside ``holders`` the index
keeps ``closed[h]``: the slots holding ``h`` *and every ancestor of h*. Along a
prompt's chain these masks are nested (each a subset of the previous one, so
numerically non-increasing), and a slot's hit is the number of leading blocks
whose closed mask contains it. ``longest_prefixes(hashes, chain=True)`` finds
where the mask changes by bisection: about log2(blocks) dict lookups per
distinct hit length (at most one per slot) instead of one per block; after a
few runs it switches to one C-level pass over the rest of the prompt, so many
distinct lengths never cost more than the plain scan.

Keeping ``closed`` exact: a slot gaining a block whose parent is closed for
it closes that block and, through a parent → children map, every descendant
it already held (a re-stored middle block makes its tail usable again); a
slot losing a block (eviction, ``BlockRemoved``, ``remove``) leaves the closed
masks of its descendants. Hits therefore equal the longest *contiguous*
leading run, exactly what vLLM's prefix cache can use — a block whose parent
was removed stays held (and counted in ``held_count``) but gives no hit until
the parent is back. Usually vLLM and the shadow LRU free tails first and the
descendant walk is empty.

``longest_prefixes(hashes)`` without ``chain`` accepts any sequence of hashes
(not necessarily a chain from the root) and ANDs the holder masks along it in
one C-level pass, stopping at the first all-zero mask. The index falls back
to that scan for chain queries too if an insert ever contradicts a recorded
parent (only possible for non-chained input or a 64-bit hash collision),
until it is empty again.

Shadow updates and eviction order
---------------------------------
``insert(slot, blocks, parent=None)`` records what the router itself sent
(dispatch; ``parent`` is the hash preceding ``blocks[0]``, None for a prompt's
first block). The blocks are touched last-to-first, so a prompt's leading
blocks end up most recently used and LRU eviction removes tails before shared
prefixes, the way vLLM frees a finished request's blocks (tail first).

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
the GPU prefix cache only. A ``BlockRemoved`` of a middle block drops it for
that slot; its descendants stay held but unusable (see above).

:class:`GlobalTier` is the optional view of a shared (global) KV tier for
SMetric: a set of router block hashes with a longest-prefix query.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import accumulate, islice, repeat, takewhile
from operator import and_, neg

import numpy as np

from router_worker.routing.features import extend_chain
from router_worker.routing.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

GPU_MEDIA = (None, "GPU", "gpu")

# Chain lookups bisect for this many distinct hit lengths, then scan the rest.
_BISECT_RUNS = 6
_MISSING = object()


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
        # Chain structure (see the module docstring); valid while ``_chained``.
        self._chained = True
        self._closed: dict[int, int] = {}
        self._parent: dict[int, int | None] = {}  # every block in the index -> parent
        self._children: dict[int, int | set[int]] = {}  # parent -> child, or set of them

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
    def longest_prefixes(self, block_hashes: Sequence[int], *, chain: bool = False) -> np.ndarray:
        """For every slot, the number of leading blocks of ``block_hashes`` it holds.

        ``chain=True`` promises that ``block_hashes`` is a prompt's chain as
        built by :func:`~router_worker.routing.features.hash_blocks` (each
        block's parent is the previous one, the first starts at the root); the
        answer is the same, found in O(log n) lookups per distinct hit length.
        """
        result = np.zeros(len(self._lru), dtype=np.int64)
        if chain and self._chained:
            self._chain_lookup(result, block_hashes)
            return result
        holder_masks = map(self._holders.get, block_hashes, repeat(0))  # C-level loop
        _assign_runs(result, list(takewhile(bool, accumulate(holder_masks, and_))), 0)
        return result

    def _chain_lookup(self, result: np.ndarray, block_hashes: Sequence[int]) -> None:
        get = self._closed.get
        end = len(block_hashes)
        mask = get(block_hashes[0], 0) if end else 0
        start = runs = 0

        def key(block_hash: int) -> int:
            return -get(block_hash, 0)

        while mask:
            if runs == _BISECT_RUNS:  # many distinct lengths: one C-level pass is cheaper
                tail = islice(block_hashes, start, None)
                _assign_runs(result, list(takewhile(bool, map(get, tail, repeat(0)))), start)
                return
            # closed masks along a chain are nested, hence numerically non-increasing
            stop = bisect_right(block_hashes, -mask, start + 1, end, key=key)
            following = get(block_hashes[stop], 0) if stop < end else 0
            _assign_bits(result, mask & ~following, stop)
            mask, start, runs = following, stop, runs + 1

    # ----- shadow updates ---------------------------------------------------
    def insert(self, slot: int, block_hashes: Sequence[int], parent: int | None = None) -> None:
        """Record that ``slot`` now holds ``block_hashes`` (touching them as most recent).

        ``block_hashes`` is a chain continuing from block ``parent`` (None: from
        the root, i.e. a prompt's leading blocks).
        """
        lru = self._lru[slot]
        if lru is None:
            return
        if not self._chained and not self._holders:
            self._chained = True  # empty again: the chain structure can restart
        if self._chained:
            self._register_chain(block_hashes, parent)
        bit = 1 << slot
        holders = self._holders
        for block_hash in reversed(block_hashes):
            if block_hash in lru:
                lru.move_to_end(block_hash)
            else:
                lru[block_hash] = None
                holders[block_hash] = holders.get(block_hash, 0) | bit
        if self._chained and block_hashes:
            closed = self._closed
            if parent is None or closed.get(parent, 0) & bit:
                # closure along a held chain is a prefix of it: find where it stops
                first_open = bisect_left(
                    block_hashes, True, key=lambda h: not closed.get(h, 0) & bit
                )
                if first_open < len(block_hashes):
                    self._close(bit, block_hashes[first_open])
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
        keep = ~(1 << slot)
        closed = self._closed
        for block_hash in lru:
            mask = self._holders[block_hash] & keep
            if mask:
                self._holders[block_hash] = mask
            else:
                del self._holders[block_hash]
                self._forget(block_hash)
            # every block of the slot goes, so no descendant walk is needed
            closed_mask = closed.get(block_hash, 0) & keep
            if closed_mask:
                closed[block_hash] = closed_mask
            else:
                closed.pop(block_hash, None)
        lru.clear()
        self._engine_map[slot].clear()

    def _evict_over_capacity(self, slot: int) -> None:
        lru = self._lru[slot]
        assert lru is not None
        while len(lru) > self._capacity[slot]:
            block_hash, _ = lru.popitem(last=False)
            self._drop_holder(block_hash, slot)

    def _drop_holder(self, block_hash: int, slot: int) -> None:
        bit = 1 << slot
        mask = self._holders.get(block_hash, 0) & ~bit
        if mask:
            self._holders[block_hash] = mask
        else:
            self._holders.pop(block_hash, None)
            self._forget(block_hash)
        if self._closed.get(block_hash, 0) & bit:
            self._open(bit, block_hash)

    # ----- chain structure ----------------------------------------------------
    def _register_chain(self, block_hashes: Sequence[int], parent: int | None) -> None:
        """Record each block's parent; an insert contradicting one unchains the index."""
        parents = self._parent
        for block_hash in block_hashes:
            known = parents.get(block_hash, _MISSING)
            if known is _MISSING:
                parents[block_hash] = parent
                if parent is not None:
                    self._add_child(parent, block_hash)
            elif known != parent:
                self._unchain()
                return
            parent = block_hash

    def _unchain(self) -> None:
        self._chained = False
        self._closed.clear()
        self._parent.clear()
        self._children.clear()

    def _forget(self, block_hash: int) -> None:
        """``block_hash`` left the index (no holder): drop its parent link."""
        if not self._chained:
            return
        parent = self._parent.pop(block_hash, None)
        if parent is None:
            return
        children = self._children.get(parent)
        if children is None:
            return
        if isinstance(children, set):
            children.discard(block_hash)
            if len(children) == 1:
                self._children[parent] = children.pop()
        elif children == block_hash:
            del self._children[parent]

    def _add_child(self, parent: int, child: int) -> None:
        children = self._children.get(parent)
        if children is None:
            self._children[parent] = child
        elif isinstance(children, set):
            children.add(child)
        elif children != child:
            self._children[parent] = {children, child}

    def _children_of(self, block_hash: int) -> Iterable[int]:
        children = self._children.get(block_hash)
        if children is None:
            return ()
        return children if isinstance(children, set) else (children,)

    def _close(self, bit: int, block_hash: int) -> None:
        """The slot holds ``block_hash`` and all its ancestors: close it and held descendants."""
        closed, holders = self._closed, self._holders
        stack = [block_hash]
        while stack:
            current = stack.pop()
            closed[current] = closed.get(current, 0) | bit
            for child in self._children_of(current):
                if holders.get(child, 0) & bit and not closed.get(child, 0) & bit:
                    stack.append(child)

    def _open(self, bit: int, block_hash: int) -> None:
        """The slot lost ``block_hash``: it and its descendants are no longer closed for it."""
        closed = self._closed
        stack = [block_hash]
        while stack:
            current = stack.pop()
            mask = closed.get(current, 0) & ~bit
            if mask:
                closed[current] = mask
            else:
                closed.pop(current, None)
            for child in self._children_of(current):
                if closed.get(child, 0) & bit:
                    stack.append(child)

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
            self.insert(slot, mine, parent)
            parent = mine[-1]

    def _apply_removed(self, slot: int, event: BlockRemoved) -> None:
        if event.medium not in GPU_MEDIA:
            return
        engine_map = self._engine_map[slot]
        for engine_hash in event.block_hashes:
            router_hash = engine_map.pop(engine_hash, None)
            if router_hash is not None:
                self.remove(slot, (router_hash,))


def _assign_runs(result: np.ndarray, prefix_masks: list[int], offset: int) -> None:
    """``prefix_masks[k]``: slots holding blocks ``offset..offset+k`` (nested, non-empty)."""
    start = 0
    while start < len(prefix_masks):
        mask = prefix_masks[start]
        end = bisect_right(prefix_masks, -mask, lo=start, key=neg)
        # slots in this run's mask hold at least `end` blocks; those not in
        # the next run's mask hold exactly `end`.
        following = prefix_masks[end] if end < len(prefix_masks) else 0
        _assign_bits(result, mask & ~following, offset + end)
        start = end


def _assign_bits(result: np.ndarray, mask: int, value: int) -> None:
    if mask.bit_count() > 8:  # many slots: unpack the mask in C
        raw = np.frombuffer(mask.to_bytes((len(result) + 7) // 8, "little"), dtype=np.uint8)
        result[np.unpackbits(raw, count=len(result), bitorder="little").view(bool)] = value
        return
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
