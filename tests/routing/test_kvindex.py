import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_worker.routing import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    GlobalTier,
    KVIndex,
    hash_blocks,
)


class NaiveIndex:
    """Reference: per-slot LRU list, lookup by scanning every slot."""

    def __init__(self, capacities):
        self.capacities = capacities
        self.lru = [[] for _ in capacities]

    def insert(self, slot, blocks):
        for block in reversed(blocks):
            if block in self.lru[slot]:
                self.lru[slot].remove(block)
            self.lru[slot].append(block)
        while len(self.lru[slot]) > self.capacities[slot]:
            self.lru[slot].pop(0)

    def remove(self, slot, blocks):
        for block in blocks:
            if block in self.lru[slot]:
                self.lru[slot].remove(block)

    def longest_prefixes(self, blocks):
        out = []
        for held in map(set, self.lru):
            run = 0
            while run < len(blocks) and blocks[run] in held:
                run += 1
            out.append(run)
        return out


block_seqs = st.lists(st.integers(0, 12), min_size=0, max_size=10)
operations = st.lists(
    st.tuples(st.sampled_from(["insert", "remove", "clear"]), st.integers(0, 4), block_seqs),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 8), min_size=1, max_size=5),
    operations,
    st.lists(block_seqs, max_size=8),
)
def test_index_agrees_with_naive_reference(capacities, ops, queries):
    index, naive = KVIndex(16), NaiveIndex(capacities)
    for capacity in capacities:
        index.add_slot(capacity)
    for kind, slot, blocks in ops:
        slot %= len(capacities)
        if kind == "insert":
            index.insert(slot, blocks)
            naive.insert(slot, blocks)
        elif kind == "remove":
            index.remove(slot, blocks)
            naive.remove(slot, blocks)
        else:
            index.clear(slot)
            naive.lru[slot].clear()
        for query in queries:
            assert index.longest_prefixes(query).tolist() == naive.longest_prefixes(query)
    for slot in range(len(capacities)):
        assert index.held_count(slot) == len(naive.lru[slot])


def test_lru_evicts_tails_before_shared_prefix():
    index = KVIndex(16)
    slot = index.add_slot(3)
    index.insert(slot, [1, 2, 3])
    index.insert(slot, [1, 9])  # touches 1 again; capacity 3 forces one eviction
    assert index.longest_prefixes([1, 2, 3]).tolist() == [2]  # the tail block 3 went
    assert index.holds(slot, 2) and not index.holds(slot, 3)


def test_lookup_over_many_slots_reports_each_run():
    index = KVIndex(16)
    for _ in range(70):  # more than 64 slots: masks span several machine words
        index.add_slot(100)
    index.insert(3, [10, 11, 12])
    index.insert(66, [10, 11])
    index.insert(69, [10])
    result = index.longest_prefixes([10, 11, 12, 13])
    expected = np.zeros(70, dtype=int)
    expected[[3, 66, 69]] = [3, 2, 1]
    assert result.tolist() == expected.tolist()


def stored(engine_hashes, parent, token_ids, block_size=16, medium=None):
    return BlockStored(tuple(engine_hashes), parent, tuple(token_ids), block_size, None, medium)


def test_events_map_engine_hashes_to_router_hashes():
    index = KVIndex(16)
    slot = index.add_slot(100)
    prompt = list(range(100, 164))  # 4 blocks
    ours = hash_blocks(prompt)
    index.apply_event(slot, stored([b"e0", b"e1"], None, prompt[:32]))
    index.apply_event(slot, stored([b"e2", b"e3"], b"e1", prompt[32:]))
    assert index.longest_prefixes(ours).tolist() == [4]
    index.apply_event(slot, BlockRemoved((b"e2",), None))
    assert index.longest_prefixes(ours).tolist() == [2]
    index.apply_event(slot, AllBlocksCleared())
    assert index.longest_prefixes(ours).tolist() == [0]


def test_event_with_unknown_parent_is_counted_not_applied():
    index = KVIndex(16)
    slot = index.add_slot(100)
    index.apply_event(slot, stored([b"x"], b"never-seen", range(16)))
    assert index.unresolved_events == 1 and index.held_count(slot) == 0


def test_engine_blocks_larger_than_ours_are_split():
    index = KVIndex(16)
    slot = index.add_slot(100)
    prompt = list(range(64))
    index.apply_event(slot, stored([7, 8], None, prompt, block_size=32))
    assert index.longest_prefixes(hash_blocks(prompt)).tolist() == [4]
    index.apply_event(slot, stored([9], None, range(10), block_size=10))
    assert index.unsupported_events == 1


def test_non_gpu_medium_is_ignored():
    index = KVIndex(16)
    slot = index.add_slot(100)
    index.apply_event(slot, stored([1], None, range(16), medium="CPU"))
    assert index.held_count(slot) == 0


def test_slot_capacity_must_be_positive():
    with pytest.raises(ValueError):
        KVIndex(16).add_slot(0)


