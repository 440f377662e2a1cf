"""Discrete-event simulator of a routed cluster, in virtual time.

One event heap of ``(time, seq, kind, payload)``; ``seq`` makes ties deterministic (FIFO).
Kinds:

* ``ARRIVAL``: a trace record arrives. Its prompt is synthesised, hashed into the
  router's :class:`RequestFeatures`, routed by the *live router's* policy object over the
  *live router's* :class:`ClusterState` view through the live router's
  :class:`RequestLifecycle` (which does the ``on_dispatch`` accounting, and later the
  first-token/finish accounting and feedback), and added to the chosen
  :class:`EngineCore`. Arrivals are pushed one at a time (the trace is sorted).
* ``ENGINE``: an engine's next event time (``EngineCore.next_event_time``, which already
  skips decode-only stretches). Engines are advanced lazily, only at their own event times,
  at scrapes and when a request is added; every wake carries a version so a wake made
  stale by a later ``add_request`` is skipped.
* ``TELEMETRY``: an indicator update (``on_first_token``, ``on_finish``, ``on_scrape``, KV
  events, ``observe_first_token``, ``observe_finish``) held back by ``telemetry_delay_s``,
  the staleness knob.
  With a zero delay the updates are applied at once. Dispatch accounting is never delayed:
  the router does it itself when it sends.
* ``SCRAPE``: every ``scrape_interval_s`` each live engine's
  ``/metrics`` values (running, waiting, KV usage, the inter-token latency histogram's
  sum and count) go to ``on_scrape``, as the live
  router's scraper does; the true pending prefill tokens per instance are sampled for the
  load CV and the plots. An idle stretch of more than ``IDLE_SKIP_S`` before the next
  arrival is scraped only at its end (idle engines read the same at every tick).
* ``FAULT``: ``fail`` (the engine dies: requests without a first token are retried by
  the live router's retry rule, ``RequestLifecycle.fail``: the policy decides again
  without the instances that failed, up to ``max_attempts`` sends in all; requests
  already streaming fail, or with ``max_continuations`` are continued elsewhere by the
  lifecycle's continuation rule: the prompt and the tokens generated so far sent again,
  the rest of the answer asked for; the instance is marked down and its cache forgotten),
  ``drain`` (no new requests; in-flight ones finish), ``slow`` (its engine's steps take
  ``factor`` times longer: a grey failure, which only ``grey`` detection, the live
  router's, can find) and ``restore`` (healthy again, at its own speed; a failed instance
  comes back with a fresh, empty engine).

Several routers (``routers`` > 1) share one fleet as they would behind a load balancer:
each has its own :class:`ClusterState` and policy object (seeded ``seed + k``), routes the
requests the balancer gives it (``router_spread``: ``round_robin`` over arrivals, seeded
``random``, or ``session``, a hash of the session id as sticky balancers do) and alone
sees their dispatch accounting, first tokens and finishes; scrapes, KV events and health
reach every router. Retries stay on the router that took the request. With
``replica_sync`` each router also tells its peers what it dispatched and when those
requests started and ended (as the live routers' peer channel does), held back by
``replica_sync_delay_s`` (a pub/sub hop, independent of the scrape and KV-event delay).

``variation`` (enginesim.engine.fleet) makes the instances unlike each other and unlike
the nominal engine: other GPUs, speeds, per-step jitter, perturbed cost coefficients. The
policies are not told: their cost coefficients stay the nominal GPU's; only each
instance's KV capacity is its own, as a live router scrapes it.

Deterministic: no wall clock, no unseeded randomness; the policy's RNG is seeded, the
fleet's variation by its own seed.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_interface.kv_events import KVEventBatch
from enginesim.engine import EngineConfig, EngineCore, EngineRequestError, GlobalKVTier
from enginesim.engine.fleet import FleetVariation, instance_hardware
from enginesim.engine.transfer import DEFAULT_HOLD_TIMEOUT
from enginesim.replay.policy_costs import fill_coefficients
from enginesim.replay.traces import TraceRecord, synthesize_tokens
from router_worker.routing import (
    ClusterState,
    GlobalTier,
    Health,
    NoEligibleInstanceError,
    RequestLifecycle,
    build_features,
    choose_migrations,
    make_policy,
)
from router_worker.routing.disagg import (
    DeciderParams,
    MemberView,
    decide_split,
    in_decode_pool,
    in_prefill_pool,
    pool_views,
)
from router_worker.routing.features import DEFAULT_TENANT
from router_worker.routing.flow import (
    PRIORITIES,
    TENANT_NAME,
    FleetLoad,
    FlowController,
    FlowParams,
    FlowRequest,
    Refusal,
    TenantSettings,
)
from router_worker.routing.grey import GreyDetector, GreyParams, GreyTransition
from router_worker.routing.lifecycle import (
    NO_OBSERVERS,
    Attempt,
    LifecycleObservers,
)
from router_worker.routing.peer_accounting import (
    PeerReports,
    apply_peer_dispatch,
    apply_peer_end,
    apply_peer_first_token,
)
from router_worker.routing.quota import QuotaCharge, QuotaLedger
from router_worker.routing.saturation import fleet_saturation

ARRIVAL, TELEMETRY, FAULT, ENGINE, SCRAPE = range(5)
FAULT_ACTIONS = ("fail", "drain", "restore", "slow")
# An idle stretch longer than this (simulated seconds, nothing in flight) is not scraped
# tick by tick: its last IDLE_LEAD_TICKS ticks are (`Simulator._next_scrape`).
IDLE_SKIP_S = 600.0
IDLE_LEAD_TICKS = 5
ROUTER_SPREADS = ("round_robin", "random", "session")


@dataclass(frozen=True)
class Fault:
    """``action`` (fail | drain | restore | slow) on instance ``instance`` at virtual
    ``time``; ``slow``: its engine runs ``factor`` times slower from then (``restore``
    brings it back to its own speed)."""

    time: float
    instance: int
    action: str
    factor: float = 1.0

    @classmethod
    def parse(cls, action: str, spec: str) -> Fault:
        """``"3@600"`` → instance 3 at t = 600 s; ``slow``: ``"3@600x3"``, 3 times slower."""
        instance, _, when = spec.partition("@")
        when, _, factor = when.partition("x") if action == "slow" else (when, "", "")
        shape = "INSTANCE@SECONDSxFACTOR" if action == "slow" else "INSTANCE@SECONDS"
        try:
            fault = cls(float(when), int(instance.lstrip("i")), action, float(factor or 1.0))
        except ValueError:
            raise ValueError(f"bad {action} spec {spec!r}; expected {shape}") from None
        if action not in FAULT_ACTIONS or fault.factor <= 0 or (action == "slow" and not factor):
            raise ValueError(f"bad {action} spec {spec!r}; expected {shape}")
        return fault


@dataclass
class SimConfig:
    instances: int = 16
    gpu: str = "h20"
    model: str = "qwen2-7b"
    max_model_len: int = 0  # 0 = the model's
    # the engines' share of GPU memory (vLLM's --gpu-memory-utilization): their KV capacity
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int = 0  # KV blocks per instance; 0 = derived from the memory share
    router_block_size: int = 16
    telemetry_delay_s: float = 0.0
    scrape_interval_s: float = 1.0
    kv_events: bool = False
    global_tier_blocks: int = 0  # 0 = no global KV tier
    global_tier_bandwidth: float = 25e9  # bytes/s (PCIe-class), per link
    # Instances per tier link (GlobalKVTier): 0 = one link shared by the whole cluster
    # (the fabric to the pool), K = one per host of K consecutive instances.
    global_tier_link_instances: int = 0
    faults: tuple[Fault, ...] = ()
    max_attempts: int = 3
    # Streams broken by a failed instance continued elsewhere (the live router's
    # router.max_continuations): the prompt and the tokens already generated sent again,
    # the rest of the answer asked for. 0: they fail.
    max_continuations: int = 0
    # Grey-failure detection (router_worker.routing.grey), as a live router runs it: None
    # or not enabled, off.
    grey: GreyParams | None = None
    seed: int = 0
    policy_params: dict[str, Any] = field(default_factory=dict)
    routers: int = 1  # router processes sharing the fleet, each with its own view
    router_spread: str = "round_robin"  # how the load balancer spreads requests over them
    replica_sync: bool = False  # routers share their dispatches with each other
    replica_sync_delay_s: float = 0.0
    # Instances unlike each other and unlike the nominal engine (``gpu`` at speed 1, whose
    # cost coefficients the policies get); the default varies nothing.
    variation: FleetVariation = field(default_factory=FleetVariation)
    # The router's flow control (router_worker.routing.flow), each router its own as live;
    # None: every request is routed on arrival (no quotas either).
    flow: FlowParams | None = None
    tenants: tuple[TenantSettings, ...] = ()
    # Prefill/decode disaggregation (router_worker.routing.disagg): each instance's role
    # (empty: all colocated, the code path of a fleet without roles), the decider's
    # parameters, the decode stage's policy and the link decode instances read over.
    roles: tuple[str, ...] = ()
    decider: dict[str, Any] = field(default_factory=dict)
    decode_policy: str = "decode_room"
    decode_policy_params: dict[str, Any] = field(default_factory=dict)
    kv_link: str = "rdma"
    kv_hold_timeout: float = DEFAULT_HOLD_TIMEOUT

    def __post_init__(self) -> None:
        self.variation.check(self.instances)
        if self.roles:
            if len(self.roles) != self.instances:
                raise ValueError(f"roles: {len(self.roles)} for {self.instances} instances")
            if not any(in_prefill_pool(r) for r in self.roles) or not any(
                in_decode_pool(r) for r in self.roles
            ):
                raise ValueError("roles: a disaggregated cluster needs a prefill and a decode pool")
            DeciderParams.model_validate(self.decider)
        if self.global_tier_link_instances < 0:
            raise ValueError(
                "global_tier_link_instances must be >= 0 (0: one shared link), "
                f"not {self.global_tier_link_instances}"
            )
        if self.routers < 1:
            raise ValueError(f"routers must be at least 1, not {self.routers}")
        if self.router_spread not in ROUTER_SPREADS:
            raise ValueError(
                f"router_spread {self.router_spread!r} is not one of {', '.join(ROUTER_SPREADS)}"
            )

    def engine_config(self, tier: GlobalKVTier | None) -> EngineConfig:
        """The nominal engine: what the policies' cost coefficients describe."""
        return EngineConfig.for_hardware(
            self.gpu,
            self.model,
            max_model_len=self.max_model_len,
            global_tier=tier,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks=self.num_gpu_blocks,
            kv_link=self.kv_link,
            kv_hold_timeout=self.kv_hold_timeout,
        )

    def engine_configs(self, tier: GlobalKVTier | None) -> list[EngineConfig]:
        """Each instance's engine (one shared object when the fleet does not vary)."""
        return self.variation.engine_configs(
            self.instances,
            self.gpu,
            self.model,
            max_model_len=self.max_model_len,
            global_tier=tier,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks=self.num_gpu_blocks,
            kv_link=self.kv_link,
            kv_hold_timeout=self.kv_hold_timeout,
        )

    @property
    def disaggregated(self) -> bool:
        """Roles were given (all ``both`` too: any instance may prefill for another)."""
        return bool(self.roles)

    @property
    def varied(self) -> bool:
        return self.variation.varies(self.gpu)


