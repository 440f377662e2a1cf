"""Where a request's time goes inside the router, stage by stage, always on.

A :class:`StageClock` rides along with each request and is stamped with
``time.perf_counter()`` at each boundary; once the first byte of the answer is on its way
to the client, :meth:`StageTimes.observe` turns the stamps into one observation per stage:

``body``
    request head parsed by the server → request body read by the handler (the wait for
    the event loop to start the handler, admission, and the body's own arrival)
``intake``
    → body parsed, checked, tokenized and hashed
``decide``
    → the policy's decision (and the request's plan)
``connect``
    → an upstream connection in hand (popped from the idle pool, or newly connected)
``send``
    → request head and body written to that connection
``engine``
    → the engine's response head read (the engine's own time, plus the loopback hop)
``first_event``
    → the engine's first complete event (a stream) or its whole answer read
``relay``
    → that event or answer written to the client, response head included

With retries, the upstream stages are those of the attempt that answered.

The histograms are kept here, not in ``prometheus_client`` objects, whose ``observe``
takes two locks and walks the buckets: here it is one bisect and two list updates per
stage on the event loop's thread, and the ``switchyard_router_stage_seconds`` family is
built from the counts at scrape time.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

STAGES = ("body", "intake", "decide", "connect", "send", "engine", "first_event", "relay")
STAGE_BUCKETS = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2e-4,
    3e-4,
    5e-4,
    7.5e-4,
    1e-3,
    2e-3,
    5e-3,
    1e-2,
    2.5e-2,
    0.1,
    1.0,
    10.0,
)


class StageClock:
    """The boundaries of one request's stages (perf_counter seconds; 0.0: not reached)."""

    __slots__ = (
        "admitted",
        "body",
        "connected",
        "decided",
        "event",
        "head",
        "intake",
        "relayed",
        "released",
        "sent",
        "started",
    )

    def __init__(self, started: float) -> None:
        self.started = started
        self.admitted = 0.0  # the concurrency slot taken: stamped only when tracing
        self.released = 0.0  # let through by flow control: stamped only when tracing
        self.body = self.intake = self.decided = 0.0
        self.connected = self.sent = self.head = self.event = self.relayed = 0.0

    def durations(self) -> tuple[float, ...]:
        """Each stage's duration, in :data:`STAGES` order."""
        return (
            self.body - self.started,
            self.intake - self.body,
            self.decided - self.intake,
            self.connected - self.decided,
            self.sent - self.connected,
            self.head - self.sent,
            self.event - self.head,
            self.relayed - self.event,
        )


class StageTimes(Collector):
    """Histograms of the stages' durations, one label value per stage."""

    def __init__(self) -> None:
        self.bounds = STAGE_BUCKETS
        # Per stage: a count per bucket (the last one: above every bound), and the sum.
        self.counts = [[0] * (len(STAGE_BUCKETS) + 1) for _ in STAGES]
        self.sums = [0.0] * len(STAGES)

    def observe(self, clock: StageClock) -> None:
        """Record a request whose first bytes went to the client (at ``clock.relayed``, or
        just now when that is not stamped)."""
        if not clock.relayed:
            clock.relayed = time.perf_counter()
        if not clock.head:  # not through the fast transport (https): no upstream split
            return
        bounds, counts, sums = self.bounds, self.counts, self.sums
        for index, seconds in enumerate(clock.durations()):
            seconds = max(seconds, 0.0)
            counts[index][bisect_left(bounds, seconds)] += 1
            sums[index] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "switchyard_router_stage_seconds",
            "The router's time per request by stage: body, intake (parse, tokenize, hash), "
            "decide, connect (upstream connection from the pool or new), send, engine (to the "
            "engine's response head), first_event (to its first event, or its whole answer), "
            "relay (that written to the client).",
            labels=["stage"],
        )
        for index, stage in enumerate(STAGES):
            cumulative, buckets = 0, []
            for bound, count in zip(
                (*(repr(b) for b in self.bounds), "+Inf"), self.counts[index], strict=True
            ):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([stage], buckets, self.sums[index])
        yield family
