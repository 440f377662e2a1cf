"""Fleets whose instances are unlike each other and unlike the policies' cost model:
speeds, mixed GPUs, per-step jitter, perturbed coefficients (enginesim.engine.fleet), in
the engine, the replay simulator and the HTTP server."""

from __future__ import annotations

import argparse

import httpx
import numpy as np
import pytest

import engine_interface as ei
from engine_interface import read_samples, sample_total
from enginesim.engine import EngineConfig, EngineCore, FleetVariation, StepBatch
from enginesim.engine.fleet import StepJitter, instance_hardware, parse_per_instance, parse_speed
from enginesim.replay.policy_costs import derive_coefficients
from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.traces import TraceRecord
from enginesim.server import cli as server_cli

GPU, MODEL = "h20", "qwen2-7b"
SERVED = "Qwen/Qwen2-7B-Instruct"


def nominal() -> EngineConfig:
    return EngineConfig.for_hardware(GPU, MODEL)


def token_times(config: EngineConfig, prompt: int, tokens: int, fast_forward: bool = True):
    """The token times of one request alone on an idle engine, arriving at 0."""
    engine = EngineCore(config, fast_forward=fast_forward)
    engine.add_request("r", np.arange(prompt) % 30_000, tokens, now=0.0)
    times: list[float] = []
    while (t := engine.next_event_time()) is not None:
        for out in engine.advance_to(t, per_token=True):
            if out.token_times is not None:
                times.extend(out.token_times.tolist())
    return np.array(times)


def step_durations(config: EngineConfig, prompt: int, tokens: int) -> np.ndarray:
    """Each step's duration: the prefill step (from the request's admission), then the
    decode steps."""
    times = token_times(config, prompt, tokens)
    ready = config.calibration.t_request
    return np.diff(np.concatenate([[ready], times]))


def nominal_durations(prompt: int, tokens: int) -> np.ndarray:
    cost = nominal().cost_model()
    prefill = cost.step_time(StepBatch.prefill(prompt))
    return np.concatenate([[prefill], cost.decode_step_times(1, prompt, tokens - 1)])


# ----------------------------------------------------------------- speed


def test_a_half_speed_instance_takes_twice_the_cost_models_time_for_every_step():
    prompt, tokens = 3000, 40
    expected = nominal_durations(prompt, tokens)
    np.testing.assert_allclose(step_durations(nominal(), prompt, tokens), expected, rtol=1e-9)
    half = EngineConfig.for_hardware(GPU, MODEL, speed=0.5)
    np.testing.assert_allclose(step_durations(half, prompt, tokens), 2 * expected, rtol=1e-9)


def test_speed_does_not_scale_the_per_request_overhead():
    half = EngineConfig.for_hardware(GPU, MODEL, speed=0.5)
    first = token_times(half, 100, 1)[0]
    step = nominal().cost_model().step_time(StepBatch.prefill(100))
    assert first == pytest.approx(half.calibration.t_request + 2 * step, rel=1e-12)


# ----------------------------------------------------------------- jitter


def jitter_ratios(config: EngineConfig, tokens: int = 3001) -> np.ndarray:
    return step_durations(config, 200, tokens) / nominal_durations(200, tokens)


def test_jitter_has_the_configured_spread_and_mean_one():
    sigma = 0.3
    (config,) = FleetVariation(step_jitter=sigma, seed=4).engine_configs(1, GPU, MODEL)
    logs = np.log(jitter_ratios(config))
    assert np.std(logs) == pytest.approx(sigma, rel=0.05)
    assert np.mean(np.exp(logs)) == pytest.approx(1.0, abs=0.03)


def test_jitter_is_deterministic_by_seed_and_independent_per_instance():
    def ratios(seed: int) -> list[np.ndarray]:
        configs = FleetVariation(step_jitter=0.2, seed=seed).engine_configs(2, GPU, MODEL)
        return [jitter_ratios(c, 300) for c in configs]

    first, again, other = ratios(7), ratios(7), ratios(8)
    for mine, same in zip(first, again, strict=True):
        np.testing.assert_array_equal(mine, same)
    assert not np.allclose(first[0], first[1])  # instances draw their own factors
    assert not np.allclose(first[0], other[0])  # another seed, other factors


