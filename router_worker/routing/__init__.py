"""Switchyard's routing core: a pure library (no I/O, no clock, no asyncio).

Both the live router (wall-clock ``now``) and the replay simulator (virtual
``now``) drive the same objects::

    from router_worker.routing import ClusterState, build_features, make_policy

    state = ClusterState(block_size=16)
    for iid in ("a", "b"):
        state.add_instance(iid, capacity_blocks=50_000)
    policy = make_policy("lmetric", {}, seed=7)

    feats = build_features("req-1", token_ids, arrival_time=now)
    decision = policy.decide(feats, state.view(), now)
    state.on_dispatch(feats, decision.instance_id, now, cached_tokens=decision.cached_tokens)
    state.on_first_token("req-1", t1)
    policy.observe_first_token(feats, decision.instance_id, t1 - feats.arrival_time, t1)
    state.on_finish("req-1", t2)          # or state.on_error("req-1", t2)

Drivers do the per-request part through :class:`RequestLifecycle` (route, dispatch,
first_token, finish | fail (the retry rule) | abandon | migrate), which does the
accounting and feedback above exactly once per transition.

Other inputs: ``state.on_scrape``, ``state.on_kv_event_batch(instance,
decode_kv_event_batch(payload), now)``, ``state.set_health``.
"""

from engine_interface.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventDecodeError,
    decode_kv_event_batch,
    encode_kv_event_batch,
)
from router_worker.routing.features import (
    DEFAULT_BLOCK_SIZE,
    RequestFeatures,
    build_features,
    extend_chain,
    hash_blocks,
)
from router_worker.routing.hotspot import HotspotParams, HotspotTransition
from router_worker.routing.indicators import (
    ClusterState,
    ClusterView,
    Health,
    InstanceState,
    UnknownRequestError,
)
from router_worker.routing.kvindex import GlobalTier, KVIndex
from router_worker.routing.lifecycle import (
    Attempt,
    IllegalTransition,
    LifecycleObserver,
    LifecycleObservers,
    Phase,
    RequestLifecycle,
    RetryVerdict,
    choose_migrations,
)
from router_worker.routing.policies import (
    DESCRIPTIONS,
    REGISTRY,
    Decision,
    Migration,
    NoEligibleInstanceError,
    PolicyConfigError,
    QueuedRequest,
    RoutingPolicy,
    make_policy,
    validate_params,
)
from router_worker.routing.sessions import session_key_from_request, turn_index_from_messages

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DESCRIPTIONS",
    "REGISTRY",
    "AllBlocksCleared",
    "Attempt",
    "BlockRemoved",
    "BlockStored",
    "ClusterState",
    "ClusterView",
    "Decision",
    "GlobalTier",
    "Health",
    "HotspotParams",
    "HotspotTransition",
    "IllegalTransition",
    "InstanceState",
    "KVEventBatch",
    "KVEventDecodeError",
    "KVIndex",
    "LifecycleObserver",
    "LifecycleObservers",
    "Migration",
    "NoEligibleInstanceError",
    "Phase",
    "PolicyConfigError",
    "QueuedRequest",
    "RequestFeatures",
    "RequestLifecycle",
    "RetryVerdict",
    "RoutingPolicy",
    "UnknownRequestError",
    "build_features",
    "choose_migrations",
    "decode_kv_event_batch",
    "encode_kv_event_batch",
    "extend_chain",
    "hash_blocks",
    "make_policy",
    "session_key_from_request",
    "turn_index_from_messages",
    "validate_params",
]
