"""Flow control: which request goes to the policy now, which waits, which is refused.

A step of the request path before the policy picks an instance, shared by the live router
(:mod:`router_worker.flow_gate` drives it on the wall clock) and the replay simulator.
Pure: no I/O, no clock (every method takes ``now``), no asyncio.

* **Saturation** (:class:`FleetLoad`, :meth:`FlowParams.saturated`): from what the router
  already knows of the fleet: the pending prefill tokens against what the healthy
  instances clear per second (their measured prefill throughput), their KV usage, and the
  requests waiting in their engine queues. Not saturated: a request goes on at once.
* **Queues**: while the fleet is saturated, requests wait in one FIFO queue per tenant,
  bounded per tenant and overall, in requests and in bytes.
* **Release**: strict priority between classes (critical, standard, sheddable); within a
  class the tenant with the smallest virtual token counter goes first: the Virtual Token
  Counter of Sheng et al., "Fairness in Serving Large Language Models" (OSDI '24). A
  tenant's counter grows by the input tokens of each request it is served and by
  ``output_token_weight`` × its output tokens, both divided by its share ``weight``; a
  tenant that starts waiting is lifted to the smallest counter of those already waiting
  in its class, so idle time is not saved up as credit (the paper's rule).
* **Refusals**, each with a status that says why and a ``Retry-After``: a sheddable
  request arriving at a saturated fleet is shed (503); a tenant whose own queue is full is
  told to back off (429); a full router queue evicts the newest request of a lower class
  than the arriving one (503) or else refuses the arrival (503); a request waiting longer
  than ``queue_timeout_s`` is refused (503). Nothing is dropped silently: every request
  offered is admitted, released, or given back with a :class:`Refusal`.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from router_worker.routing.features import DEFAULT_TENANT
from router_worker.routing.indicators import ClusterState, Health

Priority = Literal["critical", "standard", "sheddable"]
PRIORITIES: tuple[Priority, ...] = ("critical", "standard", "sheddable")
RANK: dict[str, int] = {name: rank for rank, name in enumerate(PRIORITIES)}
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEALTHY = int(Health.HEALTHY)  # an Enum lookup costs µs on the hot path
BUDGET_PERIODS: dict[str, int] = {"hour": 3600, "day": 86_400, "week": 7 * 86_400}


class TenantSettings(BaseModel):
    """One tenant as the routers know it (the control plane validates with this class)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Unique within the cluster; `default` holds keyless requests.")
    priority: Priority = Field(
        default="standard",
        description="Class: critical is released first, sheddable shed first when saturated.",
    )
    weight: float = Field(
        default=1.0, gt=0, le=1000, description="Share of the fleet within its class."
    )
    requests_per_minute: int | None = Field(
        default=None, ge=1, le=10**9, description="Requests a minute (none: no limit)."
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Prompt and output tokens a minute (none: no limit).",
    )
    token_budget: int | None = Field(
        default=None,
        ge=1,
        le=10**15,
        description="Tokens per budget period (none: no budget).",
    )
    budget_period: Literal["hour", "day", "week"] = Field(
        default="day", description="The period the token budget renews."
    )
    max_queued: int = Field(
        default=256, ge=0, le=100_000, description="Requests of this tenant that may wait."
    )
    max_queued_bytes: int = Field(
        default=64 * 1024**2,
        ge=0,
        le=64 * 1024**3,
        description="Body bytes of this tenant's waiting requests.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, value: str) -> str:
        if not TENANT_NAME.match(value):
            raise ValueError("use 1-64 letters, digits, '.', '_' or '-', starting alphanumeric")
        return value


class FlowParams(BaseModel):
    """The router's flow-control knobs (``flow`` in the router configuration)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True,
        description="Off: every request goes on at once. Unset in a router's document: on "
        "when the document lists tenants, off otherwise.",
    )
    max_backlog_s: float = Field(
        default=0.5,
        gt=0,
        le=600,
        description="Saturated when the pending prefill tokens would take the healthy "
        "instances longer than this to clear at their measured prefill throughput.",
    )
    max_kv_usage: float = Field(
        default=0.95, gt=0, le=1, description="Saturated at this mean KV usage."
    )
    max_waiting_per_instance: float = Field(
        default=8.0,
        gt=0,
        le=100_000,
        description="Saturated at this many requests waiting per engine queue (scraped).",
    )
    max_queued: int = Field(
        default=512,
        ge=0,
        le=100_000,
        description="Requests waiting; below router.max_concurrency, since a waiting "
        "request holds its concurrency slot (the rest serve the requests in flight). Left "
        "at its default on a router with fewer slots, half of them.",
    )
    max_queued_bytes: int = Field(
        default=256 * 1024**2, ge=0, le=64 * 1024**3, description="Body bytes waiting."
    )
    queue_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="A request waiting longer is refused (503)."
    )
    min_retry_after_s: int = Field(
        default=1, ge=1, le=3600, description="The smallest Retry-After given."
    )
    tpot_slo_s: float | None = Field(
        default=None,
        gt=0,
        le=60,
        description="The TPOT SLO the fleet serves (seconds per output token). Set, flow "
        "control keeps the engines' step time (the mean inter-token latency they report, "
        "over the last scrape interval) under tpot_target × it: while the step time is "
        "over that target, the backlog bound shrinks by the overshoot (× target ÷ step time "
        "every backlog_halving_s); while under, it grows back toward max_backlog_s by "
        "max_backlog_s × backlog_growth per second (AIMD). None: the bound stays "
        "max_backlog_s.",
    )
    tpot_target: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="The step time flow control steers to, as a fraction of tpot_slo_s: "
        "the headroom that lets the requests it admits meet the SLO while the bound moves "
        "(chosen on bench/fairness's selection cells; 0.6-0.8 gave the same goodput).",
    )
    backlog_halving_s: float = Field(
        default=1.0,
        gt=0,
        le=600,
        description="The decrease's time constant: while the step time is over target "
        "the backlog bound is multiplied by target ÷ step time every this many seconds "
        "(halved each second at twice the target; about one decrease per scrape).",
    )
    backlog_growth: float = Field(
        default=0.1,
        gt=0,
        le=100,
        description="While the step time is under target the backlog bound grows by "
        "max_backlog_s × this per second (0.1: back from nothing in 10 s).",
    )
    output_token_weight: float = Field(
        default=2.0,
        ge=0,
        le=100,
        description="Weight of an output token against an input token in the virtual "
        "token counters (the paper's w_q/w_p).",
    )

    def saturated(
        self, load: FleetLoad, extra_tokens: float = 0.0, bound_s: float | None = None
    ) -> bool:
        """Whether the fleet is saturated, with ``extra_tokens`` more prefill pending,
        against the backlog bound ``bound_s`` (the controller's, adapted to the TPOT SLO;
        None: ``max_backlog_s``)."""
        if load.healthy == 0:
            return False  # nothing to wait for: the policy answers 503
        backlog = (load.pending_tokens + extra_tokens) / load.clear_rate
        return (
            backlog > (self.max_backlog_s if bound_s is None else bound_s)
            or load.kv_usage >= self.max_kv_usage
            or load.waiting_per_instance >= self.max_waiting_per_instance
        )

    def backlog_s(self, load: FleetLoad) -> float:
        return load.pending_tokens / load.clear_rate if load.healthy else 0.0


@dataclass(slots=True)
class FleetLoad:
    """What the saturation detector reads of the fleet (healthy instances only)."""

    healthy: int
    pending_tokens: float  # prompt tokens dispatched and not yet prefilled
    clear_rate: float  # tokens/s the healthy instances prefill (measured; > 0)
    kv_usage: float  # mean KV usage, 0 where never scraped
    waiting_per_instance: float  # mean scraped engine queue
    # The step time the engines ran at: their mean inter-token latency over the last scrape
    # interval, weighted by tokens (nan: no token known).
    step_s: float = math.nan

    @classmethod
    def of(cls, state: ClusterState) -> FleetLoad:
        """Read on every request (a few µs: no masks when every instance is healthy)."""
        healthy = state.health == _HEALTHY
        count = int(np.count_nonzero(healthy))
        if count == 0:
            return cls(0, 0.0, 1.0, 0.0, 0.0)
        if count == len(healthy):
            pending, tps = state.pending, state.tps
            kv, waiting = state.kv_usage_or_zero, state.waiting
            step_sum, step_count = state.step_sum, state.step_count
        else:
            pending, tps = state.pending[healthy], state.tps[healthy]
            kv, waiting = state.kv_usage_or_zero[healthy], state.waiting[healthy]
            step_sum, step_count = state.step_sum[healthy], state.step_count[healthy]
        tokens = float(step_count.sum())
        return cls(
            count,
            float(pending.sum()),
            max(float(tps.sum()), 1e-9),
            float(kv.sum()) / count,
            sum(w for w in waiting.tolist() if w == w) / count,  # never scraped: nan
            float(step_sum.sum()) / tokens if tokens > 0 else math.nan,
        )


@dataclass(slots=True)
class FlowRequest:
    """A request as flow control sees it."""

    request_id: str
    tenant: str
    priority: str  # one of PRIORITIES
    input_tokens: int
    size_bytes: int
    arrived: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: its HTTP status (429: this tenant must back off; 503: the
    fleet is overloaded), a ``Retry-After`` in whole seconds, and the reason."""

    status: int
    retry_after_s: int
    reason: str  # shed | tenant_queue_full | queue_full | evicted | queue_timeout | quota
    message: str


Verdict = Literal["admit", "queue"]


@dataclass(slots=True)
class _Tenant:
    # One FIFO per class: a request that lowered its class waits behind its own class.
    queues: tuple[deque[FlowRequest], ...] = field(
        default_factory=lambda: tuple(deque() for _ in PRIORITIES)
    )
    queued: int = 0
    queued_bytes: int = 0
    counter: float = 0.0  # virtual tokens served, divided by the weight

    def head(self) -> tuple[int, deque[FlowRequest]] | None:
        """The tenant's highest class with a request waiting, and its queue."""
        for rank, queue in enumerate(self.queues):
            if queue:
                return rank, queue
        return None

    def all(self) -> Iterable[FlowRequest]:
        for queue in self.queues:
            yield from queue


class FlowController:
    """Per-tenant queues, strict priority between classes, token-fair within one."""

    def __init__(self, params: FlowParams, tenants: Iterable[TenantSettings] = ()) -> None:
        self.params = params
        self.tenants: dict[str, TenantSettings] = {}
        self._state: dict[str, _Tenant] = {}
        self.queued = 0
        self.queued_bytes = 0
        self.bound_s = params.max_backlog_s  # the backlog bound, adapted to the TPOT SLO
        self._adapted_at: float | None = None
        self.configure(params, tenants)

    # ----- configuration ----------------------------------------------------------------
    def configure(self, params: FlowParams, tenants: Iterable[TenantSettings]) -> None:
        """New settings. Queues and counters stay: a tenant removed keeps its waiting
        requests, released under the default tenant's settings. The TPOT leg's bound
        starts at ``max_backlog_s`` when the leg turns on and carries over (within the
        new ``max_backlog_s``) while it stays on."""
        if params.tpot_slo_s is None or self.params.tpot_slo_s is None:
            self.bound_s = params.max_backlog_s
            self._adapted_at = None
        else:
            self.bound_s = min(self.bound_s, params.max_backlog_s)
        self.params = params
        self.tenants = {tenant.name: tenant for tenant in tenants}
        self.tenants.setdefault(DEFAULT_TENANT, TenantSettings(name=DEFAULT_TENANT))

    def settings(self, tenant: str) -> TenantSettings:
        return self.tenants.get(tenant) or self.tenants[DEFAULT_TENANT]

    def priority_of(self, tenant: str, requested: str | None) -> Priority:
        """The tenant's class, or a lower one the request asked for (never a higher)."""
        own = self.settings(tenant).priority
        if requested is None or requested not in RANK or RANK[requested] <= RANK[own]:
            return own
        return PRIORITIES[RANK[requested]]

    # ----- saturation -------------------------------------------------------------------
    def adapt(self, load: FleetLoad, now: float) -> None:
        """Move the backlog bound by the engines' step time against the TPOT target
        (AIMD): over target for ``dt`` seconds it is multiplied by (target ÷ step
        time)^(dt / backlog_halving_s), a decrease as deep as the overshoot (a fixed
        halving stalled admission for seconds after each mild excursion: the bench's
        selection cells); under (or no token measured) it grows by ``max_backlog_s ×
        backlog_growth × dt``, up to ``max_backlog_s``. Without a TPOT SLO it stays
        ``max_backlog_s``. The step time is the last scrape interval's, unsmoothed: an
        average over seconds lags, and the bound then swings deeper (the bench's
        exploration: a 3 s EWMA halved the compliant tenant's goodput at 2×)."""
        params = self.params
        if params.tpot_slo_s is None:
            return
        last, self._adapted_at = self._adapted_at, now
        if last is None or now <= last:
            return
        dt = now - last
        target = params.tpot_target * params.tpot_slo_s
        if load.step_s >= target:  # False while nan
            self.bound_s *= (target / load.step_s) ** (dt / params.backlog_halving_s)
        else:
            grown = self.bound_s + params.max_backlog_s * params.backlog_growth * dt
            self.bound_s = min(grown, params.max_backlog_s)

    def saturated(self, load: FleetLoad, extra_tokens: float = 0.0) -> bool:
        """Whether the fleet is saturated, against the adapted backlog bound."""
        return self.params.saturated(load, extra_tokens, self.bound_s)

    # ----- arrivals ---------------------------------------------------------------------
    def offer(
        self, request: FlowRequest, load: FleetLoad, now: float
    ) -> tuple[Verdict | Refusal, list[tuple[FlowRequest, Refusal]]]:
        """An arriving request: admitted (charged at once), queued (call :meth:`release`),
        or refused; with the queued requests it evicted to make room."""
        params = self.params
        if not params.enabled:
            self.charge(request.tenant, request.input_tokens)
            return "admit", []
        self.adapt(load, now)
        if self.queued == 0 and not params.saturated(load, 0.0, self.bound_s):
            self.charge(request.tenant, request.input_tokens)
            return "admit", []
        saturated = params.saturated(load, 0.0, self.bound_s)
        retry = self.retry_after(load)
        if request.priority == "sheddable" and saturated:
            return Refusal(
                503, retry, "shed", "The fleet is saturated: sheddable request shed."
            ), []
        settings = self.settings(request.tenant)
        state = self._state.setdefault(request.tenant, _Tenant())
        if (
            state.queued >= settings.max_queued
            or state.queued_bytes + request.size_bytes > settings.max_queued_bytes
        ):
            message = f"Tenant {request.tenant!r} has too many requests waiting; back off."
            return Refusal(429, retry, "tenant_queue_full", message), []
        evicted = self._make_room(request, retry)
        if evicted is None:
            message = "The fleet is saturated and the router's queue is full."
            return Refusal(503, retry, "queue_full", message), []
        self._enqueue(request, state)
        return "queue", evicted

    def _make_room(
        self, request: FlowRequest, retry: int
    ) -> list[tuple[FlowRequest, Refusal]] | None:
        """Evict the newest requests of classes below the arrival's until it fits; None
        (nothing evicted) if it cannot fit."""
        params = self.params

        def fits(freed: int, freed_bytes: int) -> bool:
            return (
                self.queued - freed < params.max_queued
                and self.queued_bytes - freed_bytes + request.size_bytes <= params.max_queued_bytes
            )

        victims: list[FlowRequest] = []
        freed_bytes = 0
        candidates = self._newest_below(RANK[request.priority])
        while not fits(len(victims), freed_bytes):
            victim = next(candidates, None)
            if victim is None:
                return None
            victims.append(victim)
            freed_bytes += victim.size_bytes
        message = "Evicted from the router's queue by a request of a higher class."
        refusal = Refusal(503, retry, "evicted", message)
        for victim in victims:
            self._remove(victim)
        return [(victim, refusal) for victim in victims]

    def _newest_below(self, rank: int) -> Iterator[FlowRequest]:
        waiting = [
            r for state in self._state.values() for r in state.all() if RANK[r.priority] > rank
        ]
        waiting.sort(key=lambda r: (-RANK[r.priority], -r.arrived, r.request_id))
        return iter(waiting)

    def _enqueue(self, request: FlowRequest, state: _Tenant) -> None:
        rank = RANK[request.priority]
        if not state.queued:  # starts waiting: no credit saved up while idle
            floor = self._min_counter(rank)
            if floor is not None:
                state.counter = max(state.counter, floor)
        state.queues[rank].append(request)
        state.queued += 1
        state.queued_bytes += request.size_bytes
        self.queued += 1
        self.queued_bytes += request.size_bytes

    def _min_counter(self, rank: int) -> float | None:
        counters = [state.counter for state in self._state.values() if state.queues[rank]]
        return min(counters) if counters else None

    # ----- departures -------------------------------------------------------------------
    def release(self, load: FleetLoad, now: float) -> list[FlowRequest]:
        """The waiting requests to send now, in order, while the fleet (with them added)
        is not saturated. Each is charged its input tokens."""
        released: list[FlowRequest] = []
        extra = 0.0
        if self.params.enabled:
            self.adapt(load, now)
        while self.queued and (not self.params.enabled or not self.saturated(load, extra)):
            request = self._next()
            self._remove(request)
            self.charge(request.tenant, request.input_tokens)
            released.append(request)
            extra += request.input_tokens
        return released

    def _next(self) -> FlowRequest:
        """Highest class first; in it, the smallest counter (then the tenant's name)."""
        best: tuple[int, float, str] | None = None
        for name, state in self._state.items():
            head = state.head()
            if head is None:
                continue
            key = (head[0], state.counter, name)
            if best is None or key < best:
                best = key
        assert best is not None
        return self._state[best[2]].queues[best[0]][0]

    def expire(self, now: float, load: FleetLoad) -> list[tuple[FlowRequest, Refusal]]:
        """Requests that waited longer than ``queue_timeout_s``: refused (503)."""
        limit = now - self.params.queue_timeout_s
        late = [r for state in self._state.values() for r in state.all() if r.arrived <= limit]
        refusal = Refusal(
            503,
            self.retry_after(load),
            "queue_timeout",
            f"The fleet stayed saturated for {self.params.queue_timeout_s:g} s.",
        )
        for request in late:
            self._remove(request)
        return [(request, refusal) for request in late]

    def cancel(self, request: FlowRequest) -> bool:
        """The client went away while ``request`` waited; False if it no longer waits."""
        state = self._state.get(request.tenant)
        if state is None or request not in state.queues[RANK[request.priority]]:
            return False
        self._remove(request)
        return True

    def _remove(self, request: FlowRequest) -> None:
        state = self._state[request.tenant]
        state.queues[RANK[request.priority]].remove(request)
        state.queued -= 1
        state.queued_bytes -= request.size_bytes
        self.queued -= 1
        self.queued_bytes -= request.size_bytes

    # ----- service received -------------------------------------------------------------
    def charge(self, tenant: str, input_tokens: float) -> None:
        """``tenant`` was served ``input_tokens`` (at its release or admission)."""
        state = self._state.setdefault(tenant, _Tenant())
        state.counter += input_tokens / self.settings(tenant).weight

    def served(self, tenant: str, output_tokens: float) -> None:
        """``tenant``'s request produced ``output_tokens`` (at its end)."""
        weight = self.params.output_token_weight / self.settings(tenant).weight
        self._state.setdefault(tenant, _Tenant()).counter += weight * output_tokens

    def counters(self) -> Mapping[str, float]:
        return {name: state.counter for name, state in self._state.items()}

    def waiting(self) -> dict[str, int]:
        """Requests waiting per tenant (tenants with none left out)."""
        return {name: state.queued for name, state in self._state.items() if state.queued}

    def waiting_by_class(self) -> dict[tuple[str, str], int]:
        """Requests waiting per (tenant, class), zeros included for every tenant seen."""
        return {
            (name, priority): len(state.queues[rank])
            for name, state in self._state.items()
            for rank, priority in enumerate(PRIORITIES)
        }

    def retry_after(self, load: FleetLoad) -> int:
        """Seconds a refused client should wait: the fleet's backlog, at least the floor."""
        backlog = self.params.backlog_s(load)
        return max(self.params.min_retry_after_s, math.ceil(min(backlog, 3600.0)))
