"""Fleets whose instances are not all alike, nor what the routing policies are told.

Without variation every instance of a fleet is the same engine and behaves exactly as the
cost model the policies are given (``predicted_ttft``'s coefficients come from it). A
``FleetVariation`` departs from that in four independent ways, one per knob:

* ``gpus``: instances on another GPU than the fleet's nominal one (same model). Each gets
  its own ``EngineConfig``: KV capacity, batched-token and sequence budgets (vLLM's
  defaults for that GPU) and step costs.
* ``speeds``: a factor per instance against its cost model; 0.5 makes every step's GPU
  time twice as long (``CostModel.speed``). The per-request API overhead (``t_request``)
  and global-tier transfers are not GPU time and are not scaled.
* ``step_jitter``: each step's GPU time multiplied by its own lognormal factor with mean
  1 and log-sd ``step_jitter`` (``StepJitter``), from a generator per instance.
* ``perturb``: each calibrated coefficient of an instance's cost model (``t_fixed``,
  ``t_per_seq``, ``t_request``, ``eta_moe`` and its GPU's ``eta_compute``,
  ``eta_compute_fp8``, ``eta_memory``) scaled by its own factor drawn uniformly in
  [1 - perturb, 1 + perturb]. Efficiencies may then exceed 1: the factors stand for the
  fitted model's error, not for the hardware.

What is told to whom: the policies' cost coefficients stay those of the nominal GPU's
unperturbed engine at speed 1 (``enginesim.replay.policy_costs``); the policies are
deliberately mis-modelled. Each instance's KV capacity is its own, as a live router
reads it from the instance's ``/metrics``.

Randomness comes from ``seed`` only, per instance and per knob
(``numpy.random.SeedSequence([seed, instance, knob])``), so one instance's draws do not
depend on the fleet's size or on the other knobs. A step's jitter factor is a function
of the step's number in its engine, not of how the caller advanced the engine (the
replay's lazy wakes and the server's real-time loop draw the same factors).

On the command line (``add_arguments``, shared by ``replay`` and ``serve``), a
per-instance value is either one value per instance (``1,1,1,0.5``) or ``VALUE@INSTANCES``
entries, the others keeping the default (``0.5@3``, ``h100@8-15``, ``2@0,0.5@2-3``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import numpy as np

from enginesim.engine.config import EngineConfig
from enginesim.engine.costmodel import Calibration, GPUEfficiency, load_calibration
from enginesim.engine.hardware import GPUS, GPUSpec

T = TypeVar("T")
JITTER_KNOB, PERTURB_KNOB = 1, 2  # the third word of each instance's seed sequence
JITTER_BLOCK = 4096  # factors drawn at a time


# ----------------------------------------------------------------- per-instance values


@dataclass(frozen=True)
class PerInstance(Generic[T]):
    """A per-instance value as written: one per instance, or ``VALUE@INSTANCES``
    assignments (``assigned``: first instance, last instance, value)."""

    flag: str
    positional: tuple[T, ...] = ()
    assigned: tuple[tuple[int, int, T], ...] = ()

    def resolve(self, instances: int, default: T) -> tuple[T, ...]:
        """One value per instance; ValueError naming the flag and the offending entry."""
        if self.positional:
            if len(self.positional) != instances:
                raise ValueError(
                    f"{self.flag}: {len(self.positional)} values for {instances} instances; "
                    f"give one per instance or VALUE@INSTANCES entries"
                )
            return self.positional
        values: list[T] = [default] * instances
        given: set[int] = set()
        for first, last, value in self.assigned:
            if last >= instances:
                raise ValueError(
                    f"{self.flag}: instance {last} does not exist; the fleet has "
                    f"{instances} (0-{instances - 1})"
                )
            for index in range(first, last + 1):
                if index in given:
                    raise ValueError(f"{self.flag}: instance {index} is given twice")
                given.add(index)
                values[index] = value
        return tuple(values)


def parse_per_instance(flag: str, text: str, convert: Callable[[str], T]) -> PerInstance[T]:
    """``"1,1,0.5"`` or ``"0.5@3,2@0-1"``; ValueError on a bad entry, naming it."""
    entries = [entry.strip() for entry in text.split(",")]
    if not text.strip() or "" in entries:
        raise ValueError(f"{flag}: empty entry in {text!r}")
    with_at = [entry for entry in entries if "@" in entry]
    if not with_at:
        return PerInstance(flag, positional=tuple(convert(entry) for entry in entries))
    if len(with_at) != len(entries):
        raise ValueError(
            f"{flag}: {text!r} mixes plain values and VALUE@INSTANCES entries; use one form"
        )
    assigned = []
    for entry in entries:
        value, _, where = entry.partition("@")
        first, last = _instance_range(flag, where)
        assigned.append((first, last, convert(value.strip())))
    return PerInstance(flag, assigned=tuple(assigned))


def _instance_range(flag: str, text: str) -> tuple[int, int]:
    """``"3"`` → (3, 3), ``"8-15"`` → (8, 15); an ``i`` prefix (``i3``) is allowed."""
    low, dash, high = text.strip().partition("-")
    try:
        first = int(low.strip().removeprefix("i"))
        last = int(high.strip().removeprefix("i")) if dash else first
    except ValueError:
        raise ValueError(
            f"{flag}: {text!r} is not an instance or range of instances (3, 8-15)"
        ) from None
    if first < 0 or last < first:
        raise ValueError(f"{flag}: bad instance range {text!r}")
    return first, last


def parse_speed(text: str) -> float:
    try:
        speed = float(text)
    except ValueError:
        raise ValueError(f"speed {text!r} is not a number") from None
    if not (0 < speed < math.inf):
        raise ValueError(f"speed must be a positive number, got {text!r}")
    return speed


def parse_gpu(text: str) -> str:
    key = text.strip().lower()
    if key not in GPUS:
        raise ValueError(f"unknown GPU {text!r} (known: {', '.join(sorted(GPUS))})")
    return key


# ----------------------------------------------------------------- the variation


@dataclass(frozen=True)
class FleetVariation:
    """How a fleet's instances depart from its nominal engine (module docstring).

    ``gpus`` and ``speeds`` hold one entry per instance, or nothing (all nominal);
    the default value varies nothing.
    """

    gpus: tuple[str, ...] = ()
    speeds: tuple[float, ...] = ()
    step_jitter: float = 0.0
    perturb: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for gpu in self.gpus:
            parse_gpu(gpu)
        for speed in self.speeds:
            if not (0 < speed < math.inf):
                raise ValueError(f"speeds: speed must be a positive number, got {speed}")
        if not (0 <= self.step_jitter < math.inf):
            raise ValueError(f"step_jitter must be >= 0, got {self.step_jitter}")
        if not (0 <= self.perturb < 1):
            raise ValueError(f"perturb must be in [0, 1), got {self.perturb}")

    def check(self, instances: int) -> None:
        """ValueError unless the per-instance entries match a fleet of ``instances``."""
        for name, values in (("gpus", self.gpus), ("speeds", self.speeds)):
            if values and len(values) != instances:
                raise ValueError(f"{name}: {len(values)} entries for {instances} instances")

    def varies(self, gpu: str) -> bool:
        """Whether a fleet of nominal GPU ``gpu`` under this variation is not uniform."""
        gpu = gpu.strip().lower()
        return (
            any(g != gpu for g in self.gpus)
            or any(s != 1.0 for s in self.speeds)
            or self.step_jitter > 0
            or self.perturb > 0
        )

    def engine_configs(
        self, instances: int, gpu: str, model: str, **common: Any
    ) -> list[EngineConfig]:
        """One EngineConfig per instance. ``common``: EngineConfig fields every instance
        shares (max_model_len, global_tier, ...). A uniform fleet shares one object."""
        self.check(instances)
        if not self.varies(gpu):
            return [EngineConfig.for_hardware(gpu, model, **common)] * instances
        return [self._instance_config(k, gpu, model, common) for k in range(instances)]

    def _instance_config(
        self, index: int, gpu: str, model: str, common: dict[str, Any]
    ) -> EngineConfig:
        own_gpu = self.gpus[index] if self.gpus else gpu
        extra: dict[str, Any] = {"speed": self.speeds[index] if self.speeds else 1.0}
        if self.step_jitter > 0:
            extra["step_jitter"] = self.step_jitter
            extra["jitter_seed"] = int(self._seed_sequence(index, JITTER_KNOB).generate_state(1)[0])
        if self.perturb > 0:
            calibration = common.get("calibration") or load_calibration()
            extra["calibration"] = self._perturbed(index, calibration, GPUS[own_gpu])
        return EngineConfig.for_hardware(own_gpu, model, **{**common, **extra})

    def _seed_sequence(self, index: int, knob: int) -> np.random.SeedSequence:
        return np.random.SeedSequence([self.seed, index, knob])

    def _perturbed(self, index: int, calibration: Calibration, gpu: GPUSpec) -> Calibration:
        """The instance's calibration, each coefficient scaled by its own uniform factor
        (always seven draws in this order, so each coefficient's factor is stable)."""
        rng = np.random.default_rng(self._seed_sequence(index, PERTURB_KNOB))
        factors = rng.uniform(1 - self.perturb, 1 + self.perturb, size=7).tolist()
        eff = calibration.efficiency(gpu)
        fp8 = eff.eta_compute_fp8
        scaled = GPUEfficiency(
            eta_compute=eff.eta_compute * factors[0],
            eta_memory=eff.eta_memory * factors[1],
            eta_compute_fp8=None if fp8 is None else fp8 * factors[2],
        )
        return replace(
            calibration,
            gpus={**calibration.gpus, gpu.arch: scaled},
            t_fixed=calibration.t_fixed * factors[3],
            t_per_seq=calibration.t_per_seq * factors[4],
            t_request=calibration.t_request * factors[5],
            eta_moe=calibration.eta_moe * factors[6],
        )

    def describe(self, gpu: str) -> str:
        """One line for a run's header: what varies."""
        parts = []
        if any(g != gpu.strip().lower() for g in self.gpus):
            counts: dict[str, int] = {}
            for g in self.gpus:
                counts[g] = counts.get(g, 0) + 1
            parts.append("GPUs " + ", ".join(f"{n}× {g}" for g, n in counts.items()))
        slow = [f"{s:g}@{k}" for k, s in enumerate(self.speeds) if s != 1.0]
        if slow:
            parts.append("speeds " + ",".join(slow))
        if self.step_jitter > 0:
            parts.append(f"step jitter σ={self.step_jitter:g}")
        if self.perturb > 0:
            parts.append(f"coefficients ±{self.perturb:g}")
        seeded = self.step_jitter > 0 or self.perturb > 0
        return "; ".join(parts) + (f" (fleet seed {self.seed})" if seeded else "")


def instance_hardware(config: EngineConfig) -> dict[str, Any]:
    """What one instance runs on: for a run's results and the server's /admin/hardware."""
    cal = config.calibration
    eff = cal.efficiency(config.gpu)
    return {
        "gpu": config.gpu.key,
        "speed": config.speed,
        "step_jitter": config.step_jitter,
        "num_gpu_blocks": config.num_gpu_blocks,
        "kv_capacity_tokens": config.kv_capacity_tokens,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "coefficients": {
            "t_fixed": cal.t_fixed,
            "t_per_seq": cal.t_per_seq,
            "t_request": cal.t_request,
            "eta_moe": cal.eta_moe,
            "eta_compute": eff.eta_compute,
            "eta_compute_fp8": eff.eta_compute_fp8,
            "eta_memory": eff.eta_memory,
        },
    }


# ----------------------------------------------------------------- step jitter


@dataclass
class StepJitter:
    """Lognormal step-time factors of mean 1 and log-sd ``sigma``, by step number.

    ``factors(first, count)`` are those of steps first..first+count-1 of the engine; a
    step's factor depends only on the seed and its number. Step numbers asked for only
    grow (an engine never re-prices a committed step), so factors of steps before the
    first one asked are dropped.
    """

    sigma: float
    seed: int
    _rng: np.random.Generator = field(init=False, repr=False)
    _factors: np.ndarray = field(init=False, repr=False)
    _base: int = field(default=0, init=False)  # step number of _factors[0]

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._factors = np.empty(0)

    def factors(self, first: int, count: int) -> np.ndarray:
        need = first + count - self._base
        while len(self._factors) < need:  # in whole blocks: the same draws however asked
            normal = self._rng.standard_normal(JITTER_BLOCK)
            drawn = np.exp(self.sigma * normal - self.sigma**2 / 2)
            self._factors = np.concatenate([self._factors, drawn])
        if first - self._base >= JITTER_BLOCK:  # never asked again
            self._factors = self._factors[first - self._base :]
            self._base = first
        return self._factors[first - self._base : first + count - self._base]

    def factor(self, step: int) -> float:
        return float(self.factors(step, 1)[0])


# ----------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser, seed_default: str) -> None:
    """The fleet-variation flags of ``replay`` and ``serve`` (one definition for both)."""
    group = parser.add_argument_group(
        "fleet variation",
        "instances unlike each other and unlike the cost model the policies are given; "
        "--gpu stays the nominal GPU, whose unperturbed speed-1 engine the policies' cost "
        "coefficients describe",
    )
    add = group.add_argument
    add(
        "--mixed-gpu",
        type=argtype("--mixed-gpu", parse_gpu),
        default=None,
        metavar="GPU@INSTANCES",
        help="instances on another GPU than --gpu (same model), e.g. h100@8-15 or "
        "h100@0-3,a100@4; or one GPU per instance (h20,h20,h100,h100). Each has that GPU's "
        "KV capacity, batch budgets and step costs",
    )
    add(
        "--speeds",
        type=argtype("--speeds", parse_speed),
        default=None,
        metavar="SPEEDS",
        help="speed factor per instance: one per instance (1,1,1,0.5) or FACTOR@INSTANCES "
        "entries, the others 1 (0.5@3, 2@0-1,0.5@3); 0.5 = every step takes twice as long",
    )
    add(
        "--step-jitter",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="multiply each engine step's time by a seeded lognormal factor of mean 1 and "
        "log-sd SIGMA, drawn independently per instance (0 = off)",
    )
    add(
        "--perturb",
        type=float,
        default=0.0,
        metavar="F",
        help="scale each calibrated cost coefficient of each instance (t_fixed, t_per_seq, "
        "t_request, eta_compute, eta_compute_fp8, eta_memory, eta_moe) by its own seeded "
        "factor uniform in [1-F, 1+F]; the policies keep the nominal ones (0 = off)",
    )
    add(
        "--fleet-seed",
        type=int,
        default=None,
        help=f"seed of --step-jitter and --perturb (default: {seed_default})",
    )


def argtype(flag: str, convert: Callable[[str], T]) -> Callable[[str], PerInstance[T]]:
    """An argparse ``type`` that shows the parser's own message for a bad entry."""

    def parse(text: str) -> PerInstance[T]:
        try:
            return parse_per_instance(flag, text, convert)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{flag}: ")) from None

    parse.__name__ = flag
    return parse


def variation_from_args(
    args: argparse.Namespace, instances: int, gpu: str, seed: int
) -> FleetVariation:
    """The FleetVariation the flags describe; SystemExit with the offending value when it
    does not fit the fleet (a count or an instance out of range)."""
    gpu = gpu.strip().lower()
    try:
        return FleetVariation(
            gpus=_resolved(args.mixed_gpu, instances, gpu),
            speeds=_resolved(args.speeds, instances, 1.0),
            step_jitter=_checked(args.step_jitter, "--step-jitter", "must be >= 0"),
            perturb=_checked(args.perturb, "--perturb", "must be in [0, 1)", upper=1.0),
            seed=seed if args.fleet_seed is None else args.fleet_seed,
        )
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


def _resolved(spec: PerInstance[T] | None, instances: int, default: T) -> tuple[T, ...]:
    return () if spec is None else spec.resolve(instances, default)


def _checked(value: float, flag: str, rule: str, upper: float = math.inf) -> float:
    if not (0 <= value < upper):
        raise ValueError(f"{flag} {rule}, got {value:g}")
    return value


def distinct_engines(configs: Sequence[EngineConfig]) -> list[EngineConfig]:
    """The configs that differ in what a lone request's latency depends on (GPU, speed,
    calibration; not the jitter, whose mean is 1), first of each kind, in order."""
    distinct: list[EngineConfig] = []
    for config in configs:
        if not any(
            config.gpu == seen.gpu
            and config.speed == seen.speed
            and config.calibration == seen.calibration
            for seen in distinct
        ):
            distinct.append(config)
    return distinct
