"""The run-length BlockPool against a block-by-block reference of the same semantics."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from engine_interface.kv_events import BlockRemoved
from enginesim.engine.kvpool import BlockPool, GlobalKVTier


class ReferencePool:
    """One dict entry per cached block, one LRU entry per free cached block."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_uncached = num_blocks
        self.refcount: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.evicted: list[int] = []

    @property
    def num_free(self) -> int:
        return self.free_uncached + len(self.evictable)

    def match(self, hashes: list[int], max_blocks: int) -> tuple[int, int]:
        n = unreferenced = 0
        for h in hashes[:max_blocks]:
            if h not in self.refcount:
                break
            n += 1
            unreferenced += self.refcount[h] == 0
        return n, unreferenced

    def _reference(self, h: int) -> None:
        if self.refcount[h] == 0:
            del self.evictable[h]
        self.refcount[h] += 1

    def acquire(self, hashes: list[int], n: int) -> None:
        for h in hashes[:n]:
            self._reference(h)

    def extend(self, hashes: list[int], start: int, stop: int) -> tuple[int, list[int]]:
        duplicates, stored = 0, list[int]()
        for h in hashes[start:stop]:
            if h in self.refcount and not stored:
                self._reference(h)
                duplicates += 1
            else:
                self.refcount[h] = 1
                stored.append(h)
        self.free_uncached += duplicates
        return duplicates, stored

    def allocate(self, n: int) -> bool:
        if n > self.num_free:
            return False
        take = min(n, self.free_uncached)
        self.free_uncached -= take
        for _ in range(n - take):
            h = self.evictable.popitem(last=False)[0]
            del self.refcount[h]
            self.evicted.append(h)
        return True

    def release(self, held: list[int], num_private: int) -> None:
        self.free_uncached += num_private
        for h in reversed(held):
            self.refcount[h] -= 1
            if self.refcount[h] == 0:
                self.evictable[h] = None


def chain(contents: list[int]) -> list[int]:
    hashes, parent = [], 0
    for content in contents:
        parent = hash((parent, content))
        hashes.append(parent)
    return hashes


def random_prompts(rng: random.Random, count: int) -> list[list[int]]:
    """Prompts over a few shared prefixes, so that runs split and share often."""
    stems = [[rng.randrange(4) for _ in range(rng.randrange(1, 12))] for _ in range(5)]
    prompts = []
    for _ in range(count):
        stem = rng.choice(stems)
        cut = rng.randrange(len(stem) + 1)
        prompts.append(chain(stem[:cut] + [rng.randrange(3) for _ in range(rng.randrange(12))]))
    return [p for p in prompts if p]


@pytest.mark.parametrize("seed", range(30))
def test_pool_matches_the_block_by_block_reference(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.randrange(8, 40)
    pool, ref = BlockPool(capacity), ReferencePool(capacity)
    prompts = random_prompts(rng, 40)
    # per request: [hashes, tip, held blocks, private blocks]
    active: list[list] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.35:
            hashes = rng.choice(prompts)
            max_blocks = rng.randrange(len(hashes) + 1)
            assert pool.match(hashes, max_blocks) == ref.match(hashes, max_blocks)
            local, unreferenced = ref.match(hashes, max_blocks)
            private = rng.randrange(len(hashes) - local + 1)
            if private + unreferenced > ref.num_free:
                continue
            tip = pool.acquire(hashes, local)
            ref.acquire(hashes, local)
            assert pool.allocate(private) and ref.allocate(private)
            active.append([hashes, tip, local, private])
        elif op < 0.65 and active:
            request = rng.choice(active)
            hashes, tip, held, private = request
            stop = held + rng.randrange(min(private, len(hashes) - held) + 1)
            new_tip, duplicates, stored = pool.extend(tip, hashes, stop)
            assert (duplicates, stored) == ref.extend(hashes, held, stop)
            request[1:] = [new_tip, stop, private - (stop - held)]
            assert new_tip.end == stop
        elif op < 0.8 and active:
            request = rng.choice(active)
            extra = rng.randrange(4)
            granted = pool.allocate(extra)
            assert granted == ref.allocate(extra)
            if granted:
                request[3] += extra
        elif active:
            hashes, tip, held, private = active.pop(rng.randrange(len(active)))
            pool.release(tip, private)
            ref.release(hashes[:held], private)
        assert pool.num_free == ref.num_free
        assert pool.num_evictable == len(ref.evictable)
        assert pool.cached_hashes() == set(ref.refcount)
    removed = [h for e in pool.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed == ref.evicted


def test_a_second_copy_of_a_computed_block_returns_to_the_free_pool() -> None:
    pool = BlockPool(10)
    hashes = chain([1, 2, 3])
    first, second = pool.acquire(hashes, 0), pool.acquire(hashes, 0)
    assert pool.allocate(3) and pool.allocate(3)  # both prefill the same prompt at once
    first, duplicates, stored = pool.extend(first, hashes, 3)
    assert (duplicates, stored) == (0, hashes)
    second, duplicates, stored = pool.extend(second, hashes, 3)
    assert (duplicates, stored) == (3, [])
    assert second is first and pool.num_free == 7
    pool.release(first, 0)
    pool.release(second, 0)
    assert pool.num_free == 10 and pool.num_evictable == 3


def test_eviction_takes_the_oldest_free_tail_first() -> None:
    pool = BlockPool(6, record_events=True)
    a, b = chain([1, 2, 3]), chain([1, 2, 9])
    for hashes in (a, b):
        tip = pool.acquire(hashes, pool.match(hashes, 3)[0])
        pool.allocate(3 - tip.end)
        tip, _, _ = pool.extend(tip, hashes, 3)
        pool.release(tip, 0)
    # free order: a's tail, then b's tail, then the shared two blocks
    assert pool.num_evictable == 4 and pool.allocate(6)
    removed = [h for e in pool.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed == [a[2], b[2], a[1], a[0]]


def test_tier_reads_on_one_link_queue_and_a_lone_read_does_not_wait():
    tier = GlobalKVTier(capacity_blocks=10, bandwidth=1e9)
    assert tier.read(5.0, 2_000_000) == (0.0, 0.002)  # alone: bytes / bandwidth
    wait, transfer = tier.read(5.0, 1_000_000)  # asked while the first holds the link
    assert (wait, transfer) == (pytest.approx(0.002), 0.001)
    assert tier.read(5.0, 1_000_000, link=1) == (0.0, 0.001)  # another host's link is free
    assert tier.read(5.003, 1_000_000) == (0.0, 0.001)  # the link is free again
    assert tier.bytes_read == 5_000_000 and tier.reads == 4
    assert tier.read_wait == pytest.approx(0.002)
