"""``decode_room``: the decode stage's policy, smallest batch among instances with KV room."""

from router_worker.routing import make_policy

from .helpers import add_decoding, cluster, features, tokens


def test_smallest_batch_wins():
    state = cluster(3)
    add_decoding(state, "i0", 4)
    add_decoding(state, "i1", 1)
    add_decoding(state, "i2", 3)
    decision = make_policy("decode_room").decide(features(tokens(0, 320)), state.view(), 0.0)
    assert decision.instance_id == "i1"
    assert decision.score_table() == {"i0": 4, "i1": 1, "i2": 3}


def test_an_instance_without_room_for_the_prompt_is_passed_over():
    state = cluster(2, capacity_blocks=1000)
    add_decoding(state, "i1", 2)
    state.on_scrape("i0", 1.0, kv_usage=0.97)  # 30 blocks free, minus 5% headroom: none
    state.on_scrape("i1", 1.0, kv_usage=0.10)
    decision = make_policy("decode_room").decide(features(tokens(0, 320)), state.view(), 1.0)
    assert decision.instance_id == "i1"  # a bigger batch, but the prompt's 20 blocks fit


def test_when_none_has_room_the_batch_decides_and_ties_go_to_more_room():
    state = cluster(2, capacity_blocks=100)
    state.on_scrape("i0", 1.0, kv_usage=0.96)
    state.on_scrape("i1", 1.0, kv_usage=0.90)
    policy = make_policy("decode_room")
    decision = policy.decide(features(tokens(0, 16_000)), state.view(), 1.0)
    assert decision.instance_id == "i1"  # equal batches: the tie goes to more free KV
