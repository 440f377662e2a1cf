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
        self.lru: list[list[int]] = [[] for _ in capacities]

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


def _int_chain(seq):
    """Chained hashes of a sequence of block contents (what ``insert`` requires)."""
    hashes, parent = [], 0
    for content in seq:
        parent = hash((parent, content))
        hashes.append(parent)
    return hashes


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
    queries = [_int_chain(query) for query in queries]
    for kind, slot, seq in ops:
        slot %= len(capacities)
        blocks = _int_chain(seq)
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
            expected = naive.longest_prefixes(query)
            assert index.longest_prefixes(query, chain=True).tolist() == expected
        for slot in range(len(capacities)):
            assert index.held_count(slot) == len(naive.lru[slot])
    for query in queries:  # a per-block question: converts to the per-block form
        assert index.longest_prefixes(query).tolist() == naive.longest_prefixes(query)


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


def test_engine_block_router_blocks_are_touched_last_to_first():
    index = KVIndex(16)
    slot = index.add_slot(3)
    prompt = list(range(64))  # 4 router blocks in 2 engine blocks
    ours = hash_blocks(prompt)
    index.apply_event(slot, stored([7, 8], None, prompt, block_size=32))
    # touched 1, 0, 3, 2: the first engine block's second router block is the oldest
    assert [index.holds(slot, h) for h in ours] == [True, False, True, True]
    assert index.longest_prefixes(ours, chain=True).tolist() == [1]


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
@given(
    st.lists(st.integers(2, 12), min_size=1, max_size=4),
    chain_ops,
    st.lists(paths, min_size=1, max_size=6),
)
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
        elif kind == "insert_tail":  # continuing from a parent block the slot may not hold
            cut = min(cut, len(blocks))
            parent = blocks[cut - 1] if cut else None
            index.insert(slot, blocks[cut:], parent)
            naive.insert(slot, blocks[cut:])
        elif kind == "remove":  # any block, middle ones included
            index.remove(slot, blocks[cut : cut + 1])
            naive.remove(slot, blocks[cut : cut + 1])
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
            if index._tree is None:  # (a plain lookup would leave the run-length form)
                assert index.longest_prefixes(query).tolist() == expected
        _assert_consistent(index, naive, [*queries, blocks])
    for slot in range(len(capacities)):
        assert index.held_count(slot) == len(naive.lru[slot])
        index.clear(slot)
    _assert_empty(index)


def _assert_empty(index):
    """Nothing leaks once every slot is empty."""
    assert not (index._closed or index._loose or index._children)
    assert index._tree is None or not index._tree.root.children


def _assert_consistent(index, naive, chains):
    """closed[block k of a chain] = the slots holding blocks 0..k; loose = held but not closed."""
    if index._tree is not None:  # run-length form: each slot's LRU, in order
        for slot, lru in enumerate(naive.lru):
            assert [block for block, _ in index._tree.lru_items(slot)] == lru
        return
    for chain in chains:
        runs = naive.longest_prefixes(chain)
        for k, block in enumerate(chain):
            closed = sum(1 << slot for slot, run in enumerate(runs) if run > k)
            held = sum(1 << slot for slot, lru in enumerate(naive.lru) if block in lru)
            assert index._closed.get(block, 0) == closed
            assert index._loose.get(block, 0) == held & ~closed
    for slot, lru in enumerate(naive.lru):
        assert index._loose_count[slot] == sum(index._loose.get(b, 0) >> slot & 1 for b in lru)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(2, 12), min_size=1, max_size=3),
    chain_ops,
    st.lists(paths, min_size=1, max_size=6),
    st.sampled_from([16, 32]),
)
def test_kv_events_agree_with_block_by_block_reference(capacities, ops, query_paths, engine_bs):
    """Stored events (chained by parent engine hash) vs the naive index fed per engine block."""
    index, naive = KVIndex(16), NaiveIndex(list(capacities))
    # the reference's engine hash -> router hash
    engine_maps: list[dict[bytes, int]] = [{} for _ in capacities]
    for capacity in capacities:
        index.add_slot(capacity)
    per = engine_bs // 16
    for kind, slot, path, cut, _ in ops:
        slot %= len(capacities)
        blocks = _chain(path)
        token_ids = [v * 1000 + t for v in path for t in range(16)]
        if kind in ("insert", "insert_tail"):
            cut = min(cut, len(blocks)) // per * per if kind == "insert_tail" else 0
            parent = f"e{blocks[cut - 1]}".encode() if cut else None
            mine = blocks[cut:]
            engine = [f"e{mine[i + per - 1]}".encode() for i in range(0, len(mine) - per + 1, per)]
            index.apply_event(slot, stored(engine, parent, token_ids[cut * 16 :], engine_bs))
            if parent is not None and parent not in engine_maps[slot]:
                continue  # unresolved: not applied
            for i, engine_hash in enumerate(engine):
                naive.insert(slot, mine[i * per : (i + 1) * per])
                engine_maps[slot][engine_hash] = mine[(i + 1) * per - 1]
        elif kind == "remove":
            engine_hash = f"e{blocks[cut]}".encode() if cut < len(blocks) else b"none"
            index.apply_event(slot, BlockRemoved((engine_hash,), None))
            if engine_hash in engine_maps[slot]:
                naive.remove(slot, [engine_maps[slot].pop(engine_hash)])
        elif kind == "clear":
            index.apply_event(slot, AllBlocksCleared())
            naive.lru[slot].clear()
            engine_maps[slot].clear()
        for query in (_chain(path) for path in query_paths):
            expected = naive.longest_prefixes(query)
            assert index.longest_prefixes(query, chain=True).tolist() == expected
        for held, lru in zip(
            (index.held_count(s) for s in range(len(capacities))), naive.lru, strict=True
        ):
            assert held == len(lru)


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