def test_a_steps_jitter_does_not_depend_on_how_the_engine_is_advanced():
    """The replay skips decode stretches, the server walks step by step: same factors."""
    (config,) = FleetVariation(step_jitter=0.25, seed=2).engine_configs(1, GPU, MODEL)
    stretched = token_times(config, 500, 200, fast_forward=True)
    stepped = token_times(config, 500, 200, fast_forward=False)
    np.testing.assert_allclose(stretched, stepped, rtol=1e-12)


def test_step_jitter_factors_are_a_function_of_the_step_number():
    one, other = StepJitter(0.1, 3), StepJitter(0.1, 3)
    whole = one.factors(0, 10_000)
    assert other.factors(9_000, 5).tolist() == whole[9_000:9_005].tolist()
    assert other.factor(9_999) == whole[9_999]


# ----------------------------------------------------------------- perturbed coefficients


COEFFICIENTS = ("t_fixed", "t_per_seq", "t_request", "eta_moe")


def coefficients(config: EngineConfig) -> np.ndarray:
    cal = config.calibration
    eff = cal.efficiency(config.gpu)
    own = [getattr(cal, name) for name in COEFFICIENTS]
    return np.array([*own, eff.eta_compute, eff.eta_memory, eff.eta_compute_fp8])


def test_perturbed_instances_differ_from_each_other_and_from_the_nominal_model():
    configs = FleetVariation(perturb=0.2, seed=1).engine_configs(4, GPU, MODEL)
    base = coefficients(nominal())
    factors = np.array([coefficients(c) / base for c in configs])
    assert np.all((factors >= 0.8) & (factors <= 1.2))
    assert np.all(np.abs(factors - 1) > 1e-6)  # every coefficient of every instance moved
    assert len({tuple(row) for row in factors.round(9)}) == 4
    batch = StepBatch.prefill(4000)
    times = [c.cost_model().step_time(batch) for c in configs]
    assert len(set(times)) == 4 and nominal().cost_model().step_time(batch) not in times
    recorded = instance_hardware(configs[0])["coefficients"].values()
    assert {type(v) for v in recorded} == {float}  # plain floats, as results.json needs
    again = FleetVariation(perturb=0.2, seed=1).engine_configs(4, GPU, MODEL)
    assert [c.calibration for c in again] == [c.calibration for c in configs]


def test_policies_keep_the_nominal_coefficients_in_a_varied_fleet():
    variation = FleetVariation(
        gpus=("h20", "h100", "h20"), speeds=(1.0, 1.0, 0.5), perturb=0.2, step_jitter=0.1
    )
    sim = Simulator([TraceRecord(0, 0.0, 100, 4)], "predicted_ttft", SimConfig(3, GPU, MODEL))
    varied = Simulator(
        [TraceRecord(0, 0.0, 100, 4)],
        "predicted_ttft",
        SimConfig(3, GPU, MODEL, variation=variation),
    )
    told = {name: getattr(varied.policy.params, name) for name in derive_coefficients(GPU, MODEL)}
    assert told == derive_coefficients(GPU, MODEL)
    assert varied.policy.params == sim.policy.params
    assert varied.engine_config == sim.engine_config  # the nominal engine
    assert varied.engine_configs[1].gpu.key == "h100"


# ----------------------------------------------------------------- mixed GPUs


def test_a_mixed_fleet_has_each_gpus_kv_capacity_engine_and_router_view():
    variation = FleetVariation(gpus=("h20", "h20", "h100", "a100"))
    config = SimConfig(4, GPU, MODEL, variation=variation)
    sim = Simulator([TraceRecord(0, 0.0, 100, 4)], "round_robin", config)
    blocks = [e.config.num_gpu_blocks for e in (i.engine for i in sim.instances) if e]
    expected = [EngineConfig.for_hardware(g, MODEL).num_gpu_blocks for g in variation.gpus]
    assert blocks == expected and blocks[0] > blocks[2] > 0
    assert sim.instances[3].engine is not None
    assert sim.instances[3].engine.config.max_num_batched_tokens == 2048  # vLLM's A100 default
    assert sim.state.view().capacity_blocks.tolist() == expected  # router block size 16
    fleet = sim.run().fleet
    assert fleet is not None and fleet["nominal_gpu"] == GPU
    assert [i["gpu"] for i in fleet["instances"]] == list(variation.gpus)
    assert [i["num_gpu_blocks"] for i in fleet["instances"]] == expected