def test_global_tier_longest_prefix_and_capacity():
    tier = GlobalTier(capacity_blocks=3)
    tier.insert([1, 2, 3])
    assert tier.longest_prefix([1, 2, 3, 4]) == 3
    tier.insert([5])  # evicts the least recent: block 3 (tail of the first insert)
    assert tier.longest_prefix([1, 2, 3]) == 2 and len(tier) == 3


# ----- chain lookups (prefix-closed masks) ------------------------------------
# A small trie of real chained hashes: a prompt is up to 6 blocks, each one of
# three 16-token variants, so prompts share prefixes and branch.
_VARIANTS = 3


def _chain(path):
    token_ids = [v * 1000 + t for v in path for t in range(16)]
    return hash_blocks(token_ids)


paths = st.lists(st.integers(0, _VARIANTS - 1), min_size=0, max_size=6)
chain_ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert", "insert_tail", "remove", "clear", "capacity"]),
        st.integers(0, 3),
        paths,
        st.integers(0, 6),
        st.integers(1, 12),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(2, 12), min_size=1, max_size=4), chain_ops,
       st.lists(paths, min_size=1, max_size=6))
def test_chain_lookup_agrees_with_naive_reference(capacities, ops, query_paths):
    index, naive = KVIndex(16), NaiveIndex(list(capacities))
    for capacity in capacities:
        index.add_slot(capacity)
    queries = [_chain(path) for path in query_paths]
    for kind, slot, path, cut, number in ops:
        slot %= len(capacities)
        blocks = _chain(path)
        if kind == "insert":
            index.insert(slot, blocks)
            naive.insert(slot, blocks)
        elif kind == "insert_tail":  # an engine event continuing from a parent block
            cut = min(cut, len(blocks))
            parent = blocks[cut - 1] if cut else None
            index.insert(slot, blocks[cut:], parent)
            naive.insert(slot, blocks[cut:])
        elif kind == "remove":  # any block, middle ones included
            index.remove(slot, blocks[cut:cut + 1])
            naive.remove(slot, blocks[cut:cut + 1])
        elif kind == "clear":
            index.clear(slot)
            naive.lru[slot].clear()
        else:
            index.set_capacity(slot, number)
            naive.capacities[slot] = number
            naive.insert(slot, [])
        for query in queries:
            expected = naive.longest_prefixes(query)
            assert index.longest_prefixes(query, chain=True).tolist() == expected
            assert index.longest_prefixes(query).tolist() == expected
        _assert_closed_masks_exact(index, naive, [*queries, blocks])
    assert index._chained  # chained input never falls back to the scan
    for slot in range(len(capacities)):
        assert index.held_count(slot) == len(naive.lru[slot])
        index.clear(slot)
    # nothing leaks once every slot is empty
    assert not (index._holders or index._closed or index._parent or index._children)


def _assert_closed_masks_exact(index, naive, chains):
    """closed[block k of a chain] = the slots holding blocks 0..k of it."""
    for chain in chains:
        runs = naive.longest_prefixes(chain)
        for k, block in enumerate(chain):
            expected = sum(1 << slot for slot, run in enumerate(runs) if run > k)
            assert index._closed.get(block, 0) == expected
    assert index._closed.keys() <= index._holders.keys()


def test_removed_middle_block_hides_its_tail_until_stored_again():
    index = KVIndex(16)
    slot = index.add_slot(100)
    prompt = list(range(100, 164))  # 4 blocks
    ours = hash_blocks(prompt)
    index.apply_event(slot, stored([b"e0", b"e1", b"e2", b"e3"], None, prompt))
    index.apply_event(slot, BlockRemoved((b"e1",), None))
    assert index.longest_prefixes(ours, chain=True).tolist() == [1]
    assert index.held_count(slot) == 3  # the tail stays held, but is no hit
    index.apply_event(slot, stored([b"e1"], b"e0", prompt[16:32]))
    assert index.longest_prefixes(ours, chain=True).tolist() == [4]


def test_many_slots_with_distinct_hit_lengths():
    index = KVIndex(16)
    blocks = _chain([0, 1, 2, 0, 1, 2])
    for slot in range(100):  # more distinct lengths than the bisection handles
        index.add_slot(100)
        index.insert(slot, blocks[: slot % 7])
    expected = [slot % 7 for slot in range(100)]
    assert index.longest_prefixes(blocks, chain=True).tolist() == expected
    assert index.longest_prefixes(blocks).tolist() == expected


def test_contradicting_parents_fall_back_to_the_scan_until_empty():
    index = KVIndex(16)
    slot = index.add_slot(100)
    index.insert(slot, [1, 2, 3])
    index.insert(slot, [2, 3])  # block 2 cannot start a chain and follow block 1
    assert not index._chained
    assert index.longest_prefixes([1, 2, 3], chain=True).tolist() == [3]
    index.remove(slot, [2])
    assert index.longest_prefixes([1, 2, 3], chain=True).tolist() == [1]
    index.clear(slot)
    index.insert(slot, [1, 2, 3])
    assert index._chained
    assert index.longest_prefixes([1, 2, 3], chain=True).tolist() == [3]