@dataclass
class RequestResult:
    """One request's fate. Times are absolute virtual seconds; None = never happened."""

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens_asked: int
    instance: str | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    status: str = "pending"  # ok | rejected | failed | throttled (429) | shed (503)
    attempts: int = 0  # the lifecycle's attempt_count: first try, retries, migrations
    tier_tokens: int | None = None  # of cached_tokens, loaded from the global tier (if any)
    predicted_ttft_s: float | None = None  # what the first decision predicted (if it did)
    tenant: str = DEFAULT_TENANT
    priority: str = "standard"
    queued_s: float = 0.0  # time waiting at flow control (part of its TTFT)
    refusal: str | None = None  # flow control's reason when throttled or shed
    prefill_instance: str | None = None  # split: where it was prefilled
    stage: str | None = None  # disaggregated cluster: decode | whole | fallback
    transfer_bytes: int = 0  # split: KV bytes the decode instance read

    def to_json(self) -> dict[str, Any]:
        keys = (
            "id",
            "arrival_s",
            "instance",
            "prompt_tokens",
            "cached_tokens",
            "output_tokens",
            "first_token_s",
            "finish_s",
            "status",
            "attempts",
        )
        out = {key: getattr(self, key) for key in keys}
        if self.tier_tokens is not None:
            out["tier_tokens"] = self.tier_tokens
        if self.predicted_ttft_s is not None:
            out["predicted_ttft_s"] = self.predicted_ttft_s
        if self.tenant != DEFAULT_TENANT or self.priority != "standard" or self.refusal:
            out.update(tenant=self.tenant, priority=self.priority, queued_s=self.queued_s)
            if self.refusal is not None:
                out["refusal"] = self.refusal
        if self.stage is not None:
            out["stage"] = self.stage
            out["prefill_instance"] = self.prefill_instance
            out["transfer_bytes"] = self.transfer_bytes
        return out


