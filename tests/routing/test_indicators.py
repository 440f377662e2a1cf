from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_interface.kv_events import BlockStored, KVEventBatch
from router_worker.routing import (
    ClusterState,
    Health,
    UnknownRequestError,
    decode_kv_event_batch,
    encode_kv_event_batch,
)
from router_worker.routing.indicators import PrefillProgress

from .helpers import cluster, features, tokens, warm


def test_lifecycle_moves_tokens_from_pending_to_batch_and_out():
    state = cluster(2)
    warm(state, "i0", tokens(0, 64))
    request = features(tokens(0, 100))
    uncached = state.on_dispatch(request, "i0", 1.0)
    assert uncached == 100 - 64
    snap = state.snapshot("i0")
    assert (snap.pending_prefill_tokens, snap.decoding, snap.in_flight) == (36, 0, 1)
    # The view's BS is the engine's running batch: the prefilling request is in it.
    assert state.view().batch_size.tolist() == [1, 0]
    state.on_first_token(request.request_id, 1.5)
    snap = state.snapshot("i0")
    assert (snap.pending_prefill_tokens, snap.decoding, snap.decode_context_tokens) == (0, 1, 100)
    assert state.view().batch_size.tolist() == [1, 0]
    state.on_finish(request.request_id, 3.0)
    snap = state.snapshot("i0")
    assert (snap.decoding, snap.in_flight, snap.decode_context_tokens) == (0, 0, 0)
    assert state.view().batch_size.tolist() == [0, 0]


def test_pending_attention_pairs_follow_the_pending_prefill():
    """Each queued prefill adds the (query, key) pairs it will compute: its new tokens
    against its cached ones and against each other; they leave with its first token, or
    with its end if it never got one."""
    state = cluster(1)
    warm(state, "i0", tokens(0, 64))
    first = features(tokens(0, 100))  # 36 new after 64 cached
    second = features(tokens(500, 32))  # 32 new
    state.on_dispatch(first, "i0", 1.0)
    state.on_dispatch(second, "i0", 1.0)
    pairs = state.view().pending_attention_pairs
    assert pairs.tolist() == [36 * 64 + 36 * 36 / 2 + 32 * 32 / 2]
    state.on_first_token(first.request_id, 2.0)
    assert state.view().pending_attention_pairs.tolist() == [32 * 32 / 2]
    state.on_error(second.request_id, 2.5)
    assert state.view().pending_attention_pairs.tolist() == [0.0]


def test_dispatch_records_shadow_blocks():
    state = cluster(2)
    request = features(tokens(0, 48))
    state.on_dispatch(request, "i1", 0.0)
    follow_up = features(tokens(0, 80))
    assert state.view().cached_blocks(follow_up).tolist() == [0, 3]
    assert state.view().cached_tokens(follow_up).tolist() == [0, 48]


def test_cached_tokens_leave_one_token_to_compute():
    state = cluster(1)
    warm(state, "i0", tokens(0, 32))
    assert state.view().new_tokens(features(tokens(0, 32))).tolist() == [1]


def test_unknown_and_duplicate_requests_are_errors():
    state = cluster(1)
    with pytest.raises(UnknownRequestError):
        state.on_first_token("nope", 0.0)
    with pytest.raises(UnknownRequestError):
        state.on_finish("nope", 0.0)
    request = features(tokens(0, 10))
    state.on_dispatch(request, "i0", 0.0)
    with pytest.raises(ValueError, match="already in flight"):
        state.on_dispatch(request, "i0", 0.0)
    with pytest.raises(KeyError, match="unknown instance"):
        state.on_dispatch(features(tokens(0, 10)), "zz", 0.0)


def test_block_size_mismatch_is_rejected():
    state = cluster(1)
    with pytest.raises(ValueError, match="block_size"):
        state.on_dispatch(features(tokens(0, 64), block_size=32), "i0", 0.0)


