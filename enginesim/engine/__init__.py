"""enginesim engine core: vLLM v1 scheduling + KV cache + roofline cost model.

Pure and clock-agnostic: no I/O, no clock reads, no asyncio. The HTTP server drives it in
(scaled) real time, the replay simulator in virtual time.

Public API (a contract for ``enginesim.server`` and the replay simulator)::

    from enginesim.engine import EngineConfig, EngineCore, GlobalKVTier

    cfg = EngineConfig.for_hardware("h20", "qwen2-7b")      # vLLM defaults for the GPU
    core = EngineCore(cfg, kv_event_sink=publish)           # publish(list[KVEvent])
    core.add_request("r1", prompt_token_ids, max_tokens=128, now=0.0)  # EngineRequestError
    while (t := core.next_event_time()) is not None:        # None = idle
        for out in core.advance_to(t):                      # RequestOutput list
            ...  # out.new_token_count, out.first_token_time, out.finished, ...
    core.abort("r1", now=t)                                 # finish_reason "abort"
    core.stats()                                            # EngineStats (vllm: metrics)

Time semantics: all methods take virtual seconds; times must not go backwards (earlier
ones are clamped). A step's batch is fixed when the step starts; its tokens, first
tokens and finishes are reported by the first ``advance_to(t)`` with t >= the step's end.
``advance_to(t, per_token=True)`` adds ``token_times`` (end time of the step that
produced each new token); ``advance_to(t, events_only=True)`` reports only requests that
got their first token or finished (cheap for the replay simulator).
``first_token_time`` and ``finish_time`` are exact step ends. A request joins no step
before ``calibration.t_request`` (the API server's per-request overhead) after its arrival.
``next_event_time()`` skips decode-only stretches: it returns the next step end with a
first token or finish, or the next step start where the batch could change.
KV events are delivered to the sink synchronously, during the call that schedules the
step that computes (BlockStored) or evicts (BlockRemoved) the blocks.

Modules: hardware (GPUS), models (MODELS), costmodel (CostModel, StepBatch,
Calibration), config (EngineConfig), core (EngineCore, RequestOutput, EngineStats,
EngineRequestError), events (BlockStored, BlockRemoved, AllBlocksCleared), kvpool
(GlobalKVTier), hashing (block_hashes), fleet (FleetVariation: instances unlike each other
and unlike their cost model), calibrate (``python -m enginesim.engine.calibrate``).
"""

from engine_interface.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from enginesim.engine.config import EngineConfig
from enginesim.engine.core import (
    EngineCore,
    EngineRequestError,
    EngineStats,
    RequestOutput,
)
from enginesim.engine.costmodel import Calibration, CostModel, StepBatch, load_calibration
from enginesim.engine.fleet import FleetVariation
from enginesim.engine.hardware import GPUS, GPUSpec
from enginesim.engine.hashing import block_hashes
from enginesim.engine.kvpool import GlobalKVTier
from enginesim.engine.models import MODELS, ModelSpec

__all__ = [
    "GPUS",
    "MODELS",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Calibration",
    "CostModel",
    "EngineConfig",
    "EngineCore",
    "EngineRequestError",
    "EngineStats",
    "FleetVariation",
    "GPUSpec",
    "GlobalKVTier",
    "KVEvent",
    "ModelSpec",
    "RequestOutput",
    "StepBatch",
    "block_hashes",
    "load_calibration",
]