@dataclass
class TierTraffic:
    """Reads from the global KV tier, per instance or summed over a run."""

    bytes_read: int = 0
    hit_tokens: int = 0  # prompt tokens loaded from the tier instead of recomputed
    read_time_s: float = 0.0  # step time spent loading, queueing included
    read_wait_s: float = 0.0  # ... of which queued behind other instances' reads

    def add(self, stats: Any) -> None:
        """Add an engine's ``EngineStats``."""
        self.bytes_read += stats.tier_bytes_read
        self.hit_tokens += stats.external_cache_hits
        self.read_time_s += stats.tier_read_time
        self.read_wait_s += stats.tier_read_wait

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes_read": self.bytes_read,
            "hit_tokens": self.hit_tokens,
            "read_time_s": self.read_time_s,
            "read_wait_s": self.read_wait_s,
        }


@dataclass
class SimResult:
    policy: str
    requests: list[RequestResult]
    instance_ids: list[str]
    sample_times: np.ndarray  # scrape ticks
    pending_samples: np.ndarray  # (ticks, instances) true pending prefill tokens
    busy_time: float  # summed over engines
    hotspot_events: dict[str, int]
    decision_reasons: dict[str, int]
    wall_s: float = 0.0
    hotspot_log: list[Any] = field(default_factory=list)  # every transition, in order
    tier: TierTraffic | None = None  # None: the cluster had no global tier
    tier_by_instance: dict[str, TierTraffic] = field(default_factory=dict)
    migrations: int = 0  # queued requests moved by the policy (abort + send elsewhere)
    # Grey-failure detection's changes of state, every router's, in order (with ``grey``)
    grey_log: list[GreyTransition] = field(default_factory=list)
    # If the fleet varied: the nominal GPU (what the policies were told), the variation
    # and, per instance, what it ran on (instance_hardware); None otherwise
    fleet: dict[str, Any] | None = None
    # The autoscaling signal the (first) router exports, at each scrape tick: (ticks, 2) of
    # queued prefill seconds per healthy instance and KV pressure (routing/saturation.py)
    saturation_samples: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    # A disaggregated cluster: requests split and colocated, KV bytes read, reads failed
    disaggregation: dict[str, Any] | None = None


@dataclass
class _Flight:
    """A request in flight: what the simulator must remember until it ends."""

    record: TraceRecord
    life: RequestLifecycle  # its attempts, their accounting and the retry rule
    result: RequestResult
    slot: int = -1
    estimated_uncached: int = 0
    router: int = 0  # which router took it (the one that accounts and retries it)
    stage: str = "whole"  # prefill | decode | whole | fallback (disaggregated clusters)
    prefill_slot: int = -1  # split: the instance holding its prefilled KV
    sent_tokens: int = 0  # output tokens the client had before the current continuation
    continuing: bool = False  # a continuation sent, its first token not yet out


@dataclass
class _Router:
    """One router process: its own view of the fleet and its own policy object."""

    state: ClusterState
    policy: Any
    peer_reports: PeerReports | None = None  # set with replica sync
    # what this router attaches to its requests' lifecycles
    observers: LifecycleObservers = NO_OBSERVERS
    flow: FlowController | None = None  # with SimConfig.flow
    quota: QuotaLedger = field(default_factory=QuotaLedger)
    waiting: dict[str, tuple[FlowRequest, _Flight, np.ndarray]] = field(default_factory=dict)
    # disaggregation: the prefill and decode pools' views, the decode stage's policy
    pools: tuple[MemberView, MemberView] | None = None
    decode_policy: Any = None


@dataclass
class _Instance:
    engine: EngineCore | None
    generation: int = 0
    wake_version: int = 0
    busy_before: float = 0.0  # busy time of engines this instance lost to failures
    tier_before: TierTraffic = field(default_factory=TierTraffic)  # ... and their tier reads
    kv_buffer: list[Any] = field(default_factory=list)


def check_flow_fields(records: list[TraceRecord]) -> None:
    """Refuse a trace whose tenant or priority the router would refuse, naming the
    request (ValueError)."""
    for record in records:
        if record.tenant is not None and not TENANT_NAME.match(record.tenant):
            raise ValueError(f"request {record.index}: tenant {record.tenant!r} is not a name")
        if record.priority is not None and record.priority not in PRIORITIES:
            raise ValueError(
                f"request {record.index}: priority must be one of {', '.join(PRIORITIES)}, "
                f"not {record.priority!r}"
            )


