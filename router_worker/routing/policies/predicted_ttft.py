"""``predicted_ttft``: per instance, predict this request's TTFT from a step-cost model; min.

Like llm-d's latency predictor, but the predictor is not learned: it is enginesim's
calibrated roofline cost model (:mod:`enginesim.engine.costmodel`) reduced to a handful of
coefficients that reach the policy as validated parameters. The router never imports
``enginesim``; the control plane fills the coefficients from the cluster's GPU and model
(``controlplane.services.policy_defaults``), and an operator may set any of them.

Model, per instance i, all inputs from the indicator view (vLLM v1 scheduling: running
requests first, then FCFS admission, one token budget per step, chunked prefill)::

    W      = pending_prefill_i + n_i            prefill tokens that must run before r's
                                                first token (r is behind the queue; FCFS)
    n_i    = prompt − cached_i(r)               r's uncached tokens, after c_i = cached_i(r)
    S      = ceil(W / max(chunk − BS_i, 1))     steps it takes: each step's budget of
                                                ``chunk_tokens`` is shared with one token
                                                per running request
    step_i = step_overhead_s + BS_i · decode_seq_s + ctx_i · attention_pair_s
    wait_i = ½ · max(min_step_s, step_i)  if BS_i > 0, else 0
    A_i    = pending_attention_pairs_i + n_i·c_i + n_i²/2
                                                (query, key) pairs of the queued prompts'
                                                prefills and of r's own
    TTFT_i = wait_i + max(S · min_step_s, S · step_i + W / prefill_tps + attention_pair_s · A_i)

With a global KV tier (replays) the tokens it holds beyond the local hit, l_i, are loaded
rather than prefilled: n_i = prompt − c_i − l_i, W gains ``tier_token_cost`` · l_i, and the
loaded tokens count as cached for attention (c_i + l_i). Without a tier l_i = 0.

``BS_i`` is the view's ``batch_size`` (requests in the engine's running batch, decoding or
prefilling, including load other senders put there; a queued prefill is charged one
decode token's worth per step too, a small overcount) and ``ctx_i`` its
``decode_context_tokens``; so a large batch, or one with long contexts, slows every step
in which r's queue and prefill run. ``wait_i``: on a busy engine r arrives in the middle
of a step of the running batch and waits, on average, half of it before its first chunk
can be scheduled. The first term of the max is the memory floor: a step never takes less
than reading the weights once, so tiny prefills (a near-full cache hit) cost one floor
step whatever their size, and instances whose predictions both sit on the floor tie —
then the documented tie-breaks decide.

The queued prompts' attention matters where r would wait behind a long prefill of its own
prefix that another request started (the router's shadow already counts that prefix as
cached there): charged only the queued tokens, that wait looks cheaper than a fresh copy
elsewhere by the whole prefix's attention, so a burst on one long prefix queues behind one
new copy at a time instead of opening copies together.

Deliberate simplifications (cheap, per request, vectorised): a queued prefill is charged
whole until its first token (the router does not see how far it has got); decode contexts
do not grow over the prediction; the batch is assumed not to change while r waits;
constant terms (HTTP, tokenisation) are left out since they cannot change the choice. A
prediction is a ranking device first and an estimate second; it is put in
``details["predicted_ttft_s"]`` for the chosen instance.

Coefficients. Each defaults to ``None``, meaning "derive it": when the policy is created
on a cluster, the control plane replaces every ``None`` by what enginesim's cost model
gives for the cluster's GPU and model (the operator form shows these fields blank, so a
value typed there is never overwritten). A policy still holding ``None`` (``enginesim
replay --policy predicted_ttft``, a config written by hand) uses
:data:`FALLBACK_COEFFICIENTS`: derived once from enginesim's cost model (calibration era
v1) for the reference cluster, 16 × H20 serving Qwen2-7B (the coefficients are per
instance), exactly as ``controlplane.services.policy_defaults.derive_coefficients("h20",
"qwen2-7b")`` derives them, at a full prefill step of ``chunk`` tokens:

* ``prefill_tps`` = chunk / the step's compute time;
* ``step_overhead_s`` = t_fixed + t_per_seq;
* ``decode_seq_s`` = t_per_seq + the compute one more sampled token adds (on a GPU that
  runs the model compute-bound, a running request costs about what one more prefill
  token does);
* ``attention_pair_s`` = attention compute of one (query, key) pair;
* ``min_step_s`` = the time of a one-token step, mostly the weight read;
* ``chunk_tokens`` = vLLM's ``max_num_batched_tokens`` for the GPU's memory.

Against enginesim's engine, a prompt on an idle instance is predicted close to its engine
time less the engine's fixed per-request overhead (the same on every instance, so it
cannot change a choice); under a running batch or behind a queue the prediction runs low:
a request arriving just as a step starts waits a whole step, not half, and the queued
prompts' own attention is not charged.

Measured throughput. ``use_measured_prefill_tps`` (off by default) replaces
``prefill_tps`` by the view's ``prefill_tps``, the router's EWMA of (prefill work ahead
of a request, its own included) / (its measured TTFT). Off is the robust choice: that
measurement is an *effective* rate which already contains the step overhead, decode
interference and engine queueing of the batches it was measured under (with it, those
are partly counted twice); it lags (it moves only when a prefill finishes); and until an
instance's first sample it is the router's configured guess (10,000 tok/s, about 1.4× what
an H20 prefills a 7B model at), which the view cannot tell apart from a measurement. Turn it
on where the cost model does not describe the hardware (a GPU or engine setting
enginesim does not know) or instances differ from each other.

Beyond the prediction (docs/algorithms.md, "predicted_ttft"): an admission wait where the
scraped KV cache is full and requests of ours queue (:meth:`PredictedTTFTPolicy.
admission_wait`); a decode guard that charges the decode time a request would lose on an
instance whose decode step, with the request's context read from memory
(``context_token_s``), exceeds ``decode_slack`` × the fastest one's
(:meth:`PredictedTTFTPolicy.decode_excess`); per-instance corrections learned from
measured TTFT and TPOT (:class:`PredictionErrors`); and, with ``kv_pressure`` (off by
default: ``queue_attention`` keeps the invariant without it, at less cost at high load),
the wait for KV where the cache cannot hold the request with its expected output on top of
every request the instance has taken on, queued ones included
(:mod:`router_worker.routing.kv_pressure`, which also supplies the expected output: the
finished mean, or more while the outputs still decoding say so). ``details`` carries the chosen
instance's ``predicted_ttft_s`` (corrected, admission included) and ``predicted_tpot_s``.

Ties: lower P-token, then lower BS, then seeded random. Reason ``predicted_ttft``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.hotspot import HotspotParams
from router_worker.routing.indicators import ClusterView, attention_pairs
from router_worker.routing.kv_pressure import OutputLengths, kv_wait
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy
from router_worker.routing.policies.hotspot_guard import HotspotGuard, hotspot_field
from router_worker.routing.provenance import derived, design, matrix
from router_worker.routing.step_cost import REFERENCE_DECODE_STEP, REFERENCE_PREFILL, decode_step_s

# Derived once from enginesim's cost model for an H20 serving Qwen2-7B (module docstring).
FALLBACK_COEFFICIENTS: dict[str, float | int] = {
    "prefill_tps": REFERENCE_PREFILL["prefill_tps"],
    "step_overhead_s": REFERENCE_DECODE_STEP["step_overhead_s"],
    "decode_seq_s": REFERENCE_DECODE_STEP["decode_seq_s"],
    "attention_pair_s": REFERENCE_PREFILL["attention_pair_s"],
    "min_step_s": REFERENCE_DECODE_STEP["min_step_s"],
    "chunk_tokens": 8192,
    "context_token_s": REFERENCE_DECODE_STEP["context_token_s"],
}
# The parameters the control plane derives from the cluster's GPU and model when left None.
COEFFICIENT_FIELDS: tuple[str, ...] = tuple(FALLBACK_COEFFICIENTS)

_DERIVED = (
    "blank = derived from the cluster's GPU and model by the control plane (H20 + Qwen2-7B: {})"
)


class PredictedTTFTParams(PolicyParams):
    prefill_tps: float | None = Field(
        None,
        gt=0,
        description="prefill throughput of an idle instance, tokens/s (GEMM work only; "
        "attention is charged by attention_pair_s); " + _DERIVED.format("7239"),
        json_schema_extra=derived(),
    )
    step_overhead_s: float | None = Field(
        None,
        ge=0,
        description="fixed cost of every engine step, s (launch, scheduling, sampling); "
        + _DERIVED.format("0.002258"),
        json_schema_extra=derived(),
    )
    decode_seq_s: float | None = Field(
        None,
        ge=0,
        description="decode interference: cost each running request adds to every step, s "
        "(its one token, its sampling, its slot); " + _DERIVED.format("0.0001619"),
        json_schema_extra=derived(),
    )
    attention_pair_s: float | None = Field(
        None,
        ge=0,
        description="attention cost of one query token against one cached token, s: running "
        "requests add their context tokens to every step, the request's own prefill "
        "n·cached + n²/2; " + _DERIVED.format("4.249e-9"),
        json_schema_extra=derived(),
    )
    min_step_s: float | None = Field(
        None,
        ge=0,
        description="shortest possible step, s (reading the weights once: the memory floor "
        "of small steps); " + _DERIVED.format("0.005957"),
        json_schema_extra=derived(),
    )
    chunk_tokens: int | None = Field(
        None,
        ge=1,
        description="token budget of one step, the engine's max_num_batched_tokens; "
        + _DERIVED.format("8192"),
        json_schema_extra=derived(),
    )
    tier_token_cost: float | None = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="with a global KV tier, what loading a token from it costs relative to "
        "prefilling it (the loaded tokens then count as cached); null = ignore the tier",
        json_schema_extra=matrix(),
    )
    context_token_s: float | None = Field(
        None,
        ge=0,
        description="decode: seconds each context token of the running batch adds to a "
        "decode step (reading its KV from memory); " + _DERIVED.format("1.5e-08"),
        json_schema_extra=derived(),
    )
    decode_slack: float | None = Field(
        1.5,
        ge=1.0,
        le=100.0,
        description="decode guard: only instances whose predicted decode step with the "
        "request is within this factor of the fastest one's are candidates (a cache hit "
        "must not pile decode onto one instance); null = rank every instance by TTFT",
        json_schema_extra=design(),
    )
    decode_weight: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        description="weight of the decode guard's penalty: the decode time the request "
        "would lose (expected output tokens × its decode step beyond decode_slack × the "
        "fastest one) is added to its predicted TTFT × this weight",
        json_schema_extra=design(),
    )
    output_tokens_prior: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="expected output tokens of a request until finishes were observed; "
        "then the running mean of the observed ones",
        json_schema_extra=design(),
    )
    kv_pressure: bool = Field(
        False,
        description="count every request dispatched to an instance against its decode step "
        "and its KV from dispatch to finish (not only once it runs), and charge the wait "
        "for KV where the cache cannot hold the request with its expected output, outputs "
        'still decoding counted (docs/algorithms.md, "KV pressure"); off = the running '
        "batch only, with the finished requests' mean output, and the KV growth wait. Off "
        "by default: with queue_attention the policy keeps the invariant without it, and it "
        "costs goodput at high load",
        json_schema_extra=matrix(),
    )
    queue_attention: bool = Field(
        True,
        description="charge the prompts queued ahead of the request their prefill's "
        "attention, not only their tokens (waiting behind another request's long prefill of "
        "the same prefix otherwise looks cheaper than a fresh copy elsewhere); off = their "
        "tokens only",
        json_schema_extra=design(),
    )
    correction: bool = Field(
        True,
        description="learn each instance's prediction error online: its TTFT is corrected "
        "by the recent mean of (measured − predicted) and its decode step by the recent "
        "ratio of measured to predicted TPOT",
        json_schema_extra=design(),
    )
    use_measured_prefill_tps: bool = Field(
        False,
        description="use the router's measured prefill throughput per instance instead of "
        "prefill_tps; off by default: the measurement already includes decode interference "
        "and queueing (partly counted twice), lags, and reads the router's guess until the "
        "first sample",
        json_schema_extra=design(),
    )
    hotspot: HotspotParams = hotspot_field()


@dataclass(frozen=True, slots=True)
class Coefficients:
    """The parameters with every ``None`` resolved to :data:`FALLBACK_COEFFICIENTS`."""

    prefill_tps: float
    step_overhead_s: float
    decode_seq_s: float
    attention_pair_s: float
    min_step_s: float
    chunk_tokens: int
    context_token_s: float

    @classmethod
    def of(cls, params: PredictedTTFTParams) -> Coefficients:
        values: dict[str, Any] = {}
        for name in COEFFICIENT_FIELDS:
            value = getattr(params, name)
            values[name] = FALLBACK_COEFFICIENTS[name] if value is None else value
        return cls(**values)


KV_FULL = 0.95  # scraped KV usage from which an engine stops admitting queued requests
_ALPHA = 0.1  # weight of a new sample in an instance's learned error
_FLEET_ALPHA = 0.02  # ... in the fleet's (every instance's samples)
_PRIOR_WEIGHT = 5.0  # pull toward the fleet's line, × an instance's whole recent history (ridge)
_FORGET_S = 30.0  # a learned error fades with this time constant once no sample renews it
_OUTPUT_WINDOW = 200  # the expected output is the mean of about the last this many finishes
_RATIO_BOUND = 8.0  # one TPOT sample moves the decode ratio by at most this factor
_MAX_OPEN = 100_000  # predictions kept for requests not yet finished (oldest dropped)


@dataclass(slots=True)
class _Prediction:
    instance_id: str
    decided_at: float
    ttft: float
    step: float
    first_token_at: float | None = None


class _Fit:
    """Exponentially weighted sums of (predicted p, measured m) samples, for the least
    squares line m ≈ a + b·p (weights: ``_ALPHA`` per sample, and a fade with time)."""

    __slots__ = ("at", "sums")

    def __init__(self) -> None:
        self.sums = np.zeros(5)  # Σw, Σw·p, Σw·p², Σw·m, Σw·p·m
        self.at = -math.inf

    def faded(self, now: float) -> np.ndarray:
        if not math.isfinite(self.at):
            return self.sums
        return self.sums * math.exp(-max(now - self.at, 0.0) / _FORGET_S)

    def add(self, p: float, m: float, now: float, alpha: float, fade: bool = True) -> None:
        base = self.faded(now) if fade else self.sums
        self.sums = (1.0 - alpha) * base + alpha * np.array([1.0, p, p * p, m, p * m])
        self.at = now


def _line(sums: np.ndarray, prior: tuple[float, float], scale: float) -> tuple[float, float]:
    """Ridge fit of m ≈ a + b·p pulled toward ``prior`` (a₀, b₀) with one sample's weight
    (``scale``: a typical p², so the pull on b has the units of the data)."""
    w, sp, spp, sm, spm = sums.tolist()
    a0, b0 = prior
    matrix = np.array([[w + _PRIOR_WEIGHT, sp], [sp, spp + _PRIOR_WEIGHT * scale]])
    rhs = np.array([sm + _PRIOR_WEIGHT * a0, spm + _PRIOR_WEIGHT * scale * b0])
    a, b = np.linalg.solve(matrix, rhs).tolist()
    b = min(max(b, 1.0 / _RATIO_BOUND), _RATIO_BOUND)
    return a, b


class PredictionErrors:
    """What the policy learns from the engines: how each instance's TTFT departs from the
    model's prediction, how its decode steps do, and the mean output length.

    * TTFT: per instance, a small online regression measured ≈ a + b × predicted
      (exponentially weighted least squares over its recent requests), applied as
      a + b × prediction. ``a`` absorbs constant overheads the model leaves out, ``b`` an
      engine slower or faster than modelled (a slow engine's error grows with the work, so
      an additive correction alone over-corrects small requests and under-corrects big
      ones). The same fit over every instance's requests (slower, never faded) is the
      fleet's line.
    * decode: per instance, an EWMA of log(measured TPOT ÷ predicted decode step), each
      sample bounded, applied as a factor; the fleet's the same over every instance.

    Why it is stable: each fit is ridge-regularised toward the fleet's line with one
    sample's weight (a few samples cannot swing it; b is bounded to [1/8, 8]), and an
    instance's own samples fade (time constant ``_FORGET_S``) toward the fleet's line once
    no request renews them. An instance penalised into receiving nothing is therefore
    judged like the rest of the fleet again within tens of seconds and retried; and the
    corrections are fitted to the model's own predictions, never to corrected ones, so
    they cannot feed on themselves.
    """

    def __init__(self, output_tokens_prior: int) -> None:
        self.output_tokens = float(output_tokens_prior)
        self._finishes = 0
        self._open: dict[str, _Prediction] = {}
        self._fits: dict[str, _Fit] = {}
        self._fleet = _Fit()
        self._log_ratio: dict[str, tuple[float, float]] = {}  # instance → (log ratio, at)
        self._fleet_log_ratio = 0.0

    def predicted(
        self, request_id: str, instance_id: str, ttft: float, step: float, now: float
    ) -> None:
        if len(self._open) >= _MAX_OPEN:
            self._open.pop(next(iter(self._open)))
        self._open[request_id] = _Prediction(instance_id, now, float(ttft), float(step))

    def first_token(self, request_id: str, instance_id: str, now: float) -> None:
        record = self._open.get(request_id)
        if record is None or record.instance_id != instance_id:
            return  # predicted by another policy object, or an attempt elsewhere
        record.first_token_at = now
        measured = now - record.decided_at
        self._fits.setdefault(instance_id, _Fit()).add(record.ttft, measured, now, _ALPHA)
        self._fleet.add(record.ttft, measured, now, _FLEET_ALPHA, fade=False)

    def finish(self, request_id: str, instance_id: str, output_tokens: int, now: float) -> None:
        self._finishes += 1
        weight = 1.0 / min(self._finishes, _OUTPUT_WINDOW)
        self.output_tokens += weight * (output_tokens - self.output_tokens)
        record = self._open.pop(request_id, None)
        if record is None or record.instance_id != instance_id or output_tokens < 2:
            return
        if record.first_token_at is None or record.step <= 0:
            return
        tpot = (now - record.first_token_at) / (output_tokens - 1)
        sample = math.log(min(max(tpot / record.step, 1.0 / _RATIO_BOUND), _RATIO_BOUND))
        previous = self._faded_log_ratio(instance_id, now)
        self._log_ratio[instance_id] = ((1.0 - _ALPHA) * previous + _ALPHA * sample, now)
        self._fleet_log_ratio += _FLEET_ALPHA * (sample - self._fleet_log_ratio)

    def corrections(
        self, ids: Sequence[str], now: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per slot of ``ids``: the TTFT line's intercept (s) and slope, and the decode
        step's factor."""
        fleet_sums = self._fleet.sums
        scale = fleet_sums[2] / fleet_sums[0] if fleet_sums[0] > 0 else 1.0
        fleet = _line(fleet_sums, (0.0, 1.0), scale)
        lines = [
            _line(fit.faded(now), fleet, scale) if (fit := self._fits.get(i)) else fleet
            for i in ids
        ]
        intercept = np.array([line[0] for line in lines])
        slope = np.array([line[1] for line in lines])
        ratio = np.exp([self._faded_log_ratio(i, now) for i in ids])
        return intercept, slope, ratio

    def _faded_log_ratio(self, instance_id: str, now: float) -> float:
        """The instance's log ratio, faded toward the fleet's."""
        fleet = self._fleet_log_ratio
        value, at = self._log_ratio.get(instance_id, (fleet, now))
        return fleet + (value - fleet) * math.exp(-max(now - at, 0.0) / _FORGET_S)


