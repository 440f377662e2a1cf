"""KV pressure (router_worker/routing/kv_pressure.py) and the committed load it reads."""

from __future__ import annotations

import numpy as np
import pytest

from router_worker.routing import make_policy
from router_worker.routing.kv_pressure import OutputLengths, kv_need, kv_room, kv_shortfall
from tests.routing.helpers import add_decoding, add_pending, cluster, features, tokens


def test_a_queued_request_counts_in_the_committed_batch_and_context_until_it_finishes():
    state = cluster(2)
    request = features(tokens(0, 1000))
    state.on_dispatch(request, "i0", 0.0, cached_tokens=0)
    view = state.view()
    assert view.batch_size.tolist() == [1, 0]  # no scrape: dispatched counts as running
    assert view.committed_batch.tolist() == [1, 0]
    assert view.queued_context_tokens.tolist() == [1000, 0]
    assert view.committed_context_tokens.tolist() == [1000, 0]
    assert view.decode_context_tokens.tolist() == [0, 0]
    state.on_first_token(request.request_id, 2.0)
    assert view.queued_context_tokens.tolist() == [0, 0]
    assert view.committed_context_tokens.tolist() == [1000, 0]
    state.advance(5.0)
    assert view.decode_age_s.tolist() == [3.0, 0.0]
    state.on_finish(request.request_id, 6.0)
    assert view.committed_batch.tolist() == [0, 0]
    assert view.committed_context_tokens.tolist() == [0, 0]
    assert view.decode_age_s.tolist() == [0.0, 0.0]


def test_a_request_queued_in_the_engine_leaves_the_batch_but_not_the_committed_batch():
    state = cluster(1)
    add_pending(state, "i0", 100)
    add_pending(state, "i0", 100)
    state.on_scrape("i0", 0.0, running=0, waiting=2)  # both wait for KV in the engine
    view = state.view()
    assert view.batch_size.tolist() == [0]
    assert view.committed_batch.tolist() == [2]


def test_expected_output_counts_the_outputs_still_decoding():
    """Short requests finish first: the finished mean alone misses a burst of long ones
    that are still decoding; one that has decoded g tokens is expected to decode g more."""
    state = cluster(1)
    outputs = OutputLengths(prior_tokens=256)
    for k in range(4):  # short requests: 100 tokens in 1 s
        rid = f"short{k}"
        outputs.first_token(rid, 0.0)
        outputs.finish(rid, 101, 1.0)
    assert outputs.done_mean == pytest.approx(101)
    assert outputs.tpot_s == pytest.approx(0.01)
    view = state.view()
    assert outputs.expected(view) == pytest.approx(101)  # nothing decoding
    long = features(tokens(0, 64))
    state.on_dispatch(long, "i0", 0.0)
    state.on_first_token(long.request_id, 1.0)
    state.advance(6.0)  # 5 s of decoding: about 500 tokens so far
    assert outputs.expected(view) == pytest.approx(1000)


def test_an_instance_that_cannot_hold_the_request_is_left_out_while_another_can():
    state = cluster(2, capacity_blocks=100)  # 1,600 tokens each
    outputs = OutputLengths(prior_tokens=200)
    for _ in range(6):  # 6 queued × (16 prompt + 200 expected) ≈ 1,300 tokens on i0
        add_pending(state, "i0", 16)
    request = features(tokens(0, 160))
    view = state.view()
    need, capacity = kv_need(request, view, outputs)
    assert capacity.tolist() == [1600, 1600]
    assert need[0] == pytest.approx(6 * 16 + 6 * 200 + 160 + 200)
    assert kv_shortfall(request, view, outputs)[0] > 0
    allowed = np.array([True, True])
    assert kv_room(request, view, allowed, outputs).tolist() == [False, True]
    for _ in range(7):  # now i1 is short too, by more of its capacity
        add_pending(state, "i1", 16)
    assert kv_room(request, view, allowed, outputs).tolist() == [True, False]


def test_lmetric_follows_the_prefix_only_while_its_holder_has_kv_room():
    state = cluster(2, capacity_blocks=100)  # 1,600 tokens each; expected output 256
    first = features(tokens(0, 320))
    state.on_dispatch(first, "i0", 0.0, cached_tokens=0)  # i0 now holds the prefix
    state.on_first_token(first.request_id, 0.0)
    add_decoding(state, "i1", 3)
    request = features(tokens(0, 336))
    roomy = make_policy("lmetric").decide(request, state.view(), 0.0)
    assert roomy.instance_id == "i0"
    for _ in range(5):  # i0 takes on more than its KV holds with their outputs
        add_pending(state, "i0", 16)
    full = make_policy("lmetric").decide(request, state.view(), 0.0)
    assert full.instance_id == "i1"
    off = make_policy("lmetric", {"kv_pressure": False}).decide(request, state.view(), 0.0)
    assert off.instance_id == "i0"
