"""Prefill/decode disaggregation in the engine core (virtual time): a prefill holds its
blocks for the decode instance's read, the decode instance reserves room, reads over its
link, then decodes; holds and reservations time out."""

import numpy as np
import pytest

from enginesim.engine import BlockStored, EngineConfig, EngineCore, KVEvent, RequestOutput
from enginesim.engine.transfer import LINKS, LinkQueue, get_link

BS = 16


def engine(sink=None, **overrides):
    return EngineCore(EngineConfig.for_hardware("h20", "qwen2-7b", **overrides), kv_event_sink=sink)


def drain(core, until=None):
    """Advance ``core`` event by event (up to ``until``); the outputs by request id."""
    outputs: dict[str, list[RequestOutput]] = {}
    while (t := core.next_event_time()) is not None and (until is None or t <= until):
        for out in core.advance_to(t):
            outputs.setdefault(out.req_id, []).append(out)
    return outputs


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 150_000, n)


def test_prefill_holds_its_blocks_until_released():
    core = engine()
    core.add_request("p", prompt(1000), 1, now=0.0, hold_kv=True)
    outs = drain(core, until=10.0)
    assert outs["p"][-1].finished and outs["p"][-1].num_output_tokens == 1
    blocks = -(-1000 // BS)
    assert core.held_block_ids("p") == list(range(blocks))
    assert core.held_tokens("p") == 1000
    stats = core.stats()
    assert stats.transfer.held_requests == 1 and stats.transfer.held_blocks == blocks
    assert stats.kv_usage == pytest.approx(blocks / stats.num_gpu_blocks)
    assert core.release_held("p", now=11.0)
    assert not core.release_held("p", now=11.0)  # once
    assert core.stats().kv_usage == 0.0 and core.stats().transfer.held_requests == 0


def test_without_hold_the_blocks_are_freed_at_once():
    core = engine()
    core.add_request("p", prompt(1000), 1, now=0.0)
    drain(core)
    assert core.held_block_ids("p") is None and core.stats().kv_usage == 0.0


def test_a_hold_never_read_is_freed_by_the_timeout():
    core = engine(kv_hold_timeout=30.0)
    core.add_request("p", prompt(1000), 1, now=0.0, hold_kv=True)
    drain(core, until=29.0)
    assert core.held_block_ids("p") is not None
    drain(core)  # the hold's deadline is an engine event
    stats = core.stats()
    assert core.held_block_ids("p") is None
    assert stats.transfer.expired == 1 and stats.kv_usage == 0.0


@pytest.mark.parametrize("link", sorted(LINKS))
def test_decode_reads_the_prompt_over_its_link_then_decodes(link):
    events: list[KVEvent] = []
    core = engine(sink=events.extend, kv_link=link)
    core.add_request("d", prompt(2000), 50, now=1.0, remote_prefill=True)
    outs = drain(core)
    final = outs["d"][-1]
    kv_token = core.config.model.kv_bytes_per_token()
    pulled = 1999 * kv_token  # all but the last token, which the decode side computes
    stats = core.stats().transfer
    assert stats.transfers == 1 and stats.bytes == pulled
    spec = get_link(link)
    assert stats.seconds == pytest.approx(spec.transfer_time(pulled))
    ready = 1.0 + core.config.calibration.t_request
    assert final.first_token_time >= ready + spec.transfer_time(pulled)
    assert final.num_output_tokens == 50 and final.finish_reason == "length"
    assert final.num_cached_tokens == 1999
    assert core.take_landed() == [("d", pulled, pytest.approx(stats.seconds))]
    stored = sum(len(e.block_hashes) for e in events if isinstance(e, BlockStored))
    assert stored >= 1999 // BS  # the decode side publishes the blocks it read


def test_slower_links_make_later_first_tokens():
    ttft = {}
    for link in LINKS:
        core = engine(kv_link=link)
        core.add_request("d", prompt(4000), 2, now=0.0, remote_prefill=True)
        ttft[link] = drain(core)["d"][-1].first_token_time
    assert ttft["nvlink"] < ttft["rdma"] < ttft["tcp"]


def test_blocks_held_locally_are_not_read():
    core = engine()
    shared = prompt(1600, seed=1)
    core.add_request("warm", shared, 1, now=0.0)
    drain(core)
    full = np.concatenate([shared, prompt(400, seed=2)])
    core.add_request("d", full, 4, now=5.0, remote_prefill=True)
    drain(core)
    kv_token = core.config.model.kv_bytes_per_token()
    assert core.stats().transfer.bytes == (1999 - 1600) * kv_token


def test_reads_queue_on_the_link():
    queue = LinkQueue(LINKS["tcp"])
    first = queue.read(0.0, 10**9)
    second = queue.read(0.0, 10**9)
    per_gb = 10**9 / LINKS["tcp"].bandwidth
    assert first == pytest.approx(per_gb + LINKS["tcp"].latency)
    assert second == pytest.approx(2 * per_gb + LINKS["tcp"].latency)


def test_a_read_without_room_waits_then_times_out():
    core = engine(num_gpu_blocks=200, kv_hold_timeout=20.0)
    core.add_request("p", prompt(3000, seed=3), 1, now=0.0, hold_kv=True)  # 188 blocks held
    drain(core, until=1.0)
    core.add_request("d", prompt(1000, seed=4), 8, now=1.0, remote_prefill=True)
    drain(core, until=5.0)
    assert core.stats().transfer.transfers == 0  # no room: reserved nothing yet
    assert core.release_held("p", now=5.0)  # room appears: the read proceeds
    outs = drain(core)
    assert outs["d"][-1].finish_reason == "length"
    assert core.stats().transfer.transfers == 1

    core = engine(num_gpu_blocks=200, kv_hold_timeout=0.5)
    core.add_request("long", prompt(3000, seed=3), 150, now=0.0)  # runs past the timeout
    core.add_request("d", prompt(1000, seed=4), 8, now=0.1, remote_prefill=True)
    outs = drain(core)
    assert outs["d"][-1].finished and outs["d"][-1].finish_reason == "error"
    assert outs["d"][-1].finish_time == pytest.approx(0.6)
    assert outs["long"][-1].finish_time > 0.6
    assert core.stats().transfer.failed == 1


def test_aborting_a_read_frees_its_reservation():
    core = engine(kv_link="tcp")
    core.add_request("d", prompt(8000), 8, now=0.0, remote_prefill=True)
    drain(core, until=0.01)
    assert core.stats().kv_usage > 0  # reserved for the read under way
    assert core.abort("d", now=0.01)
    assert core.stats().kv_usage == 0.0 and not core.has_unfinished_requests()


def test_unknown_link_is_named():
    with pytest.raises(KeyError, match="unknown KV link 'carrier-pigeon'"):
        EngineConfig.for_hardware("h20", "qwen2-7b", kv_link="carrier-pigeon")