def slo_candidates(
    request: RequestFeatures, ttft: np.ndarray, step: np.ndarray, allowed: np.ndarray
) -> np.ndarray:
    """The allowed instances predicted to meet the request's own SLOs (``x-slo-ttft-ms``,
    ``x-slo-tpot-ms``), if any does; else every allowed one (the minimum then misses the
    SLO by the least). Without an SLO: ``allowed``."""
    if request.slo_ttft_s is None and request.slo_tpot_s is None:
        return allowed
    meets = allowed.copy()
    if request.slo_ttft_s is not None:
        meets &= ttft <= request.slo_ttft_s
    if request.slo_tpot_s is not None:
        meets &= step <= request.slo_tpot_s
    return meets if meets.any() else allowed


def slo_details(request: RequestFeatures, ttft: float, step: float) -> dict[str, Any]:
    """What the decision says of the request's own SLOs: each one, and whether the chosen
    instance is predicted to meet them."""
    if request.slo_ttft_s is None and request.slo_tpot_s is None:
        return {}
    met = (request.slo_ttft_s is None or ttft <= request.slo_ttft_s) and (
        request.slo_tpot_s is None or step <= request.slo_tpot_s
    )
    return {"slo_ttft_s": request.slo_ttft_s, "slo_tpot_s": request.slo_tpot_s, "slo_met": met}


