"""GPU KV block pool with a prefix cache, and the optional shared global KV tier.

The pool tracks counts and hashes, not block ids. A block is either free and uncached,
cached (in the prefix tree; while no request references it, it sits in the LRU free
list and can be evicted), or private to one request (allocated, not, or not yet,
holding a full prompt block). Allocation takes never-used / uncached free blocks first
and then evicts the least recently freed cached block. vLLM keeps both kinds in one LRU
queue; uncached freed blocks are few (partial and decode blocks), so the difference is
small.

Run-length prefix tree
----------------------
Block hashes are chained (block k's hash names the whole prefix 0..k), so the cached
blocks form a tree, and a request references a path from the root: the blocks it hit at
admission followed by the ones it computed. The tree is stored with runs of blocks per
node (a radix tree), split wherever a request's path ends inside a node, so that every
request references whole nodes and each node has one reference count. Everything the
pool does per request then costs O(nodes on its path) instead of O(blocks):

* freeing a path appends its nodes that drop to zero references to the free list,
  deepest first, under one release stamp: the order vLLM's ``free`` gives the blocks
  (a request's tail first), run by run;
* eviction takes blocks from the tail of the oldest free node, so a node always holds a
  whole run from its first block: a child is freed no later than its parent and, at the
  same stamp, is deeper, hence evicted first, and the cached set stays prefix-closed;
* matching a prompt compares one hash per node (equal last blocks mean equal runs), or
  bisects where it diverges inside a node.

The free list is a heap keyed by (release stamp, -depth) with lazy deletion; a split
node's two halves keep the stamp, so they stay in the order their blocks had.

A block that a request computes while an equal one is already cached (two requests
prefilling the same prompt at once) is deduplicated: the request references the cached
block and its own copy returns to the free pool, as vLLM v0's block manager and SGLang's
radix cache do. (vLLM v1 keeps both copies cached until one is evicted; with the whole
prompt computed twice either way, only the free-block count differs, briefly.)
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from engine_interface.chains import common_run
from engine_interface.kv_events import AllBlocksCleared, BlockRemoved, KVEvent


class PrefixNode:
    """A run of consecutive cached blocks of one chain (see the module docstring)."""

    __slots__ = ("children", "depth", "entry", "hashes", "parent", "refs")

    def __init__(
        self, hashes: list[int], parent: PrefixNode | None, depth: int, refs: int = 0
    ) -> None:
        self.hashes = hashes
        self.parent = parent
        self.children: dict[int, PrefixNode] = {}
        self.depth = depth  # chain index of hashes[0]
        self.refs = refs  # requests referencing every block of the run
        self.entry: list | None = None  # its live free-list entry while refs == 0

    @property
    def end(self) -> int:
        """Chain index one past the run's last block."""
        return self.depth + len(self.hashes)


