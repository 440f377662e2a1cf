"""Flow control on the wall clock: the step of the request path between intake and the
policy (:mod:`router_worker.ingress` calls :meth:`FlowGate.admit`).

The rules are :mod:`router_worker.routing.flow`'s and :mod:`router_worker.routing.quota`'s
(pure, shared with the replay simulator); this module only drives them: it reads the
fleet's load from the router's :class:`ClusterState`, parks a queued request on a future,
and runs the release (``pump``) when the load may have dropped: a first token or an end
of a request (the lifecycle's observer :class:`FlowAccounting`), and every ``TICK_S``
while requests wait (scrapes change KV usage and engine queues, timeouts fall due).

A request's class comes from its client key's tenant; ``x-switchyard-priority`` may lower
it, never raise it. ``x-slo-ttft-ms`` / ``x-slo-tpot-ms`` are the request's own SLOs (the
names llm-d uses), carried to the policies on :class:`RequestFeatures`. The time a request
waits here counts in its TTFT: the plan's clock starts at its arrival.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from router_worker.contract.config import RouterConfig
from router_worker.contract.telemetry import FLOW_SUMMARY_S, ClassLane, TenantLane
from router_worker.errors import APIError, BackOff
from router_worker.metrics import RouterMetrics
from router_worker.quota import SharedQuota
from router_worker.routing import ClusterState
from router_worker.routing.features import DEFAULT_TENANT
from router_worker.routing.flow import (
    PRIORITIES,
    FleetLoad,
    FlowController,
    FlowParams,
    FlowRequest,
    Refusal,
    TenantSettings,
)
from router_worker.routing.quota import QuotaCharge
from router_worker.telemetry import WINDOW_S

PRIORITY_HEADER = "x-switchyard-priority"
SLO_TTFT_HEADER = "x-slo-ttft-ms"
SLO_TPOT_HEADER = "x-slo-tpot-ms"
HEADERS = (PRIORITY_HEADER, SLO_TTFT_HEADER, SLO_TPOT_HEADER)
MAX_SLO_MS = 86_400_000.0  # a day
TICK_S = 0.05
LANE_SAMPLES = 100  # the last requests of a class its lane's TTFT and TPOT are of
SHEDS = ("shed", "queue_full", "evicted", "queue_timeout")  # the 503s: the fleet's load
# The load of a fleet with nothing known (no state yet), or not read (flow control off).
UNREAD = FleetLoad(0, 0.0, 1.0, 0.0, 0.0)


# The counts a lane keeps per second of its window: admitted, refused, shed (503),
# requests ended, tokens served.
_ADMITTED, _REFUSED, _SHED, _ENDED, _SERVED = range(5)


@dataclass(slots=True)
class _Lane:
    """A tenant's recent flow control (its lane on the live view): counts per second over
    the last :data:`WINDOW_S` seconds (the window of the live view's other figures), and
    per class the TTFT and TPOT of its last requests in that window."""

    seconds: deque[tuple[int, list[float]]] = field(default_factory=deque)
    samples: dict[str, deque[tuple[float, float | None, float | None]]] = field(
        default_factory=dict
    )

    def add(self, now: float, which: int, amount: float = 1.0) -> None:
        second = int(now)
        if not self.seconds or self.seconds[-1][0] != second:
            self.seconds.append((second, [0.0] * 5))
            self.prune(now)
        self.seconds[-1][1][which] += amount

    def sample(self, now: float, priority: str, ttft: float | None, tpot: float | None) -> None:
        recent = self.samples.get(priority)
        if recent is None:
            recent = self.samples[priority] = deque(maxlen=LANE_SAMPLES)
        recent.append((now, ttft, tpot))

    def prune(self, now: float) -> None:
        """Forget what is older than the window."""
        horizon = now - WINDOW_S
        while self.seconds and self.seconds[0][0] + 1 <= horizon:
            self.seconds.popleft()
        for recent in self.samples.values():
            while recent and recent[0][0] < horizon:
                recent.popleft()

    def totals(self) -> list[float]:
        sums = [0.0] * 5
        for _, counts in self.seconds:
            for which, count in enumerate(counts):
                sums[which] += count
        return sums

    def classes(self) -> dict[str, ClassLane]:
        out = {}
        for priority, recent in self.samples.items():
            if recent:
                ttft = [t for _, t, _ in recent if t is not None]
                tpot = [t for _, _, t in recent if t is not None]
                out[priority] = ClassLane(
                    requests=len(recent), ttft_p50_s=_median(ttft), tpot_p50_s=_median(tpot)
                )
        return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True, slots=True)
class Admission:
    """A request let through flow control: whether it waited (``released``) and what its
    tenant's quota was charged (None: no limits), given back if it is not served."""

    released: bool
    charge: QuotaCharge | None


@dataclass(frozen=True, slots=True)
class RequestClass:
    """Who sent a request and what it asked for."""

    tenant: str = DEFAULT_TENANT
    priority: str = "standard"
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None


def slo_header(headers: dict[str, str], name: str) -> float | None:
    """An SLO header in milliseconds as seconds, or APIError 400 naming it."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not (0 < ms <= MAX_SLO_MS):  # NaN fails too
        raise APIError(
            400, f"{name} must be a number of milliseconds in (0, {MAX_SLO_MS:.0f}]", name
        )
    return ms / 1000.0


class FlowGate:
    """The router's flow control: one controller and quota ledger per process, kept across
    configuration versions (queues and counters survive a config change)."""

    def __init__(
        self,
        metrics: RouterMetrics,
        state: Callable[[], ClusterState | None],
        report: Callable[..., object] = lambda kind, **payload: None,
    ) -> None:
        self.metrics = metrics
        self.state = state
        self.report = report  # telemetry's event(kind, **payload)
        # refusals since the last summary: tenant -> reason -> count (flow_refusals event)
        self.refusals: dict[str, dict[str, int]] = {}
        self._summary_due: asyncio.TimerHandle | None = None
        self._summary_from = 0.0
        self._lanes: dict[str, _Lane] = {}
        self.controller = FlowController(FlowParams())
        self.quota = SharedQuota(None)  # the service gives it the cluster's Redis
        self.in_transit = 0.0  # prompt tokens released and not yet dispatched
        self._waiters: dict[str, tuple[FlowRequest, asyncio.Future[None], QuotaCharge | None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._ids = 0

    def configure(self, config: RouterConfig) -> None:
        self.controller.configure(config.flow, config.tenants)
        self.quota.cluster = config.cluster

    def classify(self, tenant: str, headers: dict[str, str]) -> RequestClass:
        """The request's class from its tenant and headers, or APIError 400 naming the
        header at fault."""
        asked = headers.get(PRIORITY_HEADER)
        if asked is not None and asked not in PRIORITIES:
            raise APIError(
                400, f"{PRIORITY_HEADER} must be one of {', '.join(PRIORITIES)}", PRIORITY_HEADER
            )
        return RequestClass(
            tenant,
            self.controller.priority_of(tenant, asked),
            slo_header(headers, SLO_TTFT_HEADER),
            slo_header(headers, SLO_TPOT_HEADER),
        )

    # ----- admission -------------------------------------------------------------------
    async def admit(self, request_class: RequestClass, input_tokens: int, size: int) -> Admission:
        """Return when the request may go to the policy (released: it waited, its tokens
        then in :attr:`in_transit` until :meth:`landed`); raise :class:`BackOff` (429 or
        503 with Retry-After) when it is refused, its quota charge given back. A request
        cancelled while it waits (its client left) leaves the queue, its charge given
        back too."""
        now = time.time()
        tenant, priority = request_class.tenant, request_class.priority
        charge = await self._take(self.controller.settings(tenant), input_tokens, now)
        if isinstance(charge, Refusal):
            raise self._refused(tenant, priority, charge)
        self._ids += 1
        request = FlowRequest(str(self._ids), tenant, priority, input_tokens, size, now)
        # Off (one tenant), the fleet's load is never read: skip gathering it.
        load = self._load() if self.controller.params.enabled else UNREAD
        verdict, evicted = self.controller.offer(request, load, now)
        self._fail(evicted)
        if isinstance(verdict, Refusal):
            if charge is not None:
                await self.quota.refund(charge)
            raise self._refused(tenant, priority, verdict)
        if verdict == "admit":
            self._count(tenant, priority, "admitted")
            return Admission(False, charge)
        self._count(tenant, priority, "queued")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = (request, waiter, charge)
        self.pump()
        try:
            await waiter
        except asyncio.CancelledError:
            released = waiter.done() and not waiter.cancelled() and waiter.exception() is None
            if self.controller.cancel(request):
                self._count(tenant, priority, "cancelled")
            elif released:
                self.landed(input_tokens)  # released just as the client left
            if self._waiters.pop(request.request_id, None) is not None or released:
                self.refund(charge)  # never served (a refusal's went back in _fail)
            raise
        return Admission(True, charge)

    async def _take(
        self, settings: TenantSettings, tokens: int, now: float
    ) -> QuotaCharge | Refusal | None:
        """The quota check; if the client leaves while Redis counts it, the charge it then
        makes is given back (the script runs anyway once sent)."""
        limited = settings.requests_per_minute or settings.tokens_per_minute
        if self.quota.redis_url is None or not (limited or settings.token_budget):
            return await self.quota.take(settings, tokens, now)  # never suspends
        check = asyncio.ensure_future(self.quota.take(settings, tokens, now))
        try:
            return await asyncio.shield(check)
        except asyncio.CancelledError:
            check.add_done_callback(self._refund_taken)
            raise

    def _refund_taken(self, check: asyncio.Future[QuotaCharge | Refusal | None]) -> None:
        if not check.cancelled() and check.exception() is None:
            charge = check.result()
            if isinstance(charge, QuotaCharge):
                self.refund(charge)

    def refund(self, charge: QuotaCharge | None) -> None:
        """A request that passed the quota was not served: its charge goes back."""
        if charge is not None:
            self.quota.refund_soon(charge)

    def landed(self, input_tokens: float) -> None:
        """A released request was dispatched (or ended before): its tokens are in the
        indicators now (or nowhere)."""
        self.in_transit = max(0.0, self.in_transit - input_tokens)

    def served(self, tenant: str, output_tokens: int) -> None:
        """A request of ``tenant`` ended with ``output_tokens``: its tenant's counter and
        token quota grow, and the fleet may have room."""
        self.controller.served(tenant, output_tokens)
        self.quota.add_tokens(self.controller.settings(tenant), output_tokens, time.time())
        self.poke()

    def ended(
        self,
        tenant: str,
        priority: str,
        tokens: float,
        ttft: float | None,
        tpot: float | None,
    ) -> None:
        """A request of ``tenant`` in class ``priority`` ended (its lane's counts)."""
        now = time.time()
        lane = self._lane(tenant)
        lane.add(now, _ENDED)
        lane.add(now, _SERVED, tokens)
        lane.sample(now, priority, ttft, tpot)

    def lanes(self, now: float | None = None) -> dict[str, TenantLane]:
        """The tenants active in the last :data:`WINDOW_S` seconds or waiting now, with
        their settings now, for the live view (a lane idle for a window is forgotten)."""
        now = time.time() if now is None else now
        waiting = self.controller.waiting()
        out = {}
        for tenant, lane in list(self._lanes.items()):
            lane.prune(now)
            admitted, refused, shed, ended, served = lane.totals()
            classes = lane.classes()
            if not lane.seconds and not classes and tenant not in waiting:
                del self._lanes[tenant]
                continue
            settings = self.controller.settings(tenant)
            every = [sample for recent in lane.samples.values() for sample in recent]
            out[tenant] = TenantLane(
                priority=settings.priority,
                weight=settings.weight,
                requests=int(ended),
                admitted=int(admitted),
                queued=waiting.get(tenant, 0),
                refused=int(refused),
                shed=int(shed),
                served_tokens=served,
                ttft_p50_s=_median([t for _, t, _ in every if t is not None]),
                tpot_p50_s=_median([t for _, _, t in every if t is not None]),
                classes=classes,
            )
        return out

    def _lane(self, tenant: str) -> _Lane:
        lane = self._lanes.get(tenant)
        if lane is None:
            lane = self._lanes[tenant] = _Lane()
        return lane

    def poke(self) -> None:
        """The load may have dropped (a first token, an end): release what fits now."""
        if self.controller.queued:
            self.pump()

    # ----- release ---------------------------------------------------------------------
    def pump(self) -> None:
        now = time.time()
        load = self._load()
        self._fail(self.controller.expire(now, load))
        for request in self.controller.release(load, now):
            entry = self._waiters.pop(request.request_id, None)
            if entry is None:
                continue
            if entry[1].done():  # its client left: it goes nowhere
                self.refund(entry[2])
                continue
            self.in_transit += request.input_tokens
            self._count(request.tenant, request.priority, "released")
            entry[1].set_result(None)
        self._publish_queues()
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.controller.queued:
            self._timer = asyncio.get_running_loop().call_later(TICK_S, self.pump)

    def _load(self) -> FleetLoad:
        state = self.state()
        load = UNREAD if state is None else FleetLoad.of(state)
        saturated = self.controller.saturated(load, self.in_transit)
        self.metrics.flow_saturated.set(1 if saturated else 0)
        self.metrics.flow_backlog_bound.set(self.controller.bound_s)
        self.metrics.flow_step.set(load.step_s)
        if not self.in_transit:
            return load
        return FleetLoad(
            load.healthy,
            load.pending_tokens + self.in_transit,
            load.clear_rate,
            load.kv_usage,
            load.waiting_per_instance,
            load.step_s,
        )

    def _fail(self, refused: list[tuple[FlowRequest, Refusal]]) -> None:
        for request, refusal in refused:
            entry = self._waiters.pop(request.request_id, None)
            error = self._refused(request.tenant, request.priority, refusal)
            if entry is not None:
                self.refund(entry[2])
                if not entry[1].done():
                    entry[1].set_exception(error)

    def _refused(self, tenant: str, priority: str, refusal: Refusal) -> BackOff:
        self._count(tenant, priority, refusal.reason)
        reasons = self.refusals.setdefault(tenant, {})
        reasons[refusal.reason] = reasons.get(refusal.reason, 0) + 1
        if self._summary_due is None:  # the first of an interval: summarised at its end
            self._summary_from = time.time()
            loop = asyncio.get_running_loop()
            self._summary_due = loop.call_later(FLOW_SUMMARY_S, self.summarise)
        return BackOff(refusal.status, refusal.message, refusal.retry_after_s)

    def summarise(self) -> None:
        """Report the refusals since the last summary as one event (the control plane
        keeps it in the audit): one row a minute per router, not one per request."""
        self._summary_due = None
        if self.refusals:
            interval = round(time.time() - self._summary_from, 3)
            self.report("flow_refusals", interval_s=interval, tenants=self.refusals)
            self.refusals = {}

    def _count(self, tenant: str, priority: str, outcome: str) -> None:
        m = self.metrics
        m.child(m.flow_requests, tenant, priority, outcome).inc()
        if outcome in ("admitted", "released"):
            self._lane(tenant).add(time.time(), _ADMITTED)
        elif outcome not in ("queued", "cancelled"):
            lane, now = self._lane(tenant), time.time()
            lane.add(now, _REFUSED)
            if outcome in SHEDS:
                lane.add(now, _SHED)

    def _publish_queues(self) -> None:
        m = self.metrics
        for (tenant, priority), count in self.controller.waiting_by_class().items():
            m.child(m.flow_queued, tenant, priority).set(count)
