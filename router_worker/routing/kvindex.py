"""KV index: which router block hashes each instance holds.

One index per cluster. Instances are identified by *slots* (small ints handed
out by :class:`~router_worker.routing.indicators.ClusterState`); every slot has
an LRU of block hashes bounded by its capacity in blocks.

Usable and loose holders: lookup in O(log n) per distinct hit length
--------------------------------------------------------------------
Block hashes are chained (:mod:`~router_worker.routing.features`): block
``k``'s hash names the whole prefix ``blocks[0..k]``, so each block has one
parent. The slots holding block ``h`` are split into two Python-int bitmasks:

* ``closed[h]``: slots holding ``h`` *and every ancestor of h* (the prefix
  up to ``h`` is usable there) — normally every holder;
* ``loose[h]``: slots holding ``h`` but missing an ancestor (rare: a middle
  block removed by a ``BlockRemoved``, a parent evicted before its child, a
  stored event whose parent the slot no longer holds).

Along a prompt's chain the closed masks are nested (each a subset of the one
before, hence numerically non-increasing) and a slot's hit is the number of
leading blocks whose closed mask contains it, so ``longest_prefixes(hashes,
chain=True)`` finds where the mask changes by bisection: about log2(blocks)
dict lookups per distinct hit length instead of one per block (~17 instead
of ~480 for an 8k prompt cached on two groups of instances). After a few
distinct lengths it switches to one C-level pass over the rest of the prompt,
so many lengths never cost more than a scan. ``longest_prefixes(hashes)``
without ``chain`` accepts any sequence (not necessarily a chain from the
root) and ANDs ``closed | loose`` along it in one C-level pass, stopping at
the first empty mask, as before.

Keeping the split exact needs each block's children: ``children[p]`` (a block
or a set) for every block in the index, and each slot's LRU maps a block to
its parent. A slot losing a usable block (eviction, ``remove``,
``BlockRemoved``) turns its usable descendants in that slot loose; a slot
gaining a block under a usable parent makes its loose descendants usable again
(a re-stored middle block revives the tail, as in vLLM, whose hit is the
longest contiguous leading run of cached blocks). The walks are usually
empty: the shadow LRU and vLLM free tails first, and a slot with no loose
block takes a whole prompt in one pass. Hits therefore equal the old
block-by-block AND exactly; ``held_count`` still counts loose blocks.

Two forms
---------
While a slot only ever receives whole prompts (``insert`` without ``parent``: the
router's dispatch shadow), every touch of a block comes with a later touch of each of
its ancestors, so the LRU evicts descendants before ancestors and no slot ever holds a
loose block. The index then keeps the run-length form of
:mod:`~router_worker.routing.shadowtree` (a radix tree of block runs with per-slot
LRU entries), where an insert, an eviction and a lookup cost O(runs on the prompt's
path) instead of O(blocks): the replay simulator, which by default feeds no events,
and a router without a KV-event subscriber stay in it. The first time something can
break that order (an insert continuing from a ``parent``, a ``remove``, an engine
event) or asks a per-block question (``holds``, a lookup of a sequence that is not a
chain), the index converts to the per-block form described above, LRU order
included, and stays in it.

The chain answer relies on every insert being a chain continuing from its
``parent`` (true for ``on_dispatch`` and for translated events). A
non-chained insert cannot corrupt held sets or the plain scan, only
``chain=True`` answers for those blocks. Cost: the dispatch insert does one
more dict operation per block new to the index (the children link), and an
eviction one or two more.

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
that slot; its descendants stay held but loose (unusable) until it is stored
again. A stored event is applied as one insert whose touch order is that of
inserting engine block by engine block (each one's router blocks last to
first), evicting once at the end: the same LRU contents as evicting after
each.

:class:`GlobalTier` is the optional view of a shared (global) KV tier for
SMetric: a set of router block hashes with a longest-prefix query.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from enum import Enum
from itertools import accumulate, islice, repeat, takewhile
from operator import and_, neg, or_
from typing import Final

import numpy as np

from engine_interface.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
)
from router_worker.routing.features import extend_chain
from router_worker.routing.shadowtree import ShadowTree

GPU_MEDIA = (None, MEDIUM_GPU, MEDIUM_GPU.lower())

# Chain lookups bisect for this many distinct hit lengths, then scan the rest.
_BISECT_RUNS = 6


class _Absent(Enum):
    """A typed sentinel: ``is not _ABSENT`` narrows ``lru.pop(h, _ABSENT)`` for mypy."""

    TOKEN = 0


_ABSENT: Final = _Absent.TOKEN


class KVIndex:
    """Per-cluster index of block hashes held by each slot, each slot an LRU."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # block -> slots holding it and every ancestor (its prefix is usable there)
        self._closed: dict[int, int] = {}
        # block -> slots holding it but missing an ancestor (rare; disjoint from _closed)
        self._loose: dict[int, int] = {}
        # parent block -> child block, or a set of them (every block in the index)
        self._children: dict[int, int | set[int]] = {}
        # per slot: block -> its parent (None for a prompt's first block), in LRU order
        self._lru: list[OrderedDict[int, int | None] | None] = []
        self._loose_count: list[int] = []  # per slot: blocks in its LRU that are loose
        self._capacity: list[int] = []
        self._engine_map: list[dict[object, int]] = []
        # Run-length form while only whole prompts came in (see "Two forms" above);
        # None once the per-block form above is in use.
        self._tree: ShadowTree | None = ShadowTree()
        self.unresolved_events = 0
        self.unsupported_events = 0

    # ----- slots -----------------------------------------------------------
    def add_slot(self, capacity_blocks: int) -> int:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        self._lru.append(OrderedDict())
        self._loose_count.append(0)
        self._capacity.append(capacity_blocks)
        self._engine_map.append({})
        if self._tree is not None:
            self._tree.add_slot()
        return len(self._lru) - 1

    def remove_slot(self, slot: int) -> None:
        self.clear(slot)
        self._lru[slot] = None

    def set_capacity(self, slot: int, capacity_blocks: int) -> None:
        self._capacity[slot] = capacity_blocks
        self._evict_over_capacity(slot)

    def held_count(self, slot: int) -> int:
        lru = self._lru[slot]
        if lru is None:
            return 0
        return len(lru) if self._tree is None else self._tree.held_count(slot)

    def capacity(self, slot: int) -> int:
        """Blocks the slot's LRU may hold before it evicts."""
        return self._capacity[slot]

    def holds(self, slot: int, block_hash: int) -> bool:
        self._to_blocks()
        held = self._closed.get(block_hash, 0) | self._loose.get(block_hash, 0)
        return bool(held >> slot & 1)

    # ----- lookup -------------------------------------------------------------
    def longest_prefixes(self, block_hashes: Sequence[int], *, chain: bool = False) -> np.ndarray:
        """For every slot, the number of leading blocks of ``block_hashes`` it holds.

        ``chain=True`` promises that ``block_hashes`` is a prompt's chain as
        built by :func:`~router_worker.routing.features.hash_blocks` (each
        block's parent is the previous one, the first starts at the root); the
        answer is the same, found in O(log n) lookups per distinct hit length.
        Without it any sequence is accepted and scanned block by block.
        """
        result = np.zeros(len(self._lru), dtype=np.int64)
        if chain and self._tree is not None:
            self._tree.longest_prefixes(result, block_hashes, _assign_bits)
            return result
        self._to_blocks()
        if chain:
            self._chain_lookup(result, block_hashes)
            return result
        masks = map(self._closed.get, block_hashes, repeat(0))  # C-level loops
        if self._loose:
            masks = map(or_, masks, map(self._loose.get, block_hashes, repeat(0)))
        _assign_runs(result, list(takewhile(bool, accumulate(masks, and_))), 0)
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
        the root, i.e. a prompt's leading blocks). They are touched last to
        first, so the leading blocks end up most recent.
        """
        lru = self._lru[slot]
        if lru is None or not block_hashes:
            return
        if parent is None and self._tree is not None:
            self._tree.insert(slot, block_hashes)
            self._tree.evict_to(slot, self._capacity[slot])
            return
        self._to_blocks()
        parents = [parent, *block_hashes[:-1]]
        self._insert(
            slot,
            lru,
            block_hashes,
            parent,
            zip(reversed(block_hashes), reversed(parents), strict=True),
        )

    def _insert(
        self,
        slot: int,
        lru: OrderedDict[int, int | None],
        block_hashes: Sequence[int],
        parent: int | None,
        touch_order: Iterable[tuple[int, int | None]],
    ) -> None:
        """Touch ``(block, parent)`` pairs in order; ``block_hashes``: the chain from ``parent``."""
        if (parent is None or self._closed.get(parent, 0) >> slot & 1) and not self._loose_count[
            slot
        ]:
            # The usual case: the whole chain becomes usable for the slot and it
            # holds nothing loose that could become usable with it.
            self._touch_usable(slot, lru, touch_order)
        else:
            self._insert_general(slot, lru, block_hashes, parent, touch_order)
        self._evict_over_capacity(slot)

    def _touch_usable(
        self,
        slot: int,
        lru: OrderedDict[int, int | None],
        touch_order: Iterable[tuple[int, int | None]],
    ) -> None:
        """Touch blocks that become usable, linking those new to the index."""
        bit, closed, loose, children = 1 << slot, self._closed, self._loose, self._children
        for block_hash, block_parent in touch_order:
            if block_hash in lru:
                lru.move_to_end(block_hash)
                continue
            lru[block_hash] = block_parent
            mask = closed.get(block_hash)
            if mask is not None:
                closed[block_hash] = mask | bit
                continue
            closed[block_hash] = bit
            if block_parent is not None and block_hash not in loose:  # new to the index
                known = children.setdefault(block_parent, block_hash)
                if known is not block_hash:
                    self._add_child(block_parent, block_hash, known)

    def _insert_general(
        self,
        slot: int,
        lru: OrderedDict[int, int | None],
        block_hashes: Sequence[int],
        parent: int | None,
        touch_order: Iterable[tuple[int, int | None]],
    ) -> None:
        bit = 1 << slot
        closed, loose, children = self._closed, self._loose, self._children
        usable = parent is None or bool(closed.get(parent, 0) & bit)
        target = closed if usable else loose
        for block_hash, block_parent in touch_order:
            if block_hash in lru:
                lru.move_to_end(block_hash)
                continue
            lru[block_hash] = block_parent
            if block_parent is not None and block_hash not in closed and block_hash not in loose:
                known = children.setdefault(block_parent, block_hash)
                if known is not block_hash:
                    self._add_child(block_parent, block_hash, known)
            target[block_hash] = target.get(block_hash, 0) | bit
            if not usable:
                self._loose_count[slot] += 1
        if usable:
            # Loose blocks the slot holds below the chain are usable now (the
            # chain's own loose blocks are children of its previous ones; its
            # first block cannot be loose under a usable parent).
            for block_hash in block_hashes:
                below = children.get(block_hash)
                if below is not None:
                    self._close_below(slot, bit, below)

    def remove(self, slot: int, block_hashes: Iterable[int]) -> None:
        lru = self._lru[slot]
        if lru is None:
            return
        self._to_blocks()
        for block_hash in block_hashes:
            parent = lru.pop(block_hash, _ABSENT)
            if parent is not _ABSENT:
                self._drop(slot, block_hash, parent)

    def clear(self, slot: int) -> None:
        lru = self._lru[slot]
        if lru is None:
            return
        if self._tree is not None:
            self._tree.clear(slot)
            self._engine_map[slot].clear()
            return
        keep = ~(1 << slot)
        closed, loose = self._closed, self._loose
        for block_hash, parent in lru.items():
            # every block of the slot goes, so no descendant walk is needed
            for masks in (closed, loose):
                mask = masks.get(block_hash, 0) & keep
                if mask:
                    masks[block_hash] = mask
                else:
                    masks.pop(block_hash, None)
            if block_hash not in closed and block_hash not in loose:
                self._forget(block_hash, parent)
        lru.clear()
        self._loose_count[slot] = 0
        self._engine_map[slot].clear()

    def _evict_over_capacity(self, slot: int) -> None:
        lru = self._lru[slot]
        assert lru is not None
        capacity = self._capacity[slot]
        if self._tree is not None:
            self._tree.evict_to(slot, capacity)
            return
        if len(lru) <= capacity:
            return
        bit = 1 << slot
        closed, loose, children = self._closed, self._loose, self._children
        while len(lru) > capacity:
            block_hash, parent = lru.popitem(last=False)
            mask = closed.get(block_hash, 0) ^ bit
            if mask & bit or block_hash in children:
                self._drop(slot, block_hash, parent)  # loose, or maybe held below: the full path
            elif mask:
                closed[block_hash] = mask
            else:  # an unshared leaf leaves the index (inlined _drop and _forget)
                del closed[block_hash]
                if block_hash not in loose and parent is not None:
                    siblings = children.get(parent)
                    if siblings == block_hash:
                        del children[parent]
                    else:
                        self._forget(block_hash, parent)

    def _drop(self, slot: int, block_hash: int, parent: int | None) -> None:
        """``slot`` no longer holds ``block_hash`` (already out of its LRU)."""
        bit = 1 << slot
        closed, loose = self._closed, self._loose
        mask = closed.get(block_hash, 0)
        if mask & bit:
            if mask ^ bit:
                closed[block_hash] = mask ^ bit
            else:
                del closed[block_hash]
            below = self._children.get(block_hash)
            if below is not None:  # usually none held here: vLLM and the LRU free tails first
                self._open_below(slot, bit, below)
        else:
            mask = loose.get(block_hash, 0) & ~bit
            if mask:
                loose[block_hash] = mask
            else:
                loose.pop(block_hash, None)
            self._loose_count[slot] -= 1
        if block_hash not in closed and block_hash not in loose:
            self._forget(block_hash, parent)

    # ----- chain structure ----------------------------------------------------
    def _to_blocks(self) -> None:
        """Leave the run-length form: build the per-block LRUs, usable masks and
        children links from the tree (once)."""
        tree, self._tree = self._tree, None
        if tree is None:
            return
        closed, children = self._closed, self._children
        for slot, lru in enumerate(self._lru):
            if lru is None:
                continue
            bit = 1 << slot
            for block_hash, parent in tree.lru_items(slot):
                lru[block_hash] = parent
                closed[block_hash] = closed.get(block_hash, 0) | bit
                if parent is not None:
                    known = children.setdefault(parent, block_hash)
                    if known != block_hash:
                        self._add_child(parent, block_hash, known)

    def _add_child(self, parent: int, child: int, known: int | set[int]) -> None:
        if isinstance(known, set):
            known.add(child)
        elif known != child:
            self._children[parent] = {known, child}

    def _forget(self, block_hash: int, parent: int | None) -> None:
        """``block_hash`` left the index (no holder): unlink it from its parent."""
        if parent is None:
            return
        children = self._children.get(parent)
        if children == block_hash:
            del self._children[parent]
        elif isinstance(children, set):
            children.discard(block_hash)
            if len(children) == 1:
                self._children[parent] = children.pop()

    def _move(self, slot: int, bit: int, block_hash: int, *, to_closed: bool) -> None:
        """Move the slot's bit for ``block_hash`` between loose and closed."""
        source, target = (self._loose, self._closed) if to_closed else (self._closed, self._loose)
        mask = source[block_hash] ^ bit
        if mask:
            source[block_hash] = mask
        else:
            del source[block_hash]
        target[block_hash] = target.get(block_hash, 0) | bit
        self._loose_count[slot] += -1 if to_closed else 1

    def _close_below(self, slot: int, bit: int, children: int | set[int]) -> None:
        """Children of a block usable for the slot: its loose ones, and theirs, become usable."""
        self._move_below(slot, bit, children, to_closed=True)

    def _open_below(self, slot: int, bit: int, children: int | set[int]) -> None:
        """Children of a block the slot lost: its usable ones, and theirs, become loose."""
        self._move_below(slot, bit, children, to_closed=False)

    def _move_below(
        self, slot: int, bit: int, children: int | set[int], *, to_closed: bool
    ) -> None:
        source, all_children = (self._loose if to_closed else self._closed), self._children
        stack = list(children) if isinstance(children, set) else [children]
        while stack:
            current = stack.pop()
            if source.get(current, 0) & bit:
                self._move(slot, bit, current, to_closed=to_closed)
                below = all_children.get(current)
                if below is not None:
                    stack.extend(below if isinstance(below, set) else (below,))

    # ----- engine events ----------------------------------------------------
    def apply_event(self, slot: int, event: KVEvent) -> None:
        """Apply one decoded vLLM KV event reported by the instance in ``slot``."""
        if self._lru[slot] is None:
            return
        self._to_blocks()
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
        engine_blocks = min(len(event.block_hashes), len(router_hashes) // per_engine_block)
        if not engine_blocks:
            return
        blocks = router_hashes[: engine_blocks * per_engine_block]
        # each engine block maps to its last router block; earlier ones share its fate
        engine_map.update(
            zip(
                event.block_hashes[:engine_blocks],
                blocks[per_engine_block - 1 :: per_engine_block],
                strict=True,
            )
        )
        # The LRU order of inserting engine block by engine block (each one's
        # router blocks last to first); evicting once at the end leaves the
        # same LRU contents as evicting after each.
        pairs = list(zip(blocks, [parent, *blocks[:-1]], strict=True))
        if per_engine_block > 1:
            pairs = [
                pair
                for start in range(0, len(pairs), per_engine_block)
                for pair in reversed(pairs[start : start + per_engine_block])
            ]
        lru = self._lru[slot]
        assert lru is not None
        self._insert(slot, lru, blocks, parent, pairs)

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