class Simulator:
    """Replay ``records`` through one policy. ``run()`` once per instance of this class."""

    def __init__(
        self,
        records: list[TraceRecord],
        policy: str,
        config: SimConfig,
        progress: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.records = records
        self.config = config
        self.policy_kind = policy
        # a policy that takes cost coefficients gets this cluster's where none were set
        params = fill_coefficients(
            policy, dict(config.policy_params.get(policy) or {}), config.gpu, config.model
        )
        self.progress = progress
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.tier = (
            GlobalKVTier(config.global_tier_blocks, config.global_tier_bandwidth)
            if config.global_tier_blocks
            else None
        )
        self.engine_configs = config.engine_configs(self.tier)
        # the nominal engine (the policies' model of every instance)
        self.engine_config = (
            config.engine_config(self.tier) if config.varied else self.engine_configs[0]
        )
        self.ids = [f"i{k}" for k in range(config.instances)]
        self.routers = [
            _Router(self._new_state(), make_policy(policy, params, seed=config.seed + k))
            for k in range(config.routers)
        ]
        if config.disaggregated:
            roles = dict(zip(self.ids, config.roles, strict=True))
            self.decider = DeciderParams.model_validate(config.decider)
            for k, router in enumerate(self.routers):
                router.pools = pool_views(router.state, roles)
                router.decode_policy = make_policy(
                    config.decode_policy, config.decode_policy_params, seed=config.seed + k
                )
        self.split_counts = {"split": 0, "colocated": 0, "fallback": 0}
        self.transfer_bytes = 0
        if config.replica_sync and config.routers > 1:
            for k, router in enumerate(self.routers):
                router.peer_reports = PeerReports(_PeerDelivery(self, k), relays_at_once=False)
                router.observers = LifecycleObservers(router.peer_reports)
        if config.flow is not None:
            check_flow_fields(records)
            for router in self.routers:
                router.flow = FlowController(config.flow, config.tenants)
        self.balancer = random.Random(config.seed)
        self.instances = [_Instance(self._new_engine(k)) for k in range(config.instances)]
        self.flights: dict[str, _Flight] = {}
        self.results: list[RequestResult] = []
        self.true_pending = np.zeros(config.instances)
        self.samples: list[np.ndarray] = []
        self.sample_times: list[float] = []
        self.saturation: list[tuple[float, float]] = []
        self.hotspot_events: dict[str, int] = {}
        self.hotspot_log: list[Any] = []
        self.reasons: dict[str, int] = {}
        self.migrations = 0
        self.next_arrival = 0

    # ----------------------------------------------------------------- setup

    @property
    def state(self) -> ClusterState:
        """The first router's view (the only one unless ``routers`` > 1)."""
        return self.routers[0].state

    @property
    def policy(self) -> Any:
        return self.routers[0].policy

    def _new_state(self) -> ClusterState:
        tier = GlobalTier(self.config.global_tier_blocks) if self.tier is not None else None
        state = ClusterState(block_size=self.config.router_block_size, global_tier=tier)
        if self.config.grey is not None and self.config.grey.enabled:
            state.grey = GreyDetector(self.config.grey)
        # each instance's own capacity, as a live router reads it from /metrics
        for instance_id, cfg in zip(self.ids, self.engine_configs, strict=True):
            capacity = cfg.num_gpu_blocks * cfg.block_size // self.config.router_block_size
            state.add_instance(instance_id, capacity_blocks=capacity)
        return state

    def _new_engine(self, slot: int) -> EngineCore:
        sink = None
        if self.config.kv_events:

            def sink(events: list[Any], slot: int = slot) -> None:
                self.instances[slot].kv_buffer.extend(events)

        per_link = self.config.global_tier_link_instances
        return EngineCore(
            self.engine_configs[slot],
            kv_event_sink=sink,
            tier_link=slot // per_link if per_link else 0,
        )

    # ----------------------------------------------------------------- main loop

    def run(self) -> SimResult:
        """Run to the last finish; returns per-request results and sampled series."""
        for fault in sorted(self.config.faults, key=lambda f: f.time):
            self._push(fault.time, FAULT, fault)
        self._push_next_arrival()
        if self.config.scrape_interval_s > 0:
            self._push(0.0, SCRAPE, None)
        handlers: dict[int, Callable[[Any], None]] = {
            ARRIVAL: self._on_arrival,
            ENGINE: self._on_engine_wake,
            TELEMETRY: self._on_telemetry,
            SCRAPE: self._on_scrape,
            FAULT: self._on_fault,
        }
        while self.heap:
            time, _, kind, payload = heapq.heappop(self.heap)
            self.now = max(self.now, time)
            handlers[kind](payload)
        return self._result()

    def _push(self, time: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, kind, payload))

    def _push_next_arrival(self) -> None:
        if self.next_arrival < len(self.records):
            record = self.records[self.next_arrival]
            self._push(record.arrival_s, ARRIVAL, record)
            self.next_arrival += 1

    def _work_left(self) -> bool:
        waiting = any(router.waiting for router in self.routers)
        return bool(self.flights) or waiting or self.next_arrival < len(self.records)

    # ----------------------------------------------------------------- arrivals

    def _on_arrival(self, record: TraceRecord) -> None:
        self._push_next_arrival()
        request_id = f"r{record.index}"
        result = RequestResult(
            request_id, record.arrival_s, record.input_tokens, max(record.output_tokens, 1)
        )
        self.results.append(result)
        tokens = synthesize_tokens(record)
        index = self._balance(record)
        router = self.routers[index]
        tenant = record.tenant or DEFAULT_TENANT
        if router.flow is not None:
            result.tenant, result.priority = (
                tenant,
                router.flow.priority_of(tenant, record.priority),
            )
        features = dataclasses.replace(
            build_features(
                request_id,
                tokens,
                record.arrival_s,
                block_size=self.config.router_block_size,
                session_key=record.session_id,
                turn_index=record.turn,
            ),
            tenant=result.tenant,
            priority=result.priority,
        )
        life = RequestLifecycle(
            features,
            router.policy,
            router.state,
            max_attempts=self.config.max_attempts,
            max_continuations=self.config.max_continuations,
            observers=router.observers,
        )
        flight = _Flight(record, life, result, router=index)
        if router.flow is None or self._admitted(router, flight, tokens):
            self._dispatch(flight, tokens)
        if self.progress is not None:
            self.progress(len(self.results), len(self.records), self.now)

    # ----------------------------------------------------------------- flow control

    def _admitted(self, router: _Router, flight: _Flight, tokens: np.ndarray) -> bool:
        """Flow control for an arrival, as the live router's gate: True to route it now;
        else it waits (released by :meth:`_pump`) or was refused."""
        assert router.flow is not None
        result = flight.result
        settings = router.flow.settings(result.tenant)
        refusal = router.quota.take(settings, result.prompt_tokens, self.now)
        if refusal is not None:
            self._refuse(result, refusal)
            return False
        request = FlowRequest(
            result.id,
            result.tenant,
            result.priority,
            result.prompt_tokens,
            0,
            self.now,
        )
        verdict, evicted = router.flow.offer(request, FleetLoad.of(router.state), self.now)
        self._refuse_waiting(router, evicted)
        if isinstance(verdict, Refusal):
            self._refund(router, result.tenant, result.prompt_tokens, self.now)
            self._refuse(result, verdict)
            return False
        if verdict == "admit":
            return True
        router.waiting[result.id] = (request, flight, tokens)
        self._pump(router)
        return False

    def _pump(self, router: _Router) -> None:
        """Release what the fleet has room for (after a first token, an end, a scrape)."""
        if router.flow is None or not router.waiting:
            return
        load = FleetLoad.of(router.state)
        self._refuse_waiting(router, router.flow.expire(self.now, load))
        for request in router.flow.release(load, self.now):
            _, flight, tokens = router.waiting.pop(request.request_id)
            flight.result.queued_s = self.now - flight.result.arrival_s
            self._dispatch(flight, tokens)

    def _refuse_waiting(self, router: _Router, refused: list[tuple[FlowRequest, Refusal]]) -> None:
        for request, refusal in refused:
            _, flight, _ = router.waiting.pop(request.request_id)
            self._refund(router, request.tenant, request.input_tokens, request.arrived)
            flight.result.queued_s = self.now - flight.result.arrival_s
            self._refuse(flight.result, refusal)

    def _refund(self, router: _Router, tenant: str, tokens: int, charged_at: float) -> None:
        """A request that passed its quota at ``charged_at`` and was not served: its charge
        back, as the live router gives it."""
        if router.flow is not None:
            settings = router.flow.settings(tenant)
            router.quota.refund(QuotaCharge.of(settings, tokens, charged_at))

    def _refuse(self, result: RequestResult, refusal: Refusal) -> None:
        result.status = "throttled" if refusal.status == 429 else "shed"
        result.refusal = refusal.reason
        result.finish_s = self.now

    def _balance(self, record: TraceRecord) -> int:
        """The router the load balancer hands this arrival to."""
        count = self.config.routers
        if count == 1:
            return 0
        spread = self.config.router_spread
        if spread == "session" and record.session_id is not None:
            return zlib.crc32(str(record.session_id).encode()) % count
        if spread == "random":
            return self.balancer.randrange(count)
        return (len(self.results) - 1) % count

    def _dispatch(self, flight: _Flight, tokens: np.ndarray) -> None:
        """Route, account and start a request's first attempt."""
        router = self.routers[flight.router]
        try:
            if router.pools is not None:
                self._decide_split(flight, router.pools)
            attempt = flight.life.route(self._stage_view(flight), self.now)
        except NoEligibleInstanceError:
            result = flight.result
            self._refund(router, result.tenant, result.prompt_tokens, result.arrival_s)
            self._end(flight, "rejected")
            return
        self._start(flight, attempt, tokens)

    # ----------------------------------------------------------------- disaggregation

    def _decide_split(self, flight: _Flight, pools: tuple[MemberView, MemberView]) -> None:
        """The decider, as the live router runs it (RouterCore._route)."""
        prefill, decode = pools
        split = decide_split(self.decider, flight.life.features, prefill, decode)
        flight.stage = "prefill" if split.split else "whole"
        if not split.split and not decode.eligible.any():
            flight.stage = "fallback"
        if split.split:
            flight.life.max_attempts += 1  # the decode attempt is not a retry
        self.split_counts["split" if split.split else "colocated"] += 1
        flight.result.stage = flight.stage

    def _stage_view(self, flight: _Flight) -> Any:
        """The view the flight's stage decides and retries over (Plan.stage_view)."""
        router = self.routers[flight.router]
        if router.pools is None or flight.stage == "fallback":
            return router.state.view()
        return router.pools[0] if flight.stage == "prefill" else router.pools[1]

    def _prefilled(self, flight: _Flight, output: Any) -> None:
        """A split request's prefill finished: its decode attempt is routed and sent
        (the read is the decode engine's); a failed prefill falls back to colocated."""
        life, router = flight.life, self.routers[flight.router]
        del self.flights[flight.result.id]
        self.true_pending[flight.slot] -= flight.estimated_uncached
        life.finish(self.now, 1, ok=output.finish_reason == "length")
        if output.finish_reason == "length":
            flight.prefill_slot, flight.stage = flight.slot, "decode"
            flight.result.stage = "decode"
            flight.result.prefill_instance = self.ids[flight.slot]
            try:
                attempt = life.next_stage(
                    router.decode_policy, self._stage_view(flight), self.now, "decode"
                )
                self._start(flight, attempt, None)
                return
            except NoEligibleInstanceError:
                self._release_hold(flight)
        self._fall_back(flight)

    def _fall_back(self, flight: _Flight) -> None:
        flight.stage = flight.result.stage = "fallback"
        self.split_counts["fallback"] += 1
        router = self.routers[flight.router]
        try:
            attempt = flight.life.next_stage(
                router.policy, router.state.view(), self.now, "fallback"
            )
        except NoEligibleInstanceError:
            self._end(flight, "rejected")
            return
        self._start(flight, attempt, None)

    def _release_hold(self, flight: _Flight) -> None:
        engine = self.instances[flight.prefill_slot].engine
        if engine is not None and engine.release_held(flight.result.id, self.now):
            self._engine_touched(flight.prefill_slot)

    def _landed(self, slot: int) -> None:
        """Reads the decode engine at ``slot`` finished: the prefill side frees them."""
        engine = self.instances[slot].engine
        assert engine is not None
        for request_id, num_bytes, _ in engine.take_landed():
            self.transfer_bytes += num_bytes
            flight = self.flights.get(request_id)
            if flight is not None:
                flight.result.transfer_bytes += num_bytes
                self._release_hold(flight)

    def _start(self, flight: _Flight, attempt: Attempt, tokens: np.ndarray | None) -> None:
        """Send a routed attempt (a first try or a retry); then let a migrating policy
        look at the queues its decision named."""
        decision = attempt.decision
        assert decision is not None
        self._count_decision(decision)
        predicted = decision.details.get("predicted_ttft_s")
        if predicted is not None and flight.life.attempt_count == 1:
            flight.result.predicted_ttft_s = float(predicted)
        if self._send(flight, tokens) and self.routers[flight.router].policy.migrates:
            self._migrate_from(flight.router, flight)

    def _send(self, flight: _Flight, tokens: np.ndarray | None) -> bool:
        """Add the current attempt to its engine and account it; False if rejected. A
        continuation re-sends the prompt with the tokens the client already has and asks
        for the rest."""
        result, life = flight.result, flight.life
        instance_id = life.current.instance
        slot = self.ids.index(instance_id)
        result.attempts = life.attempt_count
        engine = self.instances[slot].engine
        assert engine is not None  # a down instance is never eligible
        try:
            if tokens is None:  # a retry: synthesising again is cheaper than keeping prompts
                tokens = synthesize_tokens(flight.record)
            if flight.sent_tokens:
                tokens = np.concatenate([tokens, _answer_ids(flight.record, flight.sent_tokens)])
            prefill = flight.stage == "prefill"
            rest = result.output_tokens_asked - flight.sent_tokens
            engine.add_request(
                result.id,
                tokens,
                1 if prefill else rest,
                self.now,
                hold_kv=prefill,
                remote_prefill=flight.stage == "decode",
            )
        except EngineRequestError:  # vLLM answers 400: the router sees an error
            # The refusal comes before the router could tell its peers: they never hear.
            life.observers = NO_OBSERVERS
            life.dispatch(self.now)
            life.reject(self.now)
            result.instance = instance_id
            self._end(flight, "rejected")
            return False
        uncached = life.dispatch(self.now)
        flight.slot, flight.estimated_uncached = slot, uncached
        result.instance = instance_id
        self.flights[result.id] = flight
        self.true_pending[slot] += uncached
        self._engine_touched(slot)
        return True

    # ----------------------------------------------------------------- migrations

    def _migrate_from(self, router_index: int, flight: _Flight) -> None:
        """After a dispatch: the moves the policy makes among the requests queued on the
        instances its decision named (``choose_migrations``); carry them out."""
        router = self.routers[router_index]
        unscheduled: set[str] = set()
        for name in flight.life.named_instances:
            engine = self.instances[self.ids.index(name)].engine
            if engine is not None:
                unscheduled |= engine.unscheduled_ids()
        waiting = [
            f.life
            for f in self.flights.values()
            if f.router == router_index and f.result.first_token_s is None
        ]
        moves = choose_migrations(
            flight.life,
            waiting,
            lambda life: life.request_id in unscheduled,
            router.state.view(),
            self.now,
        )
        for move in moves:
            moved = self.flights.get(move.request_id)
            if moved is None:
                continue
            engine = self.instances[moved.slot].engine
            # an abort may let the engine start a step now: ask again before each move
            if engine is not None and move.request_id in engine.unscheduled_ids():
                self._migrate(moved, self.ids.index(move.target))

    def _migrate(self, flight: _Flight, target: int) -> None:
        """Abort a request still waiting in its engine and send it to ``target``."""
        source, request_id = flight.slot, flight.result.id
        engine = self.instances[source].engine
        assert engine is not None  # the request waits in it
        engine.abort(request_id, self.now)
        del self.flights[request_id]
        self._advance(source)  # takes the abort's output (ignored: not in flight) and re-arms
        flight.life.migrate(self.ids[target], self.now)
        self.true_pending[source] -= flight.estimated_uncached
        self.migrations += 1
        self.reasons["migration"] = self.reasons.get("migration", 0) + 1
        self._send(flight, None)

    def _count_decision(self, decision: Any) -> None:
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        for event in decision.events:
            self.hotspot_log.append(event)
            kind = getattr(event, "kind", "event")
            self.hotspot_events[kind] = self.hotspot_events.get(kind, 0) + 1

    def _end(self, flight: _Flight, status: str) -> None:
        flight.result.status = status
        if flight.result.finish_s is None:
            flight.result.finish_s = self.now

    # ----------------------------------------------------------------- engines

    def _engine_touched(self, slot: int) -> None:
        """After any call into an engine: forward its KV events, re-arm its wake-up."""
        instance = self.instances[slot]
        if instance.kv_buffer:
            self._forward_kv_events(slot, instance.kv_buffer)
            instance.kv_buffer = []
        instance.wake_version += 1
        wake = instance.engine.next_event_time() if instance.engine is not None else None
        if wake is not None:
            self._push(max(wake, self.now), ENGINE, (slot, instance.wake_version))

    def _on_engine_wake(self, payload: tuple[int, int]) -> None:
        slot, version = payload
        if version == self.instances[slot].wake_version:
            self._advance(slot)

    def _advance(self, slot: int) -> None:
        engine = self.instances[slot].engine
        if engine is None:
            return
        for output in engine.advance_to(self.now, events_only=True):
            self._on_output(output)
        if engine.landed:
            self._landed(slot)
        self._engine_touched(slot)

    def _on_output(self, output: Any) -> None:
        flight = self.flights.get(output.req_id)
        if flight is None:
            return
        result = flight.result
        if flight.stage == "prefill":  # its one token is not the client's
            if output.finished:
                self._prefilled(flight, output)
            return
        result.output_tokens = flight.sent_tokens + output.num_output_tokens
        if output.first_token_time is not None and result.first_token_s is None:
            self._on_first_token(flight, output)
        elif output.first_token_time is not None and flight.continuing:
            flight.continuing = False  # the continuation's first token: its prefill is done
            self.true_pending[flight.slot] -= flight.estimated_uncached
            self._telemetry(
                output.first_token_time, self._apply_first_token, flight, flight.life.current
            )
        if output.finished:
            result.finish_s = output.finish_time
            result.status = "ok" if output.finish_reason == "length" else "failed"
            del self.flights[result.id]
            self._telemetry(output.finish_time, self._apply_finish, flight, flight.life.current)
            reports = self.routers[flight.router].peer_reports
            if reports is not None:
                reports.engine_finished(flight.life)

    def _on_first_token(self, flight: _Flight, output: Any) -> None:
        result = flight.result
        result.first_token_s = output.first_token_time
        result.cached_tokens = output.num_cached_tokens
        if self.tier is not None:
            result.tier_tokens = output.num_tier_tokens
        self.true_pending[flight.slot] -= flight.estimated_uncached
        self._telemetry(
            output.first_token_time, self._apply_first_token, flight, flight.life.current
        )
        reports = self.routers[flight.router].peer_reports
        if reports is not None:
            reports.engine_first_token(flight.life)

    # ----------------------------------------------------------------- telemetry

    def _telemetry(self, when: float, apply: Callable[..., None], *args: Any) -> None:
        """Apply an indicator update now, or ``telemetry_delay_s`` later (staleness knob)."""
        self._after(self.config.telemetry_delay_s, when, apply, *args)

    def _after(self, delay: float, when: float, apply: Callable[..., None], *args: Any) -> None:
        if delay <= 0:
            apply(when, *args)
        else:
            self._push(when + delay, TELEMETRY, (apply, args))

    def _on_telemetry(self, payload: tuple[Callable[..., None], tuple[Any, ...]]) -> None:
        apply, args = payload
        apply(self.now, *args)

    def _apply_first_token(self, now: float, flight: _Flight, attempt: Attempt) -> None:
        # ignored if the attempt failed over in the meantime
        assert flight.result.first_token_s is not None  # set before this was scheduled
        ttft = flight.result.first_token_s - flight.life.features.arrival_time
        flight.life.first_token(now, ttft, attempt)
        self._pump(self.routers[flight.router])

    def _apply_finish(self, now: float, flight: _Flight, attempt: Attempt) -> None:
        result = flight.result
        flight.life.finish(now, result.output_tokens, ok=result.status == "ok", attempt=attempt)
        router = self.routers[flight.router]
        if router.flow is not None:
            router.flow.served(result.tenant, result.output_tokens)
            settings = router.flow.settings(result.tenant)
            router.quota.add_tokens(settings, result.output_tokens, now)
            self._pump(router)

    def _apply_peer_dispatch(
        self, now: float, router: int, features: Any, instance_id: str, cached_tokens: int
    ) -> None:
        # A report delayed past the instance's death is dropped (as delayed scrapes and KV
        # events are): the death already cleared the slot in every router's view.
        if not self._is_up(self.ids.index(instance_id)):
            return
        for peer in self._peers(router):
            apply_peer_dispatch(peer.state, features, instance_id, now, cached_tokens)

    def _apply_peer_first_token(self, now: float, router: int, request_id: str) -> None:
        for peer in self._peers(router):
            apply_peer_first_token(peer.state, request_id, now)

    def _apply_peer_end(self, now: float, router: int, request_id: str) -> None:
        """A peer's request ended (finished, failed or moved)."""
        for peer in self._peers(router):
            apply_peer_end(peer.state, request_id, now)

    def _peers(self, router: int) -> list[_Router]:
        return [r for k, r in enumerate(self.routers) if k != router]

    def _forward_kv_events(self, slot: int, events: list[Any]) -> None:
        batch = KVEventBatch(self.now, tuple(events))  # one event type, engine to router
        generation = self.instances[slot].generation
        self._telemetry(self.now, self._apply_kv_batch, slot, generation, batch)

    def _apply_kv_batch(self, now: float, slot: int, generation: int, batch: KVEventBatch) -> None:
        if generation == self.instances[slot].generation and self._is_up(slot):
            for router in self.routers:
                router.state.on_kv_event_batch(self.ids[slot], batch, now)

    def _apply_scrape(
        self,
        now: float,
        slot: int,
        generation: int,
        stats: tuple[int, int, float, tuple[float, float]],
    ) -> None:
        if generation == self.instances[slot].generation and self._is_up(slot):
            running, waiting, usage, itl = stats
            for router in self.routers:
                router.state.on_scrape(
                    self.ids[slot],
                    now,
                    running=running,
                    waiting=waiting,
                    kv_usage=usage,
                    itl_totals=itl,
                )

    def _is_up(self, slot: int) -> bool:
        return int(self.state.view().health[slot]) != Health.DOWN

    # ----------------------------------------------------------------- scrapes

    def _on_scrape(self, _: None) -> None:
        for slot, instance in enumerate(self.instances):
            if instance.engine is None:
                continue
            # No advance_to here: between its event times (which next_event_time reports,
            # including every possible admission) an engine's running and waiting counts
            # cannot change, so the lazily advanced engine already reads as of now.
            stats = instance.engine.stats()
            self._telemetry(
                self.now,
                self._apply_scrape,
                slot,
                instance.generation,
                (
                    stats.num_running,
                    stats.num_waiting,
                    stats.kv_usage,
                    instance.engine.itl_totals(self.now),
                ),
            )
        self.sample_times.append(self.now)
        self.samples.append(self.true_pending.copy())
        signal = fleet_saturation(self.state.view())
        self.saturation.append((signal.pending_prefill_s, signal.kv_pressure))
        for router in self.routers:
            self._pump(router)
        if self._work_left():
            self._push(self._next_scrape(), SCRAPE, None)

    def _next_scrape(self) -> float:
        """The next tick; across an idle stretch (nothing in flight, no fault to come) of
        more than `IDLE_SKIP_S` to the next arrival, the tick `IDLE_LEAD_TICKS` before it:
        idle engines read the same at every scrape, and a trace with a day between two
        arrivals (or a tiny rate scale) would otherwise cost a scrape per simulated second
        of nothing."""
        interval = self.config.scrape_interval_s
        tick = self.now + interval
        arrived = len(self.results)
        if self.flights or self.config.faults or arrived >= len(self.records):
            return tick
        gap = self.records[arrived].arrival_s - tick
        if gap <= IDLE_SKIP_S:
            return tick
        return tick + (math.floor(gap / interval) - IDLE_LEAD_TICKS) * interval

    # ----------------------------------------------------------------- faults

    def _on_fault(self, fault: Fault) -> None:
        slot = fault.instance
        if not 0 <= slot < len(self.instances):
            raise ValueError(f"fault names instance {slot}; the cluster has {len(self.ids)}")
        if fault.action == "drain":
            for router in self.routers:
                router.state.set_health(self.ids[slot], Health.DRAINING)
        elif fault.action == "restore":
            self._restore(slot)
        elif fault.action == "slow":
            self._slow(slot, fault.factor)
        elif self.instances[slot].engine is not None:
            self._fail(slot)

    def _slow(self, slot: int, factor: float) -> None:
        """Its engine's steps take ``factor`` times longer from now (1: its own speed)."""
        engine = self.instances[slot].engine
        if engine is None:
            return
        self._advance(slot)  # what completed at the old speed is delivered first
        engine.cost_model.speed = self.engine_configs[slot].speed / factor

    def _fail(self, slot: int) -> None:
        self._advance(slot)  # deliver everything that completed by now first
        instance = self.instances[slot]
        assert instance.engine is not None  # called for a live instance only
        stats = instance.engine.stats()
        instance.busy_before += stats.busy_time
        instance.tier_before.add(stats)
        instance.engine, instance.kv_buffer = None, []
        instance.generation += 1
        victims = [f for f in self.flights.values() if f.slot == slot]
        for router in self.routers:
            router.state.remove_instance(self.ids[slot])
        for flight in victims:
            result = flight.result
            del self.flights[result.id]
            view = self._stage_view(flight)
            # the lifecycle's retry rule: decide again without this instance, before the
            # first token only (the engine's, not yet the delayed telemetry's)
            verdict = flight.life.fail(
                view, self.now, "instance_down", first_byte=result.first_token_s is not None
            )
            if result.first_token_s is None:
                self.true_pending[slot] -= flight.estimated_uncached
            if verdict.why == "continuation":
                flight.sent_tokens, flight.continuing = result.output_tokens, True
            if verdict.attempt is not None:
                self._start(flight, verdict.attempt, None)
                continue
            self._end(flight, "rejected" if verdict.why == "no_instance" else "failed")

    def _restore(self, slot: int) -> None:
        instance = self.instances[slot]
        self._slow(slot, 1.0)
        if instance.engine is None:
            instance.engine = self._new_engine(slot)
            self.true_pending[slot] = 0.0
        for router in self.routers:
            router.state.add_instance(self.ids[slot])  # revives the slot as healthy

    # ----------------------------------------------------------------- result

    def _result(self) -> SimResult:
        busy = sum(
            i.busy_before + (i.engine.stats().busy_time if i.engine else 0.0)
            for i in self.instances
        )
        samples = np.array(self.samples) if self.samples else np.zeros((0, len(self.ids)))
        result = SimResult(
            self.policy_kind,
            self.results,
            list(self.ids),
            np.array(self.sample_times),
            samples,
            busy,
            dict(self.hotspot_events),
            dict(self.reasons),
            hotspot_log=self.hotspot_log,
            migrations=self.migrations,
            saturation_samples=np.array(self.saturation, dtype=float).reshape(-1, 2),
            grey_log=sorted(
                (
                    change
                    for router in self.routers
                    if router.state.grey is not None
                    for change in router.state.grey.take_transitions()
                ),
                key=lambda change: change.at,
            ),
        )
        if self.config.varied:
            result.fleet = self._fleet_record()
        if self.tier is not None:
            self._tier_result(result)
        if self.config.disaggregated:
            result.disaggregation = self._disagg_record()
        return result

    def _disagg_record(self) -> dict[str, Any]:
        counts = self.split_counts
        decided = counts["split"] + counts["colocated"]
        failed = sum(
            i.engine.stats().transfer.failed for i in self.instances if i.engine is not None
        )
        return {
            **counts,
            "split_ratio": counts["split"] / decided if decided else None,
            "transfer_bytes": self.transfer_bytes,
            "transfers_failed": failed,
            "roles": list(self.config.roles),
            "decider": DeciderParams.model_validate(self.config.decider).kind,
            "decode_policy": self.config.decode_policy,
        }

    def _fleet_record(self) -> dict[str, Any]:
        config = self.config
        return {
            "nominal_gpu": config.gpu,
            "variation": config.variation.describe(config.gpu),
            "instances": [
                {"instance": instance_id, **instance_hardware(cfg)}
                for instance_id, cfg in zip(self.ids, self.engine_configs, strict=True)
            ],
        }

    def _tier_result(self, result: SimResult) -> None:
        total = TierTraffic()
        for instance_id, instance in zip(self.ids, self.instances, strict=True):
            traffic = TierTraffic(**instance.tier_before.to_json())
            if instance.engine is not None:
                traffic.add(instance.engine.stats())
            result.tier_by_instance[instance_id] = traffic
            for key, value in traffic.to_json().items():
                setattr(total, key, getattr(total, key) + value)
        result.tier = total