class PredictedTTFTPolicy(RoutingPolicy):
    kind = "predicted_ttft"
    description = (
        "Minimum predicted TTFT: queued + uncached prefill over chunked steps slowed by "
        "the running batch, plus admission behind a full KV cache, with a guard on the "
        "decode the request joins (cost-model coefficients, corrected online per instance)."
    )
    Params = PredictedTTFTParams
    params: PredictedTTFTParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.coefficients = Coefficients.of(self.params)
        self.errors = PredictionErrors(self.params.output_tokens_prior)
        self.outputs = OutputLengths(self.params.output_tokens_prior)
        self.guard = HotspotGuard(self.params.hotspot)

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        model_ttft, model_step = self.model_parts(request, view)
        ttft, step = self.corrected(model_ttft, model_step, view.ids, now)
        expected = self.expected_output(view)
        score = ttft + self.decode_excess(step, allowed, expected)
        p_tokens = view.p_tokens(request, tier_token_cost=self.params.tier_token_cost)
        batch = view.batch_size
        allowed = slo_candidates(request, ttft, step, allowed)
        slot = self.pick_min((score, p_tokens, batch), allowed)
        verdict = self.guard.check(request, view, allowed, slot, now)
        if verdict.outside is not None:  # the class is hot: the best instance outside M
            score = ttft + self.decode_excess(step, verdict.outside, expected)
            slot = self.pick_min((score, p_tokens, batch), verdict.outside)
        # the errors are learned against the model's own prediction, not the corrected one
        # (against the corrected one an EWMA settles at half the error)
        self.errors.predicted(
            request.request_id, view.ids[slot], model_ttft[slot], model_step[slot], now
        )
        return self.decision(
            view,
            request,
            slot,
            "predicted_ttft" if verdict.outside is None else "hotspot_fallback",
            score,
            allowed if verdict.outside is None else verdict.outside,
            events=verdict.events,
            predicted_ttft_s=float(ttft[slot]),
            predicted_tpot_s=float(step[slot]),
            **slo_details(request, float(ttft[slot]), float(step[slot])),
            **verdict.details(),
        )

    def observe_first_token(
        self, request: RequestFeatures, instance_id: str, ttft: float, now: float
    ) -> None:
        self.errors.first_token(request.request_id, instance_id, now)
        self.outputs.first_token(request.request_id, now)

    def observe_finish(
        self, request: RequestFeatures, instance_id: str, output_tokens: int, now: float
    ) -> None:
        self.errors.finish(request.request_id, instance_id, output_tokens, now)
        self.outputs.finish(request.request_id, output_tokens, now)

    def expected_output(self, view: ClusterView) -> float:
        """A request's expected output tokens: with ``kv_pressure``, counting the outputs
        still decoding (:class:`~router_worker.routing.kv_pressure.OutputLengths`); without,
        the finished requests' mean."""
        if self.params.kv_pressure:
            return self.outputs.expected(view)
        return self.errors.output_tokens

    def decode_excess(
        self, step: np.ndarray, allowed: np.ndarray, expected: float | None = None
    ) -> np.ndarray:
        """Per slot, the decode time the request would lose against ``decode_slack`` × the
        fastest allowed decode step, over its expected output (``expected``; the finished
        requests' mean if None; 0 when the guard is off)."""
        slack = self.params.decode_slack
        if slack is None:
            return np.zeros(step.shape)
        out = self.errors.output_tokens if expected is None else expected
        bound = slack * float(step[allowed].min())
        return self.params.decode_weight * out * np.maximum(step - bound, 0.0)

    def model_parts(
        self, request: RequestFeatures, view: ClusterView
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per slot, from the cost model: ``request``'s TTFT (admission wait included) and
        the decode step it would join."""
        step = self.decode_step(request, view)
        if self.params.kv_pressure:
            kv = kv_wait(request, view, self.outputs, step)
        else:
            kv = self.kv_growth_wait(request, view, step)
        wait = np.maximum(self.admission_wait(view, step), kv)
        return self.predict(request, view) + wait, step

    def corrected(
        self, ttft: np.ndarray, step: np.ndarray, ids: Sequence[str], now: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The model's predictions corrected by the learned errors (as they are when
        ``correction`` is off)."""
        if not self.params.correction:
            return ttft, step
        intercept, slope, ratio = self.errors.corrections(ids, now)
        return np.maximum(intercept + slope * ttft, 0.0), step * ratio

    def decode_step(self, request: RequestFeatures, view: ClusterView) -> np.ndarray:
        """Per slot, the decode step ``request`` would run in once it decodes: the running
        batch plus itself, each reading its context (its prompt, plus on average half the
        expected output) from memory; never below the memory floor of reading the weights."""
        k = self.coefficients
        committed = self.params.kv_pressure  # every request taken on, queued or running
        batch = (view.committed_batch if committed else view.batch_size) + 1.0
        context = (
            (view.committed_context_tokens if committed else view.decode_context_tokens)
            + request.prompt_tokens
            + batch * 0.5 * self.expected_output(view)
        )
        return decode_step_s(
            batch,
            context,
            step_overhead_s=k.step_overhead_s,
            decode_seq_s=k.decode_seq_s,
            min_step_s=k.min_step_s,
            context_token_s=k.context_token_s,
        )

    def admission_wait(self, view: ClusterView, step: np.ndarray) -> np.ndarray:
        """Per slot, the wait to be admitted behind a full KV cache: with the cache nearly
        full (scraped) and requests of ours already queued in the engine, r waits until
        that queue and itself are admitted, one running request finishing at a time
        (a request runs about the expected output tokens' worth of steps)."""
        usage = view.kv_usage_or_zero
        queued = view.ours_waiting
        blocked = (usage >= KV_FULL) & (queued > 0)
        per_finish = self.expected_output(view) * step / np.maximum(view.batch_size, 1.0)
        return np.where(blocked, (queued + 1.0) * per_finish, 0.0)

    def kv_growth_wait(
        self, request: RequestFeatures, view: ClusterView, step: np.ndarray
    ) -> np.ndarray:
        """Per slot, the wait the KV cache's growth imposes: the blocks in use (scraped),
        the running batch's remaining decode (half the expected output each) and this
        request's uncached prompt and output must fit in the cache; what overflows is
        freed as the running batch turns over (it frees what it uses once every expected
        output's worth of steps), and until then requests wait or are preempted."""
        out = self.errors.output_tokens
        capacity = view.capacity_blocks * float(view.block_size)
        used = view.kv_usage_or_zero * capacity
        growth = view.batch_size * 0.5 * out
        need = used + growth + (request.prompt_tokens - view.cached_tokens(request)) + out
        overflow = np.maximum(need - capacity, 0.0)
        turnover = out * step
        return overflow / np.maximum(used + growth, 1.0) * turnover

    def predict(self, request: RequestFeatures, view: ClusterView) -> np.ndarray:
        """Predicted seconds to ``request``'s first token on every slot from the cost model
        alone, uncorrected and without the admission wait (see module doc)."""
        k = self.coefficients
        cached = view.cached_tokens(request)
        tier_cost = self.params.tier_token_cost
        loaded = view.tier_load_tokens(request) if tier_cost is not None else 0.0
        new = request.prompt_tokens - cached - loaded
        work = view.pending_prefill + new + loaded * (tier_cost or 0.0)
        cached = cached + loaded
        batch = view.batch_size
        budget = np.maximum(k.chunk_tokens - batch, 1.0)
        steps = np.maximum(np.ceil(work / budget), 1.0)
        step = (
            k.step_overhead_s
            + batch * k.decode_seq_s
            + view.decode_context_tokens * k.attention_pair_s
        )
        wait = np.where(batch > 0, 0.5 * np.maximum(step, k.min_step_s), 0.0)
        rate = view.prefill_tps if self.params.use_measured_prefill_tps else k.prefill_tps
        pairs = attention_pairs(new, cached)
        if self.params.queue_attention:
            pairs = pairs + view.pending_attention_pairs
        attention = k.attention_pair_s * pairs
        busy = steps * step + work / rate + attention
        return wait + np.maximum(busy, steps * k.min_step_s)
