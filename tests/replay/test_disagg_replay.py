"""The simulator runs the disaggregated flow the live router runs: the router's decider and
stage policies, the engine's transfer model (holds, reads over the link, releases)."""

from __future__ import annotations

import json

import pytest

from enginesim.engine import MODELS
from enginesim.replay import metrics
from enginesim.replay.simulator import Fault, SimConfig, Simulator
from enginesim.replay.traces import load_trace
from tests.replay.helpers import CONVERSATION

LONG = 131072
ROLES = ("prefill", "prefill", "decode", "decode", "both")
PREFILL_POOL, DECODE_POOL = {"i0", "i1", "i4"}, {"i2", "i3", "i4"}
KV_BYTES_PER_TOKEN = MODELS["qwen2-7b"].kv_bytes_per_token()


@pytest.fixture(scope="module")
def records():
    return load_trace(CONVERSATION, max_requests=120, rate_scale=2.0)


def run(records, decider="always", **config):
    sim = Simulator(
        records,
        "lmetric",
        SimConfig(
            instances=5, max_model_len=LONG, roles=ROLES, decider={"kind": decider}, **config
        ),
    )
    return sim, sim.run()


def test_always_splits_every_request_and_reads_its_kv(records):
    sim, result = run(records)
    assert result.disaggregation is not None
    assert result.disaggregation["split_ratio"] == 1.0
    total = 0
    for request in result.requests:
        assert request.status == "ok"
        assert request.stage == "decode"
        assert request.prefill_instance in PREFILL_POOL and request.instance in DECODE_POOL
        assert request.output_tokens == request.output_tokens_asked  # nothing doubled
        # What the decode side read is what it did not hold of all but the last token.
        assert 0 <= request.transfer_bytes <= (request.prompt_tokens - 1) * KV_BYTES_PER_TOKEN
        assert request.transfer_bytes % KV_BYTES_PER_TOKEN == 0
        total += request.transfer_bytes
    assert total == result.disaggregation["transfer_bytes"] > 0
    # Every hold was read and released: no prefill engine keeps blocks for a reader.
    for instance in sim.instances:
        assert instance.engine is not None and not instance.engine.held


def test_never_keeps_every_request_on_the_decode_pool(records):
    _, result = run(records, decider="never")
    assert result.disaggregation is not None
    assert result.disaggregation["split_ratio"] == 0.0
    assert result.disaggregation["transfer_bytes"] == 0
    assert all(r.stage == "whole" and r.instance in DECODE_POOL for r in result.requests)


def test_the_cost_decider_splits_some_and_the_summary_says_so(records):
    _, result = run(records, decider="cost")
    summary = metrics.summarize(result)
    share = summary["disaggregation"]["split_ratio"]
    split = sum(r.stage == "decode" for r in result.requests)
    assert share == split / len(result.requests)
    assert all(r.status == "ok" for r in result.requests)


def test_same_seed_same_results(records):
    first = [json.dumps(r.to_json()) for r in run(records, decider="cost")[1].requests]
    second = [json.dumps(r.to_json()) for r in run(records, decider="cost")[1].requests]
    assert first == second


def test_a_prefill_instance_failing_sends_its_queued_prefills_elsewhere(records):
    _, result = run(records, faults=(Fault(5.0, 0, "fail"),))
    assert all(r.status == "ok" for r in result.requests)  # prefills never stream
    retried = [r for r in result.requests if r.attempts == 3]  # prefill, retry, decode
    assert retried and all(r.prefill_instance in {"i1", "i4"} for r in retried)
    for r in result.requests:
        if r.arrival_s > 5.0:
            assert r.prefill_instance != "i0"


def test_without_roles_requests_carry_no_disaggregation_fields(records):
    result = Simulator(records[:20], "lmetric", SimConfig(instances=2, max_model_len=LONG)).run()
    assert result.disaggregation is None
    assert all("stage" not in r.to_json() for r in result.requests)


def test_roles_that_leave_a_pool_empty_are_refused():
    with pytest.raises(ValueError, match="needs a prefill and a decode pool"):
        SimConfig(instances=2, roles=("decode", "decode"))