class _PeerDelivery:
    """Where one router's reports to its peers go (``replica_sync``): applied to every
    other router's state through ``peer_accounting`` ``replica_sync_delay_s`` later, as the
    live routers' peer channel delivers them. The router tells its peers of first tokens
    and finishes as the engine emits them (it relays the stream at once), while its own
    accounting of them waits ``telemetry_delay_s``."""

    __slots__ = ("router", "sim")

    def __init__(self, sim: Simulator, router: int) -> None:
        self.sim = sim
        self.router = router

    def dispatched(
        self, request_id: str, instance: str, features: Any, cached_tokens: int | None
    ) -> None:
        assert cached_tokens is not None  # PeerReports sends the accounted count
        self._report(self.sim._apply_peer_dispatch, self.router, features, instance, cached_tokens)

    def first_token(self, request_id: str) -> None:
        self._report(self.sim._apply_peer_first_token, self.router, request_id)

    def ended(self, request_id: str, ok: bool) -> None:
        self._report(self.sim._apply_peer_end, self.router, request_id)

    def _report(self, apply: Callable[..., None], *args: Any) -> None:
        sim = self.sim
        sim._after(sim.config.replica_sync_delay_s, sim.now, apply, *args)


def _answer_ids(record: TraceRecord, count: int) -> np.ndarray:
    """Token ids standing for the first ``count`` tokens of ``record``'s answer (a
    continuation's re-sent text): private to the request, as a generated answer is."""
    base = 1 << 40 | record.index << 16
    return np.arange(base, base + count, dtype=np.uint64)
