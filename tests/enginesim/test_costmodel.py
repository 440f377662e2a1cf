"""Sanity ranges and shape of the roofline cost model (fitted calibration)."""

import numpy as np
import pytest

from enginesim.engine import GPUS, MODELS, CostModel, EngineConfig, StepBatch


@pytest.fixture(scope="module")
def h20_qwen2():
    return CostModel("h20", "qwen2-7b")


def test_single_stream_decode_step_on_h20_is_4_to_8_ms(h20_qwen2):
    for context in (128, 2048, 8192):
        assert 0.004 <= h20_qwen2.step_time(StepBatch.decode(1, context)) <= 0.008


def test_uncached_8k_prefill_on_h20_takes_1_to_2_s(h20_qwen2):
    chunk = EngineConfig.for_hardware("h20", "qwen2-7b").max_num_batched_tokens
    assert 1.0 <= h20_qwen2.prefill_time(8192, chunk=chunk) <= 2.0


def test_step_time_grows_with_batch_and_context(h20_qwen2):
    by_batch = [h20_qwen2.step_time(StepBatch.decode(b, 1024)) for b in (1, 8, 64, 256)]
    by_context = [h20_qwen2.step_time(StepBatch.decode(32, c)) for c in (256, 4096, 16384)]
    assert np.all(np.diff(by_batch) > 0)
    assert np.all(np.diff(by_context) > 0)


def test_prefill_is_compute_bound_and_decode_memory_bound(h20_qwen2):
    prefill = h20_qwen2.cost(StepBatch.prefill(4096))
    decode = h20_qwen2.cost(StepBatch.decode(1, 1024))
    assert prefill.compute_time > prefill.memory_time
    assert decode.memory_time > decode.compute_time


def test_moe_reads_more_weight_bytes_as_the_batch_grows():
    moe = CostModel("h100", "qwen3-30b-a3b")
    weights = [float(moe.cost(StepBatch.decode(b, 512)).weight_bytes) for b in (1, 2, 8, 32, 128)]
    assert np.all(np.diff(weights) > 0)
    moe_spec = MODELS["qwen3-30b-a3b"]
    all_experts = moe_spec.weight_bytes() - 2 * moe_spec.lm_head_params  # minus embedding
    assert weights[0] < 0.2 * all_experts  # one token touches 8 of 128 experts per layer
    assert weights[-1] == pytest.approx(all_experts, rel=0.05)
    dense = CostModel("h100", "qwen3-8b")
    dense_weights = [dense.cost(StepBatch.decode(b, 512)).weight_bytes for b in (1, 128)]
    assert dense_weights[0] == dense_weights[1]


def test_vectorised_decode_times_match_single_steps(h20_qwen2):
    times = h20_qwen2.decode_step_times(num_seqs=5, context_tokens=5 * 700, num_steps=40)
    single = [h20_qwen2.step_time(StepBatch.decode(5, 700 + k)) for k in range(40)]
    np.testing.assert_allclose(times, single, rtol=1e-12)


def test_fp8_weights_speed_up_decode_on_h100():
    bf16 = CostModel("h100", "qwen3-8b").step_time(StepBatch.decode(1, 256))
    fp8 = CostModel("h100", "qwen3-8b", dtype="fp8").step_time(StepBatch.decode(1, 256))
    assert fp8 < 0.8 * bf16


@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_pair_prices_steps_and_sizes_its_kv(gpu, model):
    cost = CostModel(gpu, model)
    assert 0 < cost.step_time(StepBatch.decode(4, 1000)) < cost.step_time(StepBatch.prefill(4096))
    weights = MODELS[model].weight_bytes()
    if weights < 0.85 * GPUS[gpu].memory_bytes:
        assert EngineConfig.for_hardware(gpu, model).num_gpu_blocks > 0


@pytest.mark.parametrize(("export", "sister"), [("h800", "h100"), ("a800", "a100")])
def test_export_parts_price_a_step_as_their_sister_chip(export, sister):
    """H800 and A800 are H100 and A100 with a narrower NVLink, which one GPU never uses: the
    datasheets give the same memory, bandwidth and tensor throughput, so every step costs
    the same."""
    for step in (StepBatch.decode(8, 2000), StepBatch.prefill(4096)):
        assert CostModel(export, "qwen2.5-14b").step_time(step) == pytest.approx(
            CostModel(sister, "qwen2.5-14b").step_time(step)
        )


def test_an_a800_takes_vllms_large_gpu_defaults_unlike_an_a100():
    """vLLM picks 8192 batched tokens / 1024 sequences on GPUs of >= 70 GiB unless "a100" is
    in the device name: an A800 ("NVIDIA A800-SXM4-80GB") gets the large defaults, so the
    same memory holds fewer KV blocks than on an A100, which gets 2048 / 256."""
    a800 = EngineConfig.for_hardware("a800", "qwen2.5-14b")
    a100 = EngineConfig.for_hardware("a100", "qwen2.5-14b")
    assert (a800.max_num_batched_tokens, a800.max_num_seqs) == (8192, 1024)
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    assert 0 < a800.num_gpu_blocks < a100.num_gpu_blocks


def test_a_14b_model_reads_twice_the_weights_of_a_7b_per_decode_step():
    """Qwen2.5-14B (hf config: 48 layers, hidden 5120, MLP 13824, 8 KV heads) has about
    14.7B parameters against Qwen2.5-7B's 7.6B, so a small decode batch, bound by reading
    the weights, takes roughly twice as long on the same GPU."""
    assert 14.0e9 < MODELS["qwen2.5-14b"].total_params < 15.5e9
    small = CostModel("h20", "qwen2.5-7b").step_time(StepBatch.decode(1, 256))
    large = CostModel("h20", "qwen2.5-14b").step_time(StepBatch.decode(1, 256))
    assert 1.6 < large / small < 2.2