def test_prefill_throughput_estimate_follows_observed_work_rate():
    state = ClusterState(default_prefill_tps=1000.0, prefill_tps_alpha=0.5)
    state.add_instance("a")
    request = features(tokens(0, 4000))
    state.on_dispatch(request, "a", 10.0)
    state.on_first_token(request.request_id, 11.0)  # 4000 tokens drained in 1 s
    assert state.snapshot("a").prefill_tps == pytest.approx(0.5 * 1000 + 0.5 * 4000)


def test_scraped_running_corrects_batch_size_for_unseen_load():
    state = cluster(2)
    state.on_scrape("i0", 5.0, running=7, waiting=2, kv_usage=0.4, capacity_blocks=50)
    view = state.view()
    assert view.batch_size.tolist() == [7, 0]
    snap = state.snapshot("i0")
    assert (snap.scraped_waiting, snap.kv_usage, snap.last_scrape) == (2, 0.4, 5.0)
    assert state.snapshot("i1").kv_usage is None


def test_view_carries_scraped_capacity_and_kv_usage_with_unknown_as_zero():
    state = ClusterState(default_capacity_blocks=100)
    state.add_instance("i0")
    state.add_instance("i1", capacity_blocks=70)
    view = state.view()
    assert view.capacity_blocks.tolist() == [100, 70]
    assert view.kv_usage_or_zero.tolist() == [0.0, 0.0]
    state.on_scrape("i0", 1.0, kv_usage=0.25, capacity_blocks=40)
    assert view.capacity_blocks.tolist() == [40, 70]
    assert [state.kv.capacity(slot) for slot in range(2)] == [40, 70]
    assert view.kv_usage_or_zero.tolist() == [0.25, 0.0]
    assert np.isnan(view.kv_usage[1])


def test_health_and_removal():
    state = cluster(3)
    state.set_health("i1", Health.DRAINING)
    state.remove_instance("i2")
    assert state.view().eligible.tolist() == [True, False, False]
    state.add_instance("i2")
    assert state.view().eligible.tolist() == [True, False, True]


def test_view_arrays_are_read_only():
    view = cluster(2).view()
    with pytest.raises(ValueError):
        view.pending_prefill[0] = 5


def test_kv_events_from_an_engine_with_its_own_hashes_land_on_router_keys():
    state = cluster(2)
    prompt = tokens(500, 64)
    payload = encode_kv_event_batch(
        KVEventBatch(
            0.0,
            (
                BlockStored(
                    tuple(f"sha-{k}".encode() for k in range(4)),
                    None,
                    tuple(int(t) for t in prompt),
                    16,
                ),
            ),
        )
    )
    state.on_kv_event_batch("i1", decode_kv_event_batch(payload), 0.0)
    assert state.view().cached_blocks(features(prompt)).tolist() == [0, 4]


