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
    TTFT_i = wait_i + max(S · min_step_s,
                          S · step_i + W / prefill_tps + attention_pair_s · (n_i·c_i + n_i²/2))

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

Deliberate simplifications (cheap, per request, vectorised): the attention of the queued
prompts ahead of r is not charged (the view has their total, not their sizes); decode
contexts do not grow over the prediction; the batch is assumed not to change while r
waits; constant terms (HTTP, tokenisation) are left out since they cannot change the
choice. A prediction is a ranking device first and an estimate second; it is put in
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

Ties: lower P-token, then lower BS, then seeded random. Reason ``predicted_ttft``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy

# Derived once from enginesim's cost model for an H20 serving Qwen2-7B (module docstring).
FALLBACK_COEFFICIENTS: dict[str, float | int] = {
    "prefill_tps": 7239.0,
    "step_overhead_s": 0.002258,
    "decode_seq_s": 0.0001619,
    "attention_pair_s": 4.249e-9,
    "min_step_s": 0.005957,
    "chunk_tokens": 8192,
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
    )
    step_overhead_s: float | None = Field(
        None,
        ge=0,
        description="fixed cost of every engine step, s (launch, scheduling, sampling); "
        + _DERIVED.format("0.002258"),
    )
    decode_seq_s: float | None = Field(
        None,
        ge=0,
        description="decode interference: cost each running request adds to every step, s "
        "(its one token, its sampling, its slot); " + _DERIVED.format("0.0001619"),
    )
    attention_pair_s: float | None = Field(
        None,
        ge=0,
        description="attention cost of one query token against one cached token, s: running "
        "requests add their context tokens to every step, the request's own prefill "
        "n·cached + n²/2; " + _DERIVED.format("4.249e-9"),
    )
    min_step_s: float | None = Field(
        None,
        ge=0,
        description="shortest possible step, s (reading the weights once: the memory floor "
        "of small steps); " + _DERIVED.format("0.005957"),
    )
    chunk_tokens: int | None = Field(
        None,
        ge=1,
        description="token budget of one step, the engine's max_num_batched_tokens; "
        + _DERIVED.format("8192"),
    )
    tier_token_cost: float | None = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="with a global KV tier, what loading a token from it costs relative to "
        "prefilling it (the loaded tokens then count as cached); null = ignore the tier",
    )
    use_measured_prefill_tps: bool = Field(
        False,
        description="use the router's measured prefill throughput per instance instead of "
        "prefill_tps; off by default: the measurement already includes decode interference "
        "and queueing (partly counted twice), lags, and reads the router's guess until the "
        "first sample",
    )


@dataclass(frozen=True, slots=True)
class Coefficients:
    """The parameters with every ``None`` resolved to :data:`FALLBACK_COEFFICIENTS`."""

    prefill_tps: float
    step_overhead_s: float
    decode_seq_s: float
    attention_pair_s: float
    min_step_s: float
    chunk_tokens: int

    @classmethod
    def of(cls, params: PredictedTTFTParams) -> Coefficients:
        values: dict[str, Any] = {}
        for name in COEFFICIENT_FIELDS:
            value = getattr(params, name)
            values[name] = FALLBACK_COEFFICIENTS[name] if value is None else value
        return cls(**values)


class PredictedTTFTPolicy(RoutingPolicy):
    kind = "predicted_ttft"
    description = (
        "Minimum predicted TTFT: queued + uncached prefill over chunked steps "
        "slowed by the running batch (cost-model coefficients)."
    )
    Params = PredictedTTFTParams
    params: PredictedTTFTParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.coefficients = Coefficients.of(self.params)

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        predicted = self.predict(request, view)
        p_tokens = view.p_tokens(request, tier_token_cost=self.params.tier_token_cost)
        slot = self.pick_min((predicted, p_tokens, view.batch_size), allowed)
        return self.decision(
            view,
            request,
            slot,
            "predicted_ttft",
            predicted,
            allowed,
            predicted_ttft_s=float(predicted[slot]),
        )

    def predict(self, request: RequestFeatures, view: ClusterView) -> np.ndarray:
        """Predicted seconds to ``request``'s first token on every slot (see module doc)."""
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
        attention = k.attention_pair_s * (new * cached + 0.5 * new * new)
        busy = steps * step + work / rate + attention
        return wait + np.maximum(busy, steps * k.min_step_s)
