"""Run-length form of the KV index while the router only records its own dispatches.

While every insert is a whole prompt's chain from the root (``KVIndex.insert`` without a
parent: the router's dispatch shadow), each slot's LRU holds a prefix-closed set of
blocks and evicts a prompt's tail before its head. That admits a radix tree of block
runs: a node is a run of consecutive chain blocks, split wherever an inserted prompt
ends or diverges inside it, and each slot holds a *prefix* of each node's run (its
tail may have been evicted), all of it touched by the same insert. So per slot and node
one count and one LRU entry stand for the blocks, and an insert, an eviction or a
lookup costs O(nodes on the prompt's path) instead of O(blocks):

* a slot's LRU is a heap of (insert stamp, -depth) entries, lazily deleted: within one
  insert the deeper runs are older (blocks are touched last to first), and eviction
  takes blocks from the tail of the oldest entry; a node split keeps the stamp on both
  halves, so blocks keep their order;
* a lookup walks the tree along the prompt, comparing one hash per node (chained hashes
  are equal at block k only if the prefixes up to k are), and bisecting only where the
  prompt leaves a run.

:class:`~router_worker.routing.kvindex.KVIndex` starts in this form and converts to its
per-block form (which also handles engine events, removals and partial chains) the first
time something needs it; :meth:`ShadowTree.lru_items` gives each slot's blocks in LRU
order for that.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from engine_interface.chains import common_run


class RunNode:
    """A run of consecutive chain blocks and the slots holding a prefix of it."""

    __slots__ = ("children", "depth", "entries", "full", "hashes", "held", "parent")

    def __init__(self, hashes: list[int], parent: RunNode | None, depth: int) -> None:
        self.hashes = hashes
        self.parent = parent
        self.depth = depth  # chain index of hashes[0]
        self.children: dict[int, RunNode] = {}  # by the child's first hash
        self.held: dict[int, int] = {}  # slot -> leading blocks of the run it holds (> 0)
        self.full = 0  # bitmask of the slots holding the whole run
        self.entries: dict[int, list] = {}  # slot -> its live LRU heap entry


class ShadowTree:
    """Per-slot LRUs of whole-prompt chains, as one radix tree of block runs."""

    def __init__(self) -> None:
        self.root = RunNode([], None, 0)
        self._heaps: list[list[list]] = []  # per slot: [stamp, -depth, tiebreak, node]
        self._live: list[int] = []  # per slot: live entries (the heap has stale ones too)
        self._held: list[int] = []  # per slot: blocks held
        self._stamp = 0
        self._tiebreak = 0

    def add_slot(self) -> None:
        self._heaps.append([])
        self._live.append(0)
        self._held.append(0)

    def held_count(self, slot: int) -> int:
        return self._held[slot]

    # ----- lookup -------------------------------------------------------------
    def longest_prefixes(
        self,
        result: np.ndarray,
        hashes: Sequence[int],
        assign_bits: Callable[[np.ndarray, int, int], None],
    ) -> None:
        """``result[slot]`` = leading blocks of the chain ``hashes`` the slot holds."""
        alive = (1 << len(self._heaps)) - 1
        node, i, end = self.root, 0, len(hashes)
        while i < end and alive:
            child = node.children.get(hashes[i])
            if child is None:
                break
            k = common_run(hashes, i, child.hashes, end - i)
            if k == len(child.hashes):
                keep = alive & child.full
            else:
                keep = 0
                for slot, held in child.held.items():
                    if held >= k:
                        keep |= 1 << slot
                keep &= alive
            stopping = alive & ~keep
            if stopping:
                assign_bits(result, stopping, i)  # holding none of the run...
                for slot, held in child.held.items():  # ...or part of it
                    if stopping >> slot & 1 and held:
                        result[slot] = i + min(held, k)
            alive, i, node = keep, i + k, child
            if k < len(child.hashes):
                break
        if alive:
            assign_bits(result, alive, i)

    # ----- updates ------------------------------------------------------------
    def insert(self, slot: int, hashes: Sequence[int]) -> None:
        """``slot`` holds the chain ``hashes`` (from the root), touched as most recent."""
        self._stamp += 1
        node, i, end = self.root, 0, len(hashes)
        path = []
        while i < end:
            child = node.children.get(hashes[i])
            if child is None:
                break
            k = common_run(hashes, i, child.hashes, end - i)
            if k < len(child.hashes):
                child = self._split(child, k)
            path.append(child)
            i, node = i + k, child
        if i < end:
            leaf = RunNode(list(hashes[i:]), node, i)
            node.children[leaf.hashes[0]] = leaf
            path.append(leaf)
        bit = 1 << slot
        for node in path:
            size = len(node.hashes)
            self._held[slot] += size - node.held.get(slot, 0)
            node.held[slot] = size
            node.full |= bit
            self._push(slot, node, self._stamp)

    def evict_to(self, slot: int, capacity: int) -> None:
        """Evict the slot's least recently used blocks until it holds ``capacity``."""
        heap = self._heaps[slot]
        while self._held[slot] > capacity:
            entry = heap[0]
            node = entry[3]
            if node.entries.get(slot) is not entry:
                heapq.heappop(heap)
                continue
            held = node.held[slot]
            excess = self._held[slot] - capacity
            if excess < held:  # the run's tail goes
                self._held[slot] -= excess
                node.held[slot] = held - excess
                node.full &= ~(1 << slot)
                continue
            heapq.heappop(heap)
            self._unhold(slot, node)

    def clear(self, slot: int) -> None:
        nodes = [entry[3] for entry in self._heaps[slot] if entry[3].entries.get(slot) is entry]
        for node in sorted(nodes, key=lambda n: -n.depth):  # children before parents
            self._unhold(slot, node)
        self._heaps[slot] = []
        self._held[slot] = 0

    def lru_items(self, slot: int) -> Iterator[tuple[int, int | None]]:
        """The slot's (block, parent block) pairs, least recently used first."""
        live = sorted(entry for entry in self._heaps[slot] if entry[3].entries.get(slot) is entry)
        for entry in live:
            node = entry[3]
            before = node.parent.hashes[-1] if node.parent.hashes else None
            run = node.hashes[: node.held[slot]]
            for j in range(len(run) - 1, -1, -1):
                yield run[j], run[j - 1] if j else before

    # ----- tree upkeep --------------------------------------------------------
    def _push(self, slot: int, node: RunNode, stamp: int) -> None:
        if slot not in node.entries:
            self._live[slot] += 1
        self._tiebreak += 1
        entry = [stamp, -node.depth, self._tiebreak, node]
        node.entries[slot] = entry
        heap = self._heaps[slot]
        heapq.heappush(heap, entry)
        if len(heap) > 2 * self._live[slot] + 1024:  # mostly stale entries
            heap[:] = [e for e in heap if e[3].entries.get(slot) is e]
            heapq.heapify(heap)

    def _unhold(self, slot: int, node: RunNode) -> None:
        """``slot`` no longer holds any of ``node``; a node no slot holds leaves the tree."""
        self._held[slot] -= node.held.pop(slot, 0)
        node.full &= ~(1 << slot)
        if node.entries.pop(slot, None) is not None:
            self._live[slot] -= 1
        if not node.held:
            assert not node.children, "a slot holds a run's prefix before its children"
            parent = node.parent
            assert parent is not None, "the root is never unheld"
            del parent.children[node.hashes[0]]

    def _split(self, node: RunNode, k: int) -> RunNode:
        """Cut ``node`` after its first ``k`` blocks; returns the new head node."""
        parent = node.parent
        assert parent is not None, "the root is never split"
        head = RunNode(node.hashes[:k], parent, node.depth)
        parent.children[head.hashes[0]] = head
        del node.hashes[:k]
        node.depth += k
        node.parent = head
        head.children[node.hashes[0]] = node
        for slot, held in list(node.held.items()):
            head.held[slot] = min(held, k)
            if held >= k:
                head.full |= 1 << slot
            stamp = node.entries[slot][0]
            self._push(slot, head, stamp)
            if held > k:
                node.held[slot] = held - k
                self._push(slot, node, stamp)  # same stamp, deeper: still older
            else:
                del node.held[slot], node.entries[slot]
                self._live[slot] -= 1
        if not node.held:  # no slot holds the tail (evicted): it leaves the tree
            assert not node.children, "a slot holds a run's prefix before its children"
            del head.children[node.hashes[0]]
        return head