def test_a_uniform_fleet_shares_one_engine_config_and_records_no_fleet():
    configs = FleetVariation().engine_configs(3, GPU, MODEL)
    assert configs[0] is configs[1] is configs[2]
    assert FleetVariation(gpus=(GPU,) * 3, speeds=(1.0,) * 3).varies(GPU) is False
    sim = Simulator([TraceRecord(0, 0.0, 100, 4)], "round_robin", SimConfig(3))
    assert sim.run().fleet is None


def test_a_slow_instance_answers_slower_in_a_replay():
    """Round robin over two idle instances, one at half speed: same prompts, the slow
    one's prefill takes twice as long."""
    records = [TraceRecord(k, 10.0 * k, 2000, 2) for k in range(4)]
    config = SimConfig(2, GPU, MODEL, variation=FleetVariation(speeds=(1.0, 0.5)))
    results = Simulator(records, "round_robin", config).run().requests
    overhead = nominal().calibration.t_request
    by_instance: dict[str, list[float]] = {}
    for r in results:
        assert r.first_token_s is not None and r.instance is not None
        by_instance.setdefault(r.instance, []).append(r.first_token_s - r.arrival_s - overhead)
    fast, slow = np.array(by_instance["i0"]), np.array(by_instance["i1"])
    np.testing.assert_allclose(slow, 2 * fast, rtol=1e-9)


# ----------------------------------------------------------------- bad specs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,fast", "speed 'fast' is not a number"),
        ("1,0", "speed must be a positive number, got '0'"),
        ("-1@2", "speed must be a positive number, got '-1'"),
        ("nan@2", "got 'nan'"),
        ("0.5@x", "'x' is not an instance"),
        ("0.5@3-1", "bad instance range '3-1'"),
        ("1,0.5@2", "mixes plain values and VALUE@INSTANCES"),
        ("1,,1", "empty entry"),
    ],
)
def test_bad_speed_specs_name_the_offending_value(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_per_instance("--speeds", text, parse_speed)


@pytest.mark.parametrize(
    ("text", "instances", "message"),
    [
        ("1,1,0.5", 4, "--speeds: 3 values for 4 instances"),
        ("0.5@4", 4, "--speeds: instance 4 does not exist; the fleet has 4 .0-3."),
        ("0.5@1-2,2@2", 4, "--speeds: instance 2 is given twice"),
    ],
)
def test_speed_specs_that_do_not_fit_the_fleet_are_refused(text, instances, message):
    spec = parse_per_instance("--speeds", text, parse_speed)
    with pytest.raises(ValueError, match=message):
        spec.resolve(instances, 1.0)


def test_compact_and_positional_specs_agree():
    compact = parse_per_instance("--speeds", "0.5@3,2@0-1", parse_speed).resolve(4, 1.0)
    positional = parse_per_instance("--speeds", "2,2,1,0.5", parse_speed).resolve(4, 1.0)
    assert compact == positional == (2.0, 2.0, 1.0, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speeds": (1.0, 0.0)}, "speed must be a positive number, got 0.0"),
        ({"gpus": ("h20", "x100")}, "unknown GPU 'x100'"),
        ({"step_jitter": -0.1}, "step_jitter must be >= 0, got -0.1"),
        ({"perturb": 1.0}, r"perturb must be in \[0, 1\), got 1.0"),
    ],
)
def test_a_bad_variation_is_a_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FleetVariation(**kwargs)


def test_a_variation_for_another_fleet_size_is_refused_by_the_simulator_config():
    with pytest.raises(ValueError, match="speeds: 2 entries for 4 instances"):
        SimConfig(instances=4, variation=FleetVariation(speeds=(1.0, 0.5)))


