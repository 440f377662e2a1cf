"""Grey failures: instances that are alive but slow, found from their latencies and routed
around.

An instance with a throttled GPU, a bad link or a noisy neighbour answers ``/health`` and
passes every breaker while it drags the fleet's tail. :class:`GreyDetector` finds it from
what the router measures of each request, as a *residual* against what was expected:

* TPOT (first to last token, per token) against what the cost model
  (:mod:`router_worker.routing.step_cost`) predicts for the steps the request decoded in:
  the decode step of the instance's running batch and its context tokens as the router
  counts them, at the request's first token and at its last, averaged; plus the prefill
  work the instance ran meanwhile (the uncached prompt tokens, and their attention, of the
  requests that reached their first token there between the request's first and last
  token, and the share of the prompt still in progress at its last token that was done by
  then, measured in time on the instance once that prompt's first token comes:
  :meth:`~router_worker.routing.indicators.ClusterState.prefill_progress`), spread over
  the request's tokens. With chunked prefill the engine runs those prompts' chunks in the
  same steps as the decodes, so an instance taking a burst of prompts decodes slower, and
  is expected to. A busier
  instance is expected to be slower, so a burst of load on one instance is no residual.
  Prompts another router sent (without replica sync) are not counted: the router does not
  see them. Only requests whose decode lasted ``min_decode_s`` or more are judged: a
  shorter one (few tokens, or an engine run at a compressed time scale) measures the
  router's own scheduling more than the engine;
* with ``use_ttft``, TTFT (dispatch to first token) against the prefill work queued ahead
  of the request on that instance when it was sent (its pending prefill, at the state's
  nominal prefill throughput): a rougher expectation, so a noisier residual.

Per instance and signal the residual is ``log(measured / expected)``, kept as a fast
moving average (``fast_alpha`` per sample). Each instance learns its own *normal*: a
baseline, the first ``warmup`` samples' mean, then a slow average (``baseline_alpha``)
fed only while the instance is healthy and not suspect, so a fleet that is heterogeneous
by design (mixed GPUs, one slower host) is not flagged, and a degradation is not learned as
normal. An instance's *excess* is its largest deviation from its baseline over the signals
minus the fleet's median deviation (a load swing that slows every instance flags none).

States, with hysteresis (enter above ``enter_ratio``, leave below ``exit_ratio``):

``healthy`` → ``suspect`` (excess over the enter ratio) → ``degraded`` once it persisted
``persist_s``: its weight drops to ``degraded_weight`` (it gets that share of the decisions
it would have been eligible for) → ``drained`` if still in excess ``drain_after_s`` later:
no traffic but a *probe*, one request every ``probe_interval_s``, each judged alone →
``healthy`` after ``restore_probes`` good probes in a row (a suspect instance whose excess
falls under the exit ratio is healthy again at once, a degraded one once it stayed under
it ``persist_s``).

It is a health input before any policy decides (:meth:`GreyDetector.excluded`, applied by
the request lifecycle with the instances that failed the request), so it works under
every policy, and the simulator runs the same object. An operator may override an
instance (:meth:`GreyDetector.override`): ``healthy`` (never flagged), ``drained``
(drained until the override is lifted) or ``auto``. Each change of state is a
:class:`GreyTransition` the driver collects (:meth:`GreyDetector.take_transitions`) to log,
audit and alert on.

Pure: every method takes ``now``; weights are applied by a deterministic credit count, not
by a random draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from router_worker.routing.step_cost import (
    REFERENCE_DECODE_STEP,
    REFERENCE_PREFILL,
    decode_step_s,
    prefill_s,
)

SIGNALS = ("ttft", "tpot")
OUTLIER = math.log(10.0)  # a sample counts as at most 10x off its instance's normal


class GreyState(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    DEGRADED = "degraded"
    DRAINED = "drained"


OVERRIDES = ("auto", "healthy", "drained")
LEVELS = {state: level for level, state in enumerate(GreyState)}  # for gauges and views


class GreyParams(BaseModel):
    """The detector's settings (the config's ``router.grey``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description="Detect and route around slow instances (instances alive but slower "
        "than their own normal, beyond the fleet's drift). On by default: its expected TPOT "
        "counts the prefill an instance interleaves with its decodes, and on real traces "
        "(docs/algorithms.md, 'Grey failures') it flagged no healthy instance. An "
        "operator's override works either way.",
    )
    min_decode_s: float = Field(
        default=0.05,
        ge=0,
        le=3600,
        description="A request whose decode (first to last token) took less than this, in "
        "seconds, is not judged: the router's own scheduling jitter (milliseconds) would "
        "be most of what it measures.",
    )
    step_overhead_s: float = Field(
        default=REFERENCE_DECODE_STEP["step_overhead_s"],
        ge=0,
        le=10,
        description="Cost model of the expected TPOT: fixed cost of a decode step, s.",
    )
    decode_seq_s: float = Field(
        default=REFERENCE_DECODE_STEP["decode_seq_s"],
        ge=0,
        le=10,
        description="Cost model: what each running request adds to a decode step, s.",
    )
    min_step_s: float = Field(
        default=REFERENCE_DECODE_STEP["min_step_s"],
        ge=0,
        le=10,
        description="Cost model: the shortest decode step (reading the weights once), s.",
    )
    context_token_s: float = Field(
        default=REFERENCE_DECODE_STEP["context_token_s"],
        ge=0,
        le=1,
        description="Cost model: what each context token of the batch adds to a decode "
        "step (reading its KV), s.",
    )
    prefill_token_s: float = Field(
        default=1.0 / REFERENCE_PREFILL["prefill_tps"],
        ge=0,
        le=1,
        description="Cost model: what each prompt token the instance prefilled while a "
        "request decoded adds to that request's decode time, s (chunked prefill runs in the "
        "decode steps). 0: the expectation is decode steps only.",
    )
    attention_pair_s: float = Field(
        default=REFERENCE_PREFILL["attention_pair_s"],
        ge=0,
        le=1,
        description="Cost model: what each (query, key) attention pair of those prefills adds, s.",
    )
    use_ttft: bool = Field(
        default=False,
        description="Judge TTFT too, not only TPOT. TTFT's expectation (the prefill queued "
        "ahead at a nominal throughput) is rough, and its residual noisier: off by default.",
    )
    enter_ratio: float = Field(
        default=1.6,
        gt=1,
        le=100,
        description="An instance this many times slower than its own normal, beyond the "
        "fleet's drift, is suspect.",
    )
    exit_ratio: float = Field(
        default=1.25,
        gt=1,
        le=100,
        description="Under this ratio a flagged instance is healthy again (hysteresis).",
    )
    persist_s: float = Field(
        default=5.0, gt=0, le=3600, description="Suspect this long: degraded (weight lowered)."
    )
    drain_after_s: float = Field(
        default=10.0, gt=0, le=3600, description="Degraded and still slow this long: drained."
    )
    degraded_weight: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="Share of its decisions a degraded instance still takes.",
    )
    probe_interval_s: float = Field(
        default=3.0, gt=0, le=3600, description="A drained instance gets one request this often."
    )
    restore_probes: int = Field(
        default=3, ge=1, le=100, description="Good probes in a row that restore a drained one."
    )
    warmup: int = Field(
        default=20, ge=1, le=10_000, description="Samples that set an instance's normal."
    )
    fast_alpha: float = Field(default=0.25, gt=0, le=1, description="Weight of a new sample.")
    baseline_alpha: float = Field(
        default=0.005, ge=0, le=1, description="Weight of a sample in the learned normal."
    )
    min_samples: int = Field(
        default=5,
        ge=1,
        le=10_000,
        description="Samples past warm-up before an instance can be flagged.",
    )