class BlockPool:
    def __init__(
        self, num_blocks: int, enable_caching: bool = True, record_events: bool = True
    ) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.record_events = record_events  # False: nobody reads KV events (no publisher)
        self.free_uncached = num_blocks
        self.num_evictable = 0  # cached blocks no request references
        self.root = PrefixNode([], None, 0, refs=1)
        self._free_list: list[list] = []  # heap of [stamp, -depth, tiebreak, node]
        self._live_entries = 0  # nodes in the free list (the heap also has stale entries)
        self._stamp = 0
        self._tiebreak = 0
        self.events: list[KVEvent] = []
        self._evicted: list[int] = []

    @property
    def num_free(self) -> int:
        return self.free_uncached + self.num_evictable

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    # ----------------------------------------------------------------- lookup

    def match(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """(leading ``hashes`` cached, up to ``max_blocks``; how many of those no request
        references, i.e. would leave the free list if referenced). Read-only."""
        if not self.enable_caching:
            return 0, 0
        node, i, unreferenced = self.root, 0, 0
        while i < max_blocks:
            child = node.children.get(hashes[i])
            if child is None:
                break
            k = common_run(hashes, i, child.hashes, max_blocks - i)
            if child.refs == 0:
                unreferenced += k
            i += k
            if k < len(child.hashes):
                break
            node = child
        return i, unreferenced

    def acquire(self, hashes: Sequence[int], n: int) -> PrefixNode:
        """Reference the first ``n`` blocks of ``hashes`` (all cached: see ``match``);
        returns the node ending at block ``n`` (the root for 0)."""
        node, reached = self._reference_path(self.root, hashes, 0, n)
        assert reached == n, "acquire only what match found cached"
        return node

    # ----------------------------------------------------------------- caching

    def extend(
        self, tip: PrefixNode, hashes: Sequence[int], stop: int
    ) -> tuple[PrefixNode, int, list[int]]:
        """A request referencing the path to ``tip`` computed blocks
        ``hashes[tip.end:stop]``: enter them into the cache under its reference.

        Returns (new tip, blocks that were already cached: the request's copies of those
        went back to the free pool, the hashes newly cached). Without caching, nothing.
        """
        if not self.enable_caching:
            return tip, 0, []
        node, i = self._reference_path(tip, hashes, tip.end, stop)
        duplicates = i - tip.end
        self.free_uncached += duplicates
        stored = list(hashes[i:stop])
        if stored:
            if node.refs == 1 and not node.children and node is not self.root:
                node.hashes.extend(stored)  # only this request references it: grow the run
            else:
                child = PrefixNode(stored.copy(), node, i, refs=1)  # runs get cut later
                node.children[stored[0]] = child
                node = child
        return node, duplicates, stored

    # ----------------------------------------------------------------- allocation

    def allocate(self, n: int) -> bool:
        """Take ``n`` free blocks, evicting LRU cached blocks if needed; False if too few."""
        if n <= 0:
            return n == 0
        if n > self.num_free:
            return False
        from_uncached = min(n, self.free_uncached)
        self.free_uncached -= from_uncached
        self._evict(n - from_uncached)
        return True

    def _evict(self, n: int) -> None:
        heap = self._free_list
        while n > 0:
            entry = heap[0]
            node = entry[3]
            if node.entry is not entry:  # referenced again, or split, since it was freed
                heapq.heappop(heap)
                continue
            run = node.hashes
            k = min(n, len(run))
            if self.record_events:
                self._evicted.extend(reversed(run[-k:]))
            n -= k
            self.num_evictable -= k
            if k < len(run):
                del run[-k:]
                continue
            assert not node.children, "a cached block's descendants are evicted first"
            heapq.heappop(heap)
            node.entry = None
            self._live_entries -= 1
            del node.parent.children[run[0]]

    def release(self, tip: PrefixNode, num_private: int) -> None:
        """Free a request's blocks: its private ones, and its reference on the path to
        ``tip``; the nodes no one references join the free list, deepest first."""
        self.free_uncached += num_private
        self._stamp += 1
        node, root = tip, self.root
        while node is not root:
            node.refs -= 1
            if node.refs == 0:
                self._push_free(node, self._stamp)
                self.num_evictable += len(node.hashes)
            parent = node.parent
            assert parent is not None, "a tip's path ends at the root"
            node = parent

    def reset(self) -> bool:
        """Drop every cached block; refused (False) while any block is in use, like vLLM."""
        if self.num_free != self.num_blocks:
            return False
        self.free_uncached = self.num_blocks
        self.num_evictable = 0
        self.root.children.clear()
        self._free_list.clear()
        self._live_entries = 0
        self._evicted.clear()
        if self.record_events:
            self.events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        if self._evicted:
            self.events.append(BlockRemoved(tuple(self._evicted)))
            self._evicted = []
        events, self.events = self.events, []
        return events

    def cached_hashes(self) -> set[int]:
        """Every cached block hash (for tests and debugging: O(cached blocks))."""
        found: set[int] = set()
        stack = [self.root]
        while stack:
            node = stack.pop()
            found.update(node.hashes)
            stack.extend(node.children.values())
        return found

    # ----------------------------------------------------------------- tree upkeep

    def _reference_path(
        self, node: PrefixNode, hashes: Sequence[int], i: int, stop: int
    ) -> tuple[PrefixNode, int]:
        """Reference the cached runs below ``node`` that continue with ``hashes[i:stop]``,
        as far as they go (splitting the last one where the match ends); returns the
        deepest node referenced (``node`` if none) and the block index reached."""
        while i < stop:
            child = node.children.get(hashes[i])
            if child is None:
                break
            k = common_run(hashes, i, child.hashes, stop - i)
            if k < len(child.hashes):
                child = self._split(child, k)
            self._reference(child)
            i += k
            node = child
        return node, i

    def _reference(self, node: PrefixNode) -> None:
        if node.refs == 0:
            node.entry = None  # leaves the free list (its heap entry goes stale)
            self._live_entries -= 1
            self.num_evictable -= len(node.hashes)
        node.refs += 1

    def _push_free(self, node: PrefixNode, stamp: int) -> None:
        if node.entry is None:
            self._live_entries += 1
        self._tiebreak += 1
        node.entry = [stamp, -node.depth, self._tiebreak, node]
        heap = self._free_list
        heapq.heappush(heap, node.entry)
        if len(heap) > 2 * self._live_entries + 1024:  # mostly stale: a server runs for days
            heap[:] = [entry for entry in heap if entry[3].entry is entry]
            heapq.heapify(heap)

    def _split(self, node: PrefixNode, k: int) -> PrefixNode:
        """Cut ``node`` after its first ``k`` blocks; returns the new head node.

        ``node`` keeps the tail, so references to it as a request's tip stay valid."""
        parent = node.parent
        assert parent is not None, "the root is never split"
        head = PrefixNode(node.hashes[:k], parent, node.depth, node.refs)
        parent.children[head.hashes[0]] = head
        del node.hashes[:k]
        node.depth += k
        node.parent = head
        head.children[node.hashes[0]] = node
        if node.entry is not None:  # free: both halves keep the stamp, the tail goes first
            stamp = node.entry[0]
            self._push_free(head, stamp)
            self._push_free(node, stamp)
        return head


class GlobalKVTier:
    """A KV store shared by several engines (e.g. a CPU/remote pool, SMetric's setting).

    Holds up to ``capacity_blocks`` block hashes in LRU order. Engines write every block
    they compute through to it and, on a local miss, load the consecutive blocks it holds
    at ``bandwidth`` bytes/s instead of recomputing them.

    Shared bandwidth
    ----------------
    Reads go over links of ``bandwidth`` bytes/s each; engines name theirs (``link``, 0
    by default: one link for the whole cluster, the fabric to a remote pool such as a
    Mooncake/LMCache store, whose NICs bound what all instances together can pull; a
    caller that models one PCIe/NIC per host of K GPUs gives host-mates the same link).
    A link serves reads one at a time, first come first served: a read of B bytes asked
    at ``now`` starts at ``max(now, link free)`` and holds the link for B / bandwidth, so
    what the reading engine waits is the queueing behind other engines' reads plus its
    own transfer. Serving whole reads in turn rather than interleaving them finishes the
    last of a burst at the same time as fair sharing would, and the first ones earlier:
    the sum of the waits is what contention costs, and no read is ever faster than alone.
    Time is the engines' virtual clock, passed in, so a replay stays deterministic; the
    engines of a replay ask in (nearly) time order, and a read asked "late" (its engine
    was advanced after a peer's later read) queues behind it, as if it had arrived then.
    Writes (write-through of computed blocks) are asynchronous in LMCache/Mooncake and
    do not take the link here.
    """

    def __init__(self, capacity_blocks: int, bandwidth: float) -> None:
        if capacity_blocks <= 0 or bandwidth <= 0:
            raise ValueError("GlobalKVTier needs a positive capacity and bandwidth")
        self.capacity_blocks = capacity_blocks
        self.bandwidth = bandwidth
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._link_free_at: dict[int, float] = {}
        self.hits = 0
        self.stores = 0
        self.reads = 0
        self.bytes_read = 0
        self.read_wait = 0.0  # summed over reads: seconds queued behind other reads

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
        """Time to read ``num_blocks`` on an idle link."""
        return num_blocks * block_bytes / self.bandwidth

    def read(self, now: float, num_bytes: int, link: int = 0) -> tuple[float, float]:
        """Reserve ``link`` for a read of ``num_bytes`` asked at ``now``; returns (wait
        behind earlier reads, transfer time). The reader is done at now + wait + transfer."""
        if num_bytes <= 0:
            return 0.0, 0.0
        transfer = num_bytes / self.bandwidth
        start = max(now, self._link_free_at.get(link, now))
        self._link_free_at[link] = start + transfer
        wait = start - now
        self.reads += 1
        self.bytes_read += num_bytes
        self.read_wait += wait
        return wait, transfer