def test_a_model_that_does_not_fit_a_mixed_gpu_is_refused():
    with pytest.raises(ValueError, match="does not fit on l40s"):
        FleetVariation(gpus=("h20", "l40s")).engine_configs(2, GPU, "qwen3-32b")


# ----------------------------------------------------------------- serve


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_serve_builds_each_instance_on_its_own_engine():
    args = serve_args("--instances", "3", "--speeds", "0.5@1", "--mixed-gpu", "h100@2")
    instances = server_cli.build_instances(args)
    configs = [inst.engine_config for inst in instances]
    assert [c.gpu.key for c in configs] == ["h20", "h20", "h100"]
    assert [c.speed for c in configs] == [1.0, 0.5, 1.0]
    assert [inst.engine.config for inst in instances] == configs
    assert (
        instances[2].cache_info()["num_gpu_blocks"] != instances[0].cache_info()["num_gpu_blocks"]
    )


def test_serve_and_replay_build_the_same_engines_from_the_same_flags():
    flags = ["--speeds", "0.5@1", "--mixed-gpu", "h100@2", "--step-jitter", "0.1"]
    flags += ["--perturb", "0.2", "--fleet-seed", "9"]
    served = server_cli.build_instances(serve_args("--instances", "3", *flags))
    replay = SimConfig(
        3, GPU, MODEL, variation=FleetVariation((GPU, GPU, "h100"), (1.0, 0.5, 1.0), 0.1, 0.2, 9)
    ).engine_configs(None)
    assert [inst.engine_config for inst in served] == replay
    assert len({c.jitter_seed for c in replay}) == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--instances", "2", "--speeds", "1,1,1"), "--speeds: 3 values for 2 instances"),
        (("--instances", "2", "--mixed-gpu", "h100@5"), "--mixed-gpu: instance 5 does not exist"),
        (("--instances", "2", "--perturb", "-0.2"), r"--perturb must be in \[0, 1\), got -0.2"),
        (("--instances", "2", "--model", "qwen3-32b", "--mixed-gpu", "l40s@1"), "does not fit"),
    ],
)
def test_serve_refuses_a_variation_that_does_not_fit(argv, message):
    with pytest.raises(SystemExit, match=message):
        server_cli.build_instances(serve_args(*argv))


def test_serve_flag_syntax_errors_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--speeds", "1,slow")
    assert exit_info.value.code == 2
    assert "argument --speeds: speed 'slow' is not a number" in capsys.readouterr().err


def ttft_sum(url: str) -> float:
    samples, _ = read_samples(httpx.get(url + "/metrics").text)
    return sample_total(samples, ei.TTFT.name + "_sum", model_name=SERVED, engine="0")


def test_a_half_speed_served_instance_answers_twice_as_slowly(sim_factory):
    """One lone request per instance: TTFT in simulated seconds is the per-request overhead
    plus the prefill step, which the half-speed instance takes twice as long over."""
    server = sim_factory("--speeds", "0.5@1", "--mixed-gpu", "h100@2", instances=3, kv_events=False)
    hardware = [httpx.get(server.url(k) + "/admin/hardware").json() for k in range(3)]
    assert [(h["gpu"], h["speed"]) for h in hardware] == [("h20", 1), ("h20", 0.5), ("h100", 1)]
    assert hardware[2]["num_gpu_blocks"] != hardware[0]["num_gpu_blocks"]
    body = {"model": SERVED, "prompt": list(range(1000, 3000)), "max_tokens": 2}
    for k in (0, 1):
        assert (
            httpx.post(server.url(k) + "/v1/completions", json=body, timeout=30).status_code == 200
        )
    overhead = hardware[0]["coefficients"]["t_request"]
    fast, slow = (ttft_sum(server.url(k)) - overhead for k in (0, 1))
    step = nominal().cost_model().step_time(StepBatch.prefill(2000))
    assert fast == pytest.approx(step, rel=1e-6)
    assert slow == pytest.approx(2 * step, rel=1e-6)