whole_prompt_ops = st.lists(
    st.tuples(st.integers(0, 3), paths, st.integers(1, 12)), min_size=1, max_size=30
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(2, 12), min_size=1, max_size=4),
    whole_prompt_ops,
    st.integers(0, 30),
    st.integers(0, 4),
    st.lists(paths, min_size=1, max_size=6),
)
def test_children_links_built_late_agree_with_the_reference(
    capacities, ops, switch_at, cut, query_paths
):
    """Whole-prompt inserts run without children links; a ``remove`` midway builds them
    from the LRUs, and everything after must agree with the reference as before."""
    index, naive = KVIndex(16), NaiveIndex(list(capacities))
    for capacity in capacities:
        index.add_slot(capacity)
    queries = [_chain(path) for path in query_paths]
    inserted: list[list[int]] = []
    previous: tuple[int, list[int]] = (0, [])
    switch_at = 1 + switch_at % len(ops)  # after at least one insert; maybe never
    for step, (slot, path, capacity) in enumerate(ops):
        slot %= len(capacities)
        blocks = _chain(path)
        if step == switch_at:  # the previous prompt loses a block; those below turn loose
            slot, blocks = previous
            index.remove(slot, blocks[cut : cut + 1])
            naive.remove(slot, blocks[cut : cut + 1])
        else:
            if step % 5 == 4:
                index.set_capacity(slot, capacity)
                naive.capacities[slot] = capacity
                naive.insert(slot, [])
            index.insert(slot, blocks)
            naive.insert(slot, blocks)
        previous = slot, blocks
        assert (index._tree is None) == (step >= switch_at)
        for query in queries:
            assert index.longest_prefixes(query, chain=True).tolist() == naive.longest_prefixes(
                query
            )
        inserted.append(blocks)
        _assert_consistent(index, naive, [*queries, *inserted])
    for slot in range(len(capacities)):
        index.clear(slot)
    _assert_empty(index)


def test_run_length_form_over_many_slots_and_removed_slots():
    """Tree form (whole-prompt inserts only) past one machine word of slots, a slot
    removed and one cleared: lookups, held counts and LRU order stay per slot."""
    index, naive = KVIndex(16), NaiveIndex([6] * 70)
    for _ in range(70):
        index.add_slot(6)
    prompts = [_chain([0, 1, 2, 0]), _chain([0, 1, 1]), _chain([2, 2])]
    for slot in range(70):
        for prompt in prompts[: 1 + slot % 3]:
            index.insert(slot, prompt)
            naive.insert(slot, prompt)
    index.remove_slot(5)
    naive.lru[5].clear()
    index.clear(66)
    naive.lru[66].clear()
    assert index._tree is not None  # nothing here needed the per-block form
    for prompt in (*prompts, _chain([0, 1, 2, 0, 1])):
        assert index.longest_prefixes(prompt, chain=True).tolist() == naive.longest_prefixes(prompt)
    for slot in range(70):
        assert index.held_count(slot) == len(naive.lru[slot])
    _assert_consistent(index, naive, prompts)
    index.insert(5, prompts[0])  # a removed slot takes nothing
    assert index.held_count(5) == 0