@dataclass(frozen=True, slots=True)
class GreyTransition:
    instance: str
    before: GreyState
    after: GreyState
    excess: float  # the instance's excess slowness as a ratio (1 = its normal)
    at: float
    cause: str  # detected | persisted | still_slow | recovered | probes_good | operator

    @property
    def routing(self) -> bool:
        """The change moves traffic (not a healthy instance becoming suspect or back)."""
        return GreyState.DEGRADED in (self.before, self.after) or GreyState.DRAINED in (
            self.before,
            self.after,
        )


@dataclass(slots=True)
class _Signal:
    fast: float = 0.0
    baseline: float = 0.0
    count: int = 0

    @property
    def ready(self) -> bool:
        return self.count > 0

    def deviation(self) -> float:
        return self.fast - self.baseline


@dataclass(slots=True)
class _Instance:
    state: GreyState = GreyState.HEALTHY
    since: float = 0.0  # when it entered ``state``
    override: str = "auto"
    signals: dict[str, _Signal] = field(default_factory=lambda: {s: _Signal() for s in SIGNALS})
    credit: float = 0.0  # degraded: decisions it may take (weight per decision)
    next_probe: float = 0.0
    good_probes: int = 0
    excess: float = 0.0  # log ratio, last computed
    calm_since: float | None = None  # degraded: since when under the exit ratio