lifecycles = st.lists(
    st.tuples(
        st.integers(0, 2), st.integers(1, 200), st.sampled_from(["finish", "error"]), st.booleans()
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=50, deadline=None)
@given(lifecycles, st.randoms(use_true_random=False))
def test_state_returns_to_zero_after_every_request_ends(requests, rnd):
    state = cluster(3)
    live = []
    for slot, length, ending, starts in requests:
        request = features(tokens(rnd.randrange(50), length))
        state.on_dispatch(request, f"i{slot}", 0.0)
        live.append((request.request_id, ending, starts))
    rnd.shuffle(live)
    view = state.view()
    for request_id, ending, starts in live:
        # Never scraped: every dispatched request is in the batch, started or not.
        assert view.batch_size.tolist() == view.in_flight.tolist()
        if starts:
            state.on_first_token(request_id, 1.0)
        getattr(state, f"on_{ending}")(request_id, 2.0)
    for array in (
        view.pending_prefill,
        view.batch_size,
        view.in_flight,
        view.decode_context_tokens,
        view.decode_blocks,
    ):
        assert array.tolist() == [0, 0, 0]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("dispatch"), st.integers(1, 64), st.integers(0, 0)),
        st.tuples(st.just("start"), st.integers(0, 40), st.integers(0, 0)),
        st.tuples(st.just("finish"), st.integers(0, 40), st.integers(0, 0)),
        st.tuples(st.just("scrape"), st.integers(0, 12), st.integers(0, 12)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(steps)
def test_batch_size_stays_between_decoding_and_in_flight_plus_external(ops):
    state = ClusterState(scrape_interval_s=1.0, external_load_ttl_intervals=2.0)
    state.add_instance("a")
    view = state.view()
    live: list[str] = []
    now = 0.0
    for op, x, y in ops:
        now += 0.25
        if op == "dispatch":
            request = features(tokens(1_000 * len(live), x))
            state.on_dispatch(request, "a", now)
            live.append(request.request_id)
        elif op == "start" and live:
            state.on_first_token(live[x % len(live)], now)
        elif op == "finish" and live:
            state.on_finish(live.pop(x % len(live)), now)
        elif op == "scrape":
            state.on_scrape("a", now, running=x, waiting=y)
        decoding = state.snapshot("a").decoding
        in_flight = float(view.in_flight[0])
        ours = float(view.batch_size[0] - view.external_running[0])
        assert 0 <= view.ours_waiting[0] <= in_flight - decoding
        assert decoding <= ours <= in_flight
    for request_id in live:
        state.on_error(request_id, now + 1.0)
    assert view.batch_size.tolist() == view.external_running.tolist()
    state.advance(now + 10.0)  # every scrape expired
    assert view.batch_size.tolist() == [0]
    assert view.ours_waiting.tolist() == [0]


def test_prefill_progress_counts_prompts_done_and_the_one_being_prefilled():
    state = cluster(2)

    def sq(n: int) -> float:  # the attention pairs of an n-token prompt, nothing cached
        return n * n / 2

    a, b, c = (features(tokens(1_000_000 * k, n)) for k, n in ((1, 320), (2, 160), (3, 480)))
    assert state.prefill_progress("i0") == PrefillProgress(0.0, 0.0)
    for request, at in ((a, 1.0), (b, 1.5), (c, 2.0)):
        state.on_dispatch(request, "i0", at, cached_tokens=0)
    # The oldest unstarted one is the head, since its dispatch.
    assert state.prefill_progress("i0") == PrefillProgress(
        0.0, 0.0, a.request_id, 320, sq(320), 1.0
    )
    state.on_first_token(a.request_id, 3.0)  # done: counted; b is the head since then
    assert state.prefill_progress("i0") == PrefillProgress(
        320, sq(320), b.request_id, 160, sq(160), 3.0
    )
    state.on_error(b.request_id, 3.5)  # ended unstarted: never prefilled, c is the head
    assert state.prefill_progress("i0") == PrefillProgress(
        320, sq(320), c.request_id, 480, sq(480), 3.0
    )
    state.on_first_token(c.request_id, 4.0)
    state.on_finish(a.request_id, 5.0)  # the cumulative count stays
    assert state.prefill_progress("i0") == PrefillProgress(800, sq(320) + sq(480))
    assert state.prefill_progress("i1") == PrefillProgress(0.0, 0.0)


def test_when_prefilled_tells_of_the_first_token_or_of_an_end_without_one():
    state = cluster(1)
    told: list[tuple[str, float, bool]] = []
    a, b = features(tokens(1_000_000, 64)), features(tokens(2_000_000, 64))

    def waiter(request_id: str) -> Callable[[float, bool], None]:
        return lambda at, started: told.append((request_id, at, started))

    for request in (a, b):
        state.on_dispatch(request, "i0", 1.0, cached_tokens=0)
        state.when_prefilled(request.request_id, waiter(request.request_id))
    state.on_first_token(a.request_id, 2.0)
    state.on_first_token(a.request_id, 2.5)  # a repeat tells nobody again
    state.on_error(b.request_id, 3.0)
    state.on_finish(a.request_id, 4.0)
    assert told == [(a.request_id, 2.0, True), (b.request_id, 3.0, False)]
    with pytest.raises(ValueError, match="already has its first token"):
        state.on_dispatch(b, "i0", 5.0, cached_tokens=0)
        state.on_first_token(b.request_id, 5.0)
        state.when_prefilled(b.request_id, lambda at, started: None)
