"""Scrape correction: batch size = this router's running requests + external load.

This router's running requests on i = its decoding requests + its dispatched,
not-started ones minus those estimated to sit in the engine's waiting queue
(``min(not started, scraped waiting)``). External load is what the engine
reports minus what this router accounts for at the time of the scrape (floored
at 0); both scraped terms expire after a few scrape intervals without a fresh
scrape. All times are passed in; nothing reads a clock.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_worker.routing import ClusterState, make_policy

from .helpers import add_decoding, add_pending, cluster, features, tokens, warm

# The paper's exact score, P-token × BS: these tests pin what BS counts.
PAPER = {"batch_offset": 0.0}

PREFIX = tokens(0, 768)


def _turn(k: int, now: float = 0.0):
    """A follow-up sharing PREFIX with 128 tokens of its own."""
    return features(np.concatenate([PREFIX, tokens(100_000 + 1_000 * k, 128)]), now=now)


def _burst_on_holder(state: ClusterState, count: int) -> None:
    """i0 holds PREFIX and decodes one request; ``count`` follow-ups were just sent to it."""
    warm(state, "i0", PREFIX)
    add_decoding(state, "i0", 1)
    add_decoding(state, "i1", 1)
    for k in range(count):
        request = _turn(k)
        state.on_dispatch(request, "i0", 1.0)


# (1) a single router whose scrape matches its own accounting sees no extra load


@pytest.mark.parametrize(
    "running, waiting, chosen", [(4, 0, "i1"), (3, 1, "i1"), (2, 2, "i1"), (1, 3, "i0")]
)
def test_own_requests_in_the_scrape_are_not_counted_twice(running, waiting, chosen):
    state = cluster(2)
    _burst_on_holder(state, 3)  # i0: 1 decoding + 3 dispatched, not started
    # However the engine splits our 3 new requests between prefilling and queued,
    # the scrape holds nothing but this router's own requests.
    state.on_scrape("i0", 1.1, running=running, waiting=waiting)
    state.on_scrape("i1", 1.1, running=1, waiting=0)
    view = state.view()
    assert view.external_running.tolist() == [0, 0]
    # BS is the engine's own count, once: 1 decoding + the (3 − waiting) prefilling.
    assert view.batch_size.tolist() == [running, 1]
    assert view.ours_waiting.tolist() == [waiting, 0]
    # i0: P = 3·128 pending + 128 new = 512  vs  i1: P = 896, × BS 1. The holder
    # keeps the follow-up only while its batch is not 896/512 times i1's: with
    # our 3 requests queued (BS 1) it does; once the engine runs 1+ of them
    # alongside the decoding one it does not. (When BS counted decoding requests
    # only, i0 had BS 1 in every case and always won.)
    decision = make_policy("lmetric", PAPER).decide(_turn(9, 1.2), view, 1.2)
    assert decision.score_table() == {"i0": 512 * running, "i1": 896 * 1}
    assert decision.instance_id == chosen


def test_own_requests_that_finished_after_the_scrape_do_not_linger():
    state = cluster(2)
    ids = add_decoding(state, "i0", 3)
    state.on_scrape("i0", 1.0, running=3, waiting=0)
    for request_id in ids:
        state.on_finish(request_id, 1.2)
    # The scrape (still within its interval) counted them; the view follows local at once.
    assert state.view().batch_size.tolist() == [0, 0]


# (2) a stale scrape lower than local never reduces the view below local


def test_stale_scrape_lower_than_local_never_reduces_the_view():
    state = cluster(2)
    add_decoding(state, "i0", 5)
    add_pending(state, "i0", 200)
    state.on_scrape("i0", 1.0, running=2, waiting=0)  # taken before most of ours arrived
    view = state.view()
    assert view.external_running.tolist() == [0, 0]
    assert view.batch_size.tolist() == [6, 0]  # 5 decoding + 1 prefilling
    add_decoding(state, "i0", 2)
    assert view.batch_size.tolist() == [8, 0]
    assert state.snapshot("i0").external_running == 0


# (3) load another router sent is added to the local count


def test_load_from_another_router_is_added_and_local_changes_stay_immediate():
    state = cluster(2)
    add_decoding(state, "i0", 2)
    state.on_scrape("i0", 1.0, running=5, waiting=0)  # 3 of them are someone else's
    view = state.view()
    assert view.external_running.tolist() == [3, 0]
    assert view.batch_size.tolist() == [5, 0]
    add_decoding(state, "i0", 1)
    assert view.batch_size.tolist() == [6, 0]  # max(local, scraped) stayed at 5
    assert state.snapshot("i0").external_running == 3


def test_waiting_count_attributes_our_unstarted_requests_before_external_running():
    state = cluster(1)
    add_decoding(state, "i0", 1)
    add_pending(state, "i0", 100)
    # 1 ours decoding + 1 someone else's running; our new request is still queued.
    state.on_scrape("i0", 1.0, running=2, waiting=1)
    assert state.view().external_running.tolist() == [1]
    assert state.view().batch_size.tolist() == [2]  # 1 ours + 1 theirs; ours queued
    # Without a waiting count ours are assumed running: it is in BS, and the
    # scraped 2 are both ours, so no external load is invented.
    state.on_scrape("i0", 2.0, running=2)
    assert state.view().external_running.tolist() == [0]
    assert state.view().batch_size.tolist() == [2]


def test_scraped_waiting_keeps_our_queued_requests_out_of_the_batch():
    state = ClusterState(scrape_interval_s=1.0, external_load_ttl_intervals=2.0)
    state.add_instance("a")
    queued = [add_pending(state, "a", 1000) for _ in range(4)]
    view = state.view()
    assert view.batch_size.tolist() == [4]  # no scrape: every dispatched request runs
    state.on_scrape("a", 10.0, running=1, waiting=3)  # KV memory full: 3 of ours queued
    assert (view.ours_waiting.tolist(), view.batch_size.tolist()) == ([3], [1])
    # The running one gets its first token: still 3 not started, all queued.
    state.on_first_token(queued[0], 10.2)
    assert view.batch_size.tolist() == [1]
    # It finishes and, before the next scrape, one queued request starts (first token).
    state.on_finish(queued[0], 10.4)
    state.on_first_token(queued[1], 10.5)
    assert (view.ours_waiting.tolist(), view.batch_size.tolist()) == ([2], [1])
    # A new dispatch takes the queue place q1 left; the next one, beyond the
    # scraped queue length, is assumed running.
    add_pending(state, "a", 10)
    assert (view.ours_waiting.tolist(), view.batch_size.tolist()) == ([3], [1])
    add_pending(state, "a", 10)
    assert (view.ours_waiting.tolist(), view.batch_size.tolist()) == ([3], [2])
    # The scrape expires: every not-started request counts as running again.
    state.advance(12.0)
    assert (view.ours_waiting.tolist(), view.batch_size.tolist()) == ([0], [5])


def test_scraped_waiting_is_ignored_with_scraped_load_off():
    state = ClusterState(use_scraped_load=False)
    state.add_instance("a")
    add_pending(state, "a", 100)
    add_pending(state, "a", 100)
    state.on_scrape("a", 1.0, running=0, waiting=2)
    assert state.view().ours_waiting.tolist() == [0]
    assert state.view().batch_size.tolist() == [2]


def test_two_routers_each_see_the_whole_cluster_and_the_router_avoids_the_busy_one():
    first, second = cluster(2), cluster(2)
    add_decoding(first, "i0", 2)
    add_decoding(second, "i0", 4)
    add_decoding(first, "i1", 1)
    add_decoding(second, "i1", 1)
    engine = {"i0": 6, "i1": 2}  # what both routers' scrapes report
    for state in (first, second):
        for name, running in engine.items():
            state.on_scrape(name, 1.0, running=running, waiting=0)
        assert state.view().batch_size.tolist() == [6, 2]
    # Same uncached prompt everywhere: the product follows the combined batch sizes.
    decision = make_policy("lmetric", PAPER).decide(features(tokens(0, 64)), first.view(), 1.0)
    assert decision.instance_id == "i1"


def test_scraped_load_off_reports_local_only():
    state = ClusterState(use_scraped_load=False)
    state.add_instance("a")
    add_decoding(state, "a", 1)
    add_pending(state, "a", 10)
    state.on_scrape("a", 1.0, running=9, waiting=0)
    assert state.view().batch_size.tolist() == [2]  # in flight: decoding + prefilling


# (4) external load expires without a fresh scrape


def test_external_load_expires_after_the_configured_scrape_intervals():
    state = ClusterState(scrape_interval_s=1.0, external_load_ttl_intervals=2.0)
    state.add_instance("a")
    add_decoding(state, "a", 1)
    state.on_scrape("a", 10.0, running=4, waiting=0)
    view = state.view()
    assert view.batch_size.tolist() == [4]
    state.advance(11.99)
    assert view.batch_size.tolist() == [4]
    state.advance(12.0)  # two intervals without a fresh scrape
    assert view.batch_size.tolist() == [1]
    state.on_scrape("a", 13.0, running=3, waiting=0)
    assert view.batch_size.tolist() == [3]
    # Any update moves the clock (here a dispatch), and the clock never goes back.
    add_pending(state, "a", 10)  # helpers dispatch at now=0.0
    assert state.clock == 13.0
    state.on_first_token(add_pending(state, "a", 10), 15.5)
    assert view.batch_size.tolist() == [3]  # external gone; 2 decoding + 1 not started


def test_scrape_interval_is_learned_from_scrape_spacing():
    state = ClusterState(external_load_ttl_intervals=2.5)
    state.add_instance("a")
    for k in range(6):
        state.on_scrape("a", 0.1 * k, running=2, waiting=0)
    view = state.view()
    state.advance(0.5 + 0.24)
    assert view.batch_size.tolist() == [2]
    state.advance(0.5 + 0.26)
    assert view.batch_size.tolist() == [0]
    # A long outage barely stretches the estimate: the gap counts at most twice.
    state.on_scrape("a", 60.0, running=2, waiting=0)
    state.advance(60.0 + 2.5 * 0.13 + 0.01)
    assert view.batch_size.tolist() == [0]


def test_external_load_before_two_scrapes_uses_a_one_second_interval():
    state = ClusterState()
    state.add_instance("a")
    state.on_scrape("a", 5.0, running=2)
    state.advance(7.4)
    assert state.view().batch_size.tolist() == [2]
    state.advance(7.5)
    assert state.view().batch_size.tolist() == [0]


def test_removed_instance_forgets_its_external_load():
    state = cluster(2)
    state.on_scrape("i1", 1.0, running=3, waiting=0)
    state.remove_instance("i1")
    state.add_instance("i1")
    assert state.view().batch_size.tolist() == [0, 0]


def test_invalid_scrape_settings_are_rejected():
    with pytest.raises(ValueError, match="scrape_interval_s"):
        ClusterState(scrape_interval_s=0)
    with pytest.raises(ValueError, match="external_load_ttl_intervals"):
        ClusterState(external_load_ttl_intervals=0)


@settings(max_examples=200, deadline=None)
@given(
    decoding=st.integers(0, 6),
    unstarted=st.integers(0, 6),
    queued=st.integers(0, 6),
    others=st.integers(0, 6),
    stale_drop=st.integers(0, 12),
)
def test_view_is_local_plus_what_others_sent(decoding, unstarted, queued, others, stale_drop):
    state = cluster(1)
    add_decoding(state, "i0", decoding)
    for _ in range(unstarted):
        add_pending(state, "i0", 16)
    assert state.view().batch_size.tolist() == [decoding + unstarted]  # no scrape yet
    queued = min(queued, unstarted)  # how many of ours the engine still queues
    running = decoding + unstarted - queued + others
    state.on_scrape("i0", 1.0, running=running, waiting=queued)
    # A scrape consistent with the truth reproduces the engine's running count.
    assert state.view().batch_size.tolist() == [running]
    assert state.view().external_running.tolist() == [others]
    # Any scrape, however stale or low, without a waiting count leaves at least
    # everything this router has in flight.
    state.on_scrape("i0", 2.0, running=max(running - stale_drop, 0), waiting=0)
    assert state.view().batch_size[0] >= decoding + unstarted