class GreyDetector:
    """Per-instance latency residuals, their excess over the fleet, and the state machine
    (module docstring)."""

    def __init__(self, params: GreyParams | None = None, *, judging: bool = True) -> None:
        """``judging`` False: no automatic detection, only the operator's overrides (what a
        router runs with ``enabled`` off while an instance is forced healthy or drained)."""
        self.params = params or GreyParams()
        self.judging = judging
        self._instances: dict[str, _Instance] = {}
        self._transitions: list[GreyTransition] = []

    # ----- inputs -----------------------------------------------------------------------
    def expected_step(self, batch: float, context_tokens: float) -> float:
        """The cost model's decode step, s, for a batch of ``batch`` requests holding
        ``context_tokens``: the TPOT a request decoding in it is expected to see."""
        p = self.params
        return float(
            decode_step_s(
                max(batch, 1.0),
                max(context_tokens, 0.0),
                step_overhead_s=p.step_overhead_s,
                decode_seq_s=p.decode_seq_s,
                min_step_s=p.min_step_s,
                context_token_s=p.context_token_s,
            )
        )

    def expected_prefill(self, tokens: float, pairs: float) -> float:
        """The cost model's seconds of prefill for ``tokens`` prompt tokens computing
        ``pairs`` attention pairs: what an instance's decodes wait for while it runs them."""
        p = self.params
        return float(
            prefill_s(
                max(tokens, 0.0),
                max(pairs, 0.0),
                prefill_token_s=p.prefill_token_s,
                attention_pair_s=p.attention_pair_s,
            )
        )

    def observe(
        self, instance: str, signal: str, measured: float, expected: float, now: float
    ) -> None:
        """One measurement of ``signal`` (``ttft`` or ``tpot``, seconds) on ``instance``,
        ``expected`` its prediction (any positive scale: the residual's baseline absorbs
        it)."""
        if signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}, got {signal!r}")
        if not (self.judging and measured > 0 and expected > 0):
            return
        p = self.params
        entry = self._entry(instance)
        residual = math.log(measured / expected)
        s = entry.signals[signal]
        if entry.state is GreyState.DRAINED:
            s.fast = residual  # a probe is judged alone
            self._judge_probe(instance, entry, now)
            return
        if s.count:  # an outlier (a stall, a coalesced stream) moves the averages a bound
            residual = min(max(residual, s.baseline - OUTLIER), s.baseline + OUTLIER)
        s.count += 1
        if s.count <= p.warmup:  # the normal: the warm-up's mean
            s.baseline += (residual - s.baseline) / s.count
            s.fast = s.baseline
            return
        s.fast += p.fast_alpha * (residual - s.fast)
        if entry.state is GreyState.HEALTHY:
            s.baseline += p.baseline_alpha * (residual - s.baseline)
        self.advance(now)

    def override(self, instance: str, mode: str, now: float) -> None:
        """An operator's word on ``instance``: ``healthy``, ``drained`` or ``auto``."""
        if mode not in OVERRIDES:
            raise ValueError(f"override must be one of {OVERRIDES}, got {mode!r}")
        entry = self._entry(instance)
        if entry.override == mode:
            return
        entry.override = mode
        if mode == "healthy" or (mode == "auto" and entry.state is not GreyState.HEALTHY):
            self._move(instance, entry, GreyState.HEALTHY, now, "operator")
        elif mode == "drained":
            self._move(instance, entry, GreyState.DRAINED, now, "operator")

    # ----- the health input -------------------------------------------------------------
    def excluded(self, ids: tuple[str, ...] | list[str], now: float) -> list[int]:
        """Slots of ``ids`` this decision must not pick: drained instances (but one whose
        probe is due) and degraded ones beyond their weight's share."""
        if not self._instances:
            return []
        self.advance(now)
        out = []
        for slot, name in enumerate(ids):
            entry = self._instances.get(name)
            if entry is not None and not self._takes(entry, now):
                out.append(slot)
        return out

    def _takes(self, entry: _Instance, now: float) -> bool:
        if entry.state is GreyState.DEGRADED:
            entry.credit += self.params.degraded_weight
            if entry.credit >= 1.0:
                entry.credit -= 1.0
                return True
            return False
        if entry.state is GreyState.DRAINED:
            if entry.override == "drained" or now < entry.next_probe:
                return False
            entry.next_probe = now + self.params.probe_interval_s
            return True
        return True

    # ----- the state machine ------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Recompute every instance's excess over the fleet and move the states on."""
        p = self.params
        deviations = {
            name: self._deviation(entry)
            for name, entry in self._instances.items()
            if entry.state is not GreyState.DRAINED
        }
        known = [d for d in deviations.values() if d is not None]
        if not known:
            return
        median = _median(known)
        enter, leave = math.log(p.enter_ratio), math.log(p.exit_ratio)
        for name, deviation in deviations.items():
            entry = self._instances[name]
            if deviation is None or entry.override != "auto":
                continue
            entry.excess = excess = deviation - median
            state, age = entry.state, now - entry.since
            if excess >= leave:
                entry.calm_since = None
            elif entry.calm_since is None:
                entry.calm_since = now
            calm = entry.calm_since is not None and now - entry.calm_since >= p.persist_s
            if state is GreyState.HEALTHY and excess > enter:
                self._move(name, entry, GreyState.SUSPECT, now, "detected")
            elif (state is GreyState.SUSPECT and excess < leave) or (
                state is GreyState.DEGRADED and calm
            ):
                self._move(name, entry, GreyState.HEALTHY, now, "recovered")
            elif state is GreyState.SUSPECT and excess > enter and age >= p.persist_s:
                self._move(name, entry, GreyState.DEGRADED, now, "persisted")
            elif state is GreyState.DEGRADED and excess > enter and age >= p.drain_after_s:
                self._move(name, entry, GreyState.DRAINED, now, "still_slow")

    def _deviation(self, entry: _Instance) -> float | None:
        """The instance's largest deviation from its normal over the signals ready."""
        floor = self.params.warmup + self.params.min_samples
        ready = [s.deviation() for s in entry.signals.values() if s.count >= floor]
        return max(ready) if ready else None

    def _judge_probe(self, name: str, entry: _Instance, now: float) -> None:
        if entry.override != "auto":
            return
        others = [self._deviation(e) for n, e in self._instances.items() if n != name]
        known = [d for d in others if d is not None]
        drift = _median(known) if known else 0.0
        entry.excess = max(s.deviation() for s in entry.signals.values()) - drift
        if entry.excess < math.log(self.params.exit_ratio):
            entry.good_probes += 1
        else:
            entry.good_probes = 0
        if entry.good_probes >= self.params.restore_probes:
            self._move(name, entry, GreyState.HEALTHY, now, "probes_good")

    def _move(self, name: str, entry: _Instance, state: GreyState, now: float, cause: str) -> None:
        if entry.state is state:
            return
        before = entry.state
        entry.state, entry.since = state, now
        entry.credit, entry.good_probes, entry.calm_since = 0.0, 0, None
        if state is GreyState.DRAINED:
            entry.next_probe = now + self.params.probe_interval_s
        if state in (GreyState.DRAINED, GreyState.HEALTHY):
            for s in entry.signals.values():
                s.fast = s.baseline  # judged afresh (the old average is the slow spell's)
        self._transitions.append(
            GreyTransition(name, before, state, math.exp(entry.excess), now, cause)
        )

    # ----- outputs ----------------------------------------------------------------------
    def state_of(self, instance: str) -> GreyState:
        entry = self._instances.get(instance)
        return GreyState.HEALTHY if entry is None else entry.state

    def excess_of(self, instance: str) -> float:
        """The instance's excess slowness as a ratio to its normal (1: none)."""
        entry = self._instances.get(instance)
        return 1.0 if entry is None else math.exp(entry.excess)

    def override_of(self, instance: str) -> str:
        entry = self._instances.get(instance)
        return "auto" if entry is None else entry.override

    def take_transitions(self) -> list[GreyTransition]:
        out, self._transitions = self._transitions, []
        return out

    def _entry(self, instance: str) -> _Instance:
        entry = self._instances.get(instance)
        if entry is None:
            entry = self._instances[instance] = _Instance()
        return entry


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
