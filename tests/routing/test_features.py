import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_worker.routing.features import (
    ROOT_HASH,
    SHORT_CHAIN_BLOCKS,
    block_digests,
    build_features,
    chain_step,
    extend_chain,
    hash_blocks,
)


def naive_chain(token_ids, block_size, parent=ROOT_HASH):
    out, value = [], parent
    for digest in block_digests(token_ids, block_size):
        value = chain_step(value, digest)
        out.append(value)
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), max_size=300), st.sampled_from([1, 4, 16, 32]))
def test_vectorised_chain_matches_step_by_step(token_ids, block_size):
    assert hash_blocks(token_ids, block_size) == naive_chain(token_ids, block_size)


@pytest.mark.parametrize("blocks", [SHORT_CHAIN_BLOCKS, SHORT_CHAIN_BLOCKS + 1])
def test_short_and_long_chains_are_the_same_function(blocks):
    """Up to SHORT_CHAIN_BLOCKS the chain is finished on Python ints, beyond it by numpy:
    both give the step-by-step values, from the root and from any parent, for token ids
    up to 2**64 - 1 (the +1 of the digest wraps)."""
    rng = np.random.default_rng(blocks)
    token_ids = [*rng.integers(0, 2**63, blocks * 16 - 1).tolist(), 2**64 - 1]
    assert hash_blocks(token_ids) == naive_chain(token_ids, 16)
    parent = 0xFEDCBA9876543210
    assert extend_chain(parent, token_ids, 16) == naive_chain(token_ids, 16, parent)


def test_only_full_blocks_are_hashed():
    assert len(hash_blocks(list(range(47)), 16)) == 2
    assert hash_blocks(list(range(15)), 16) == []


def test_shared_prefix_shares_hashes_until_the_first_differing_block():
    a = list(range(64))
    b = [*a[:40], 999_999, *a[41:]]
    ha, hb = hash_blocks(a), hash_blocks(b)
    assert ha[:2] == hb[:2]
    assert ha[2] != hb[2] and ha[3] != hb[3]  # block 2 differs, and the chain carries it


def test_block_order_matters():
    a = list(range(32))
    swapped = a[16:] + a[:16]
    assert hash_blocks(a)[1] != hash_blocks(swapped)[1]


def test_extend_chain_continues_from_any_block():
    token_ids = list(range(1000, 1160))
    full = hash_blocks(token_ids)
    assert extend_chain(full[3], token_ids[64:], 16) == full[4:]


def test_list_and_array_inputs_agree():
    token_ids = [7, 3, 150_000, 42] * 40
    assert hash_blocks(token_ids) == hash_blocks(np.array(token_ids, dtype=np.int32))


def test_build_features():
    f = build_features("r1", list(range(40)), 1.5, session_key="s", turn_index=2)
    assert (f.prompt_tokens, len(f.block_hashes), f.block_size) == (40, 2, 16)
    assert (f.session_key, f.turn_index, f.arrival_time) == ("s", 2, 1.5)
    with pytest.raises(ValueError):
        build_features("r2", [1], 0.0, turn_index=-1)
    with pytest.raises(ValueError):
        hash_blocks([1, 2], 0)
