"""The live router and the replay simulator drive one RequestLifecycle alike.

Each test puts one situation through both drivers and compares what the lifecycle holds
afterwards: an engine's refusal (a 4xx live, ``EngineRequestError`` in replay), the
number of attempts (retries and migrations), the 5xx answers behind the poison rule, the
first token, and the accounting of another router's requests.

The live side runs in process: the real :class:`RouterCore` and :class:`Dispatcher` send each
request over the router's own upstream transport (:class:`FastTransport`, real sockets, as
in production) to a private enginesim fleet, whose fault knobs make the situation: a
prompt over the model's context (the engine's 400), ``poison`` (a 500 for one request's
body), ``kill`` (connection refused) and ``hang`` (sent, no answer yet). The replay side
is the real :class:`Simulator`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import numpy as np
import pytest

import enginesim.replay.simulator as simulator_module
import router_worker.observers as observers_module
import router_worker.peers as peers_module
import router_worker.routing.lifecycle as lifecycle_module
from devharness import Fleet, wait_until, wait_until_async
from enginesim.replay.simulator import Fault, SimConfig, Simulator
from enginesim.replay.traces import TraceRecord
from router_worker.access import Detail
from router_worker.connections import DisconnectWatch
from router_worker.contract.config import parse_config
from router_worker.core import RouterCore
from router_worker.dispatch import Dispatcher
from router_worker.intake import Endpoint, take_in
from router_worker.metrics import RouterMetrics
from router_worker.peers import (
    PeerBatch,
    PeerBook,
    PeerDispatch,
    PeerEnd,
    PeerFirstToken,
    PeerKeys,
    PeerSync,
    channel_for,
    encode_batch,
)
from router_worker.plan import Plan
from router_worker.relay import Exchange
from router_worker.routing import (
    Attempt,
    ClusterState,
    ClusterView,
    Decision,
    LifecycleObserver,
    LifecycleObservers,
    Migration,
    Phase,
    QueuedRequest,
    RequestLifecycle,
    RetryVerdict,
    build_features,
    choose_migrations,
    peer_accounting,
)
from router_worker.routing.peer_accounting import PeerReports
from router_worker.routing.policies.round_robin import RoundRobinPolicy
from router_worker.stages import StageClock
from router_worker.telemetry import Telemetry
from router_worker.upstream import FastTransport, Target, Upstream
from tests.replay.helpers import hotspot
from tests.router.helpers import MODEL, kv_fleet

PROMPT = "a question " * 20
# Over qwen2-7b's 32768-token context: the engine answers 400 (vLLM's refusal).
TOO_LONG = [7] * 40_000
# Text in a request body that the ``poison`` fault answers with a 500.
POISON = "poison-pill-5xx"


# ----------------------------------------------------------------- the live driver


@pytest.fixture(scope="module")
def engines() -> Iterator[Fleet]:
    """Three enginesim instances of this module's own: faults are process-wide per fleet,
    so the session fleet other tests share is never touched."""
    with kv_fleet(3) as started:
        yield started


@contextmanager
def faults(fleet: Fleet) -> Iterator[Callable[..., None]]:
    """Yields ``set(instance, mode, **extra)``; every instance is recovered (and
    answering again) afterwards, whatever happened."""

    def set_fault(instance: str, mode: str, **extra: Any) -> None:
        index = int(instance[1:])  # make_core's names: i{k} is the fleet's instance k
        fleet.fault(index, mode, **extra)
        if mode == "kill":  # the port closes in the background
            wait_until(partial(refused, fleet.url(index)), 10, f"{instance} killed", ignore=())

    try:
        yield set_fault
    finally:
        fleet.recover()


def refused(url: str) -> bool:
    """Whether ``url`` refuses connections (its instance is killed)."""
    try:
        httpx.get(url + "/health", timeout=1)
    except httpx.ConnectError:
        return True
    return False


def make_core(
    instances: list[dict[str, Any]], kind: str = "round_robin", **router: Any
) -> RouterCore:
    document = {
        "cluster": "unit",
        "model": MODEL,
        "version": 1,
        "instances": instances,
        "policy": {"kind": kind, "params": {}},
        "router": router,
    }
    core = RouterCore("r-unit", Telemetry("r-unit", None), RouterMetrics())
    core.apply_config(parse_config(document))
    return core


@dataclass
class Call:
    """A routed request and the bytes the router forwards for it."""

    plan: Plan
    raw: bytes
    path: str
    stream: bool


def make_call(
    core: RouterCore, prompt: str | list[int] = PROMPT, stream: bool = False, chat: bool = False
) -> Call:
    runtime = core.runtime
    assert runtime is not None
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    raw = json.dumps(body).encode()
    endpoint: Endpoint = "chat" if chat else "completions"
    intake = take_in(raw, endpoint, runtime.tokenizer, runtime.config.block_size)
    plan = core.plan(runtime, intake, {}, time.perf_counter())
    return Call(plan, raw, f"/v1/{'chat/' if chat else ''}completions", stream)


class Wire(FastTransport):
    """The router's own upstream transport (real sockets); it only notes which instance
    each request was sent to, in order."""

    def __init__(self, urls: dict[str, str]) -> None:
        super().__init__()
        self.names = {(httpx.URL(url).host, httpx.URL(url).port): n for n, url in urls.items()}
        self.sent: list[str] = []

    async def post(
        self,
        target: Target,
        headers: Any,
        body: bytes,
        on_sent: Callable[[], None] | None = None,
        clock: StageClock | None = None,
    ) -> Upstream:
        def sent() -> None:
            self.sent.append(self.names[target.key])
            if on_sent is not None:
                on_sent()

        return await super().post(target, headers, body, sent, clock)


@dataclass
class Served:
    """What the client was sent, and where the request went."""

    messages: list[MutableMapping[str, Any]]
    sent: list[str]

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")

    @property
    def body(self) -> bytes:
        return b"".join(m["body"] for m in self.messages if m["type"] == "http.response.body")


def serve(
    core: RouterCore,
    call: Call,
    alongside: Callable[[Plan], Coroutine[Any, Any, None]] | None = None,
) -> Served:
    """Run the router's dispatch step for ``call`` as the router does, its transport
    configured as the service configures it; ``alongside(plan)`` runs concurrently (what
    the router does meanwhile). The client never leaves."""
    runtime = core.runtime
    assert runtime is not None
    messages: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        messages.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def dispatch(dispatcher: Dispatcher) -> None:
        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(receive, task)
        try:
            await dispatcher.run(
                Exchange(call.plan, call.path, call.raw, call.stream, [], send, watch, Detail.ROUTE)
            )
        finally:
            watch.stop()

    async def run() -> Served:
        wire = Wire(runtime.urls)
        settings = runtime.config.router
        wire.configure(settings.max_response_header_bytes, settings.max_response_bytes)
        dispatcher = Dispatcher(wire)
        try:
            async with asyncio.timeout(60), asyncio.TaskGroup() as group:
                group.create_task(dispatch(dispatcher))
                if alongside is not None:
                    group.create_task(alongside(call.plan))
        finally:
            await wire.aclose()
        return Served(messages, wire.sent)

    return asyncio.run(run())


def requests_total(core: RouterCore, status: int) -> float:
    value = core.metrics.registry.get_sample_value(
        "switchyard_router_requests_total",
        {"policy": "round_robin", "arm": "default", "reason": "cyclic", "status": str(status)},
    )
    return value or 0.0


def strikes(core: RouterCore) -> list[tuple[str, str | None, int]]:
    """(instance, cause, failures) of each instance a failure was held against, from the
    circuit breakers' own book."""
    return [(n, h.last_error, h.failures) for n, h in core.health.instances.items() if h.failures]


def listening_peers(core: RouterCore) -> PeerSync:
    """The real PeerSync, with another router heard from (a heartbeat): it publishes this
    router's requests from now on (not sent here: no Redis loop runs)."""
    assert core.runtime is not None
    keys = PeerKeys("parity-test-peer-key-0123456789")
    sync = PeerSync(core.name, "redis://unused", core.metrics, lambda: core.state, keys=keys)
    sync.configure(core.runtime.config)
    heartbeat = encode_batch("r-peer", "n", time.time(), [], seq=1)
    sync.receive(keys.sign(channel_for(core.runtime.config.cluster), heartbeat), time.time())
    assert sync.publishing
    return sync


def published(sync: PeerSync) -> list[tuple[Any, ...]]:
    """What PeerSync has queued for its peers: ("d", instance) for a dispatch, ("f",) for
    a first token, ("e", ok) for an end."""
    return [(item[0], *item[2:3]) for item in sync._queue]


# ----------------------------------------------------------------- the replay driver


@pytest.fixture
def replay_lives(monkeypatch: pytest.MonkeyPatch) -> list[RequestLifecycle]:
    """Every RequestLifecycle the simulator makes, kept for inspection."""
    lives: list[RequestLifecycle] = []

    class Recorded(RequestLifecycle):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            lives.append(self)

    monkeypatch.setattr(simulator_module, "RequestLifecycle", Recorded)
    return lives


def phases(life: RequestLifecycle) -> list[Phase]:
    return [attempt.phase for attempt in life.attempts]


# ----------------------------------------------------------------- an engine's refusal


def test_an_engines_refusal_is_a_rejected_attempt_live_and_in_replay(engines, replay_lives):
    # live: the engine answers 400 for a prompt over its context (as vLLM does)
    core = make_core(engines.instances())
    core.peers = peers = listening_peers(core)
    call = make_call(core, TOO_LONG)
    served = serve(core, call)
    assert served.status == 400
    assert "maximum context length" in json.loads(served.body)["error"]["message"]
    state = core.state
    assert state is not None
    plan = call.plan
    live = (phases(plan), plan.attempt_count, state.error_count, int(state.in_flight.sum()))
    # replay: the engine refuses a prompt over its context (EngineRequestError)
    sim = Simulator([TraceRecord(0, 0.0, 40000, 4)], "least_load", SimConfig(instances=2))
    result = sim.run().requests[0]
    (life,) = replay_lives
    replayed = (
        phases(life),
        result.attempts,
        sim.state.error_count,
        int(sim.state.in_flight.sum()),
    )
    assert live == replayed == ([Phase.REJECTED], 1, 1, 0)
    assert result.status == "rejected" and served.sent == [plan.instance]  # never retried
    # the live answer still counts as a request served, not a serving error
    assert requests_total(core, 400) == 1
    window = core.telemetry.window_stats(time.time())
    assert (window.requests, window.errors) == (1, 0)
    # peers drop the request's load (they accounted its dispatch)
    assert published(peers) == [("d", plan.instance), ("e", False)]


# ----------------------------------------------------------------- attempts


def test_a_retry_and_a_migration_are_attempts_live(engines):
    """The first attempt's connection is refused (``kill``): a retry. The retry waits on an
    engine that has not answered (``hang``) and is moved as the migration registry moves a
    queued request its policy names (``observers.Migrations``: the plan's ``mover`` called
    with ``migrate_to`` set; tests/router/test_migration.py has dualmap decide a move itself).
    The migration target serves the stream."""
    core = make_core(engines.instances(), "dualmap")  # migrates: streamed attempts movable
    queued = core.migrations.queued
    call = make_call(core, stream=True)
    first = call.plan.instance
    others = [name for name in core.health.instances if name != first]
    moved: list[str] = []  # the retry's instance, then the migration's target
    with faults(engines) as fault:
        fault(first, "kill")
        for name in others:
            fault(name, "hang")

        async def migrate(plan: Plan) -> None:
            await wait_until_async(
                lambda: plan.attempt_count == 2 and plan.request_id in queued, 10, "the retry"
            )
            (target,) = (name for name in others if name != plan.instance)
            moved[:] = [plan.instance, target]
            await asyncio.to_thread(fault, target, "recover")
            # the migration registry holds the retry as movable
            assert queued.pop(plan.request_id) is plan and plan.movable
            assert plan.take_back(target)  # the plan stops its own attempt

        served = serve(core, call, alongside=migrate)
    assert served.status == 200 and served.body.endswith(b"data: [DONE]\n\n")
    assert served.sent == [first, *moved]
    plan = call.plan
    assert phases(plan) == [Phase.FAILED, Phase.MIGRATED, Phase.FINISHED]
    assert plan.attempt_count == 3
    assert core.recent_decisions(1)[0]["attempts"] == 3


def test_migrations_are_attempts_in_replay_as_live(replay_lives):
    config = SimConfig(
        instances=4, scrape_interval_s=0.5, policy_params={"dualmap": {"slo_ttft_s": 1.0}}
    )
    result = Simulator(hotspot(), "dualmap", config).run()
    assert result.migrations > 0
    lives = {life.request_id: life for life in replay_lives}
    for request in result.requests:
        assert request.attempts == lives[request.id].attempt_count
    assert sum(r.attempts for r in result.requests) == len(result.requests) + result.migrations


def test_the_migration_cap_holds_in_replay_as_live(replay_lives):
    """A migration is an attempt: with one attempt allowed, nothing may move (the live
    core tells the policy ``movable`` from the same ``RequestLifecycle.movable``)."""
    config = SimConfig(
        instances=4,
        scrape_interval_s=0.5,
        max_attempts=1,
        policy_params={"dualmap": {"slo_ttft_s": 1.0}},
    )
    result = Simulator(hotspot(), "dualmap", config).run()
    assert result.migrations == 0 and all(r.status == "ok" for r in result.requests)
    capped = SimConfig(**{**config.__dict__, "max_attempts": 2})
    result = Simulator(hotspot(120, 6.0), "dualmap", capped).run()
    assert result.migrations > 0
    assert max(life.attempt_count for life in replay_lives) <= 2


def test_a_retry_with_no_instance_left_adds_no_attempt_live_and_in_replay(
    engines, replay_lives, monkeypatch
):
    # replay: the only instance dies; its requests find no instance to be retried on, and
    # requests arriving while it is down are not routed at all (live: a 503, no attempt)
    records = [TraceRecord(k, 0.05 * k, 3000, 40) for k in range(40)]
    config = SimConfig(instances=1, faults=(Fault(0.5, 0, "fail"), Fault(1.0, 0, "restore")))
    results = Simulator(records, "round_robin", config).run().requests
    lives = {life.request_id: life for life in replay_lives}
    victims = [r for r in results if r.status == "rejected" and r.instance is not None]
    unrouted = [r for r in results if r.status == "rejected" and r.instance is None]
    assert victims and unrouted
    assert all(r.attempts == 1 == lives[r.id].attempt_count for r in victims)
    assert all(r.attempts == 0 == lives[r.id].attempt_count for r in unrouted)
    # live: the only instance refuses the connection (killed); the same verdict leaves
    # the count alone
    core = make_core(engines.instances()[:1])
    verdicts: list[RetryVerdict] = []
    fail = Plan.fail

    def noting(*args: Any, **kwargs: Any) -> RetryVerdict:
        verdicts.append(fail(*args, **kwargs))
        return verdicts[-1]

    monkeypatch.setattr(Plan, "fail", noting)
    call = make_call(core)
    with faults(engines) as fault:
        fault("i0", "kill")
        served = serve(core, call)
    assert served.status == 502 and served.sent == ["i0"]
    assert [(v.why, v.attempt) for v in verdicts] == [("no_instance", None)]
    assert call.plan.attempt_count == 1 and phases(call.plan) == [Phase.FAILED]


# ----------------------------------------------------------------- 5xx answers


def test_the_poison_rule_reads_the_lifecycles_5xx_answers(engines):
    """Every instance answers this request (its body) with a 500 (``poison``): after two
    alike the lifecycle blames the request, and no instance's breaker counts it."""
    core = make_core(engines.instances(), breaker_failures=1)
    call = make_call(core, f"{PROMPT}{POISON}")
    with faults(engines) as fault:
        for name in core.health.instances:
            fault(name, "poison", match=POISON)
        served = serve(core, call)
    assert served.status == 502
    message = json.loads(served.body)["error"]["message"]
    assert "failed on 2 instances alike" in message and "Injected fault: poison" in message
    plan = call.plan
    assert plan.answered_5xx == served.sent and len(served.sent) == 2
    assert strikes(core) == []  # failing alike everywhere: the request's fault, no instance's


def test_a_5xx_is_held_against_its_instance_once_another_serves_the_request(engines):
    """The instance the request goes to first answers it with a 500 (``poison``), the
    next one serves it: then the 5xx counts against the first."""
    core = make_core(engines.instances())
    call = make_call(core, f"{PROMPT}{POISON}")
    first = call.plan.instance
    with faults(engines) as fault:
        fault(first, "poison", match=POISON)
        served = serve(core, call)
    assert served.status == 200 and json.loads(served.body)["usage"]["completion_tokens"] == 4
    plan = call.plan
    assert served.sent[0] == first and len(served.sent) == 2
    assert plan.answered_5xx == [first]
    assert strikes(core) == [(first, "http_5xx", 1)]
    assert phases(plan) == [Phase.FAILED, Phase.FINISHED] and plan.attempt_count == 2


# ----------------------------------------------------------------- the first token


def test_the_first_token_is_accounted_once_from_the_lifecycles_phase(engines, monkeypatch):
    """A streamed chat answer: its first event carries no token (the role), the following
    ones do; the first token is accounted once."""
    core = make_core(engines.instances())
    calls: list[str] = []
    first_token = Plan.first_token

    def noting(plan: Plan, *args: Any, **kwargs: Any) -> bool:
        calls.append(plan.request_id)
        return first_token(plan, *args, **kwargs)

    monkeypatch.setattr(Plan, "first_token", noting)
    call = make_call(core, stream=True, chat=True)
    served = serve(core, call)
    assert served.status == 200
    events = [m["body"] for m in served.messages if m["type"] == "http.response.body"]
    assert b'"delta":{"role":"assistant","content":""}' in events[0]  # no token yet
    assert served.body.count(b'"content":"') >= 2 and served.body.endswith(b"[DONE]\n\n")
    plan = call.plan
    assert calls == [plan.request_id]
    attempt = plan.current
    assert attempt.phase is Phase.FINISHED and attempt.first_token_at is not None
    assert plan.first_token_at is not None  # the TTFT metric's clock
    state = core.state
    assert state is not None
    assert (state.in_flight.sum(), state.decoding.sum(), state.error_count) == (0, 0, 0)


# ----------------------------------------------------------------- peers' requests


NO_ENGINES = [{"name": f"i{k}", "url": f"http://127.0.0.1:{1 + k}"} for k in range(3)]


def test_both_drivers_apply_peers_requests_through_one_helper(monkeypatch):
    calls: dict[str, list[str]] = {"live": [], "replay": []}

    def recording(driver: str, module: Any) -> None:
        for name in ("apply_peer_dispatch", "apply_peer_first_token", "apply_peer_end"):
            helper = getattr(peer_accounting, name)
            assert getattr(module, name) is helper  # no copy of its own

            def wrapped(*args: Any, _helper: Any = helper, _name: str = name) -> Any:
                calls[driver].append(_name)
                return _helper(*args)

            monkeypatch.setattr(module, name, wrapped)

    recording("live", peers_module)
    recording("replay", simulator_module)
    # live: router B applies router A's request (no engine involved)
    core = make_core(NO_ENGINES)
    assert core.state is not None
    book = PeerBook(core.state)
    counts: list[tuple[str, str]] = []
    messages: tuple[PeerDispatch | PeerFirstToken | PeerEnd, ...] = (
        PeerDispatch("ra/1", "i0", 64, None, 16, (1, 2, 3, 4)),
        PeerFirstToken("ra/1"),
        PeerEnd("ra/1", True),
    )
    for seq, message in enumerate(messages, start=1):
        batch = PeerBatch("ra", "n", 1.0, (message,), seq=seq)
        book.apply(batch, 1.0, lambda *c: counts.append(c))
    assert counts == [("applied", "dispatch"), ("applied", "first_token"), ("applied", "end")]
    # replay: two synced routers, one request each way
    records = [TraceRecord(0, 0.0, 800, 4), TraceRecord(1, 0.001, 800, 4)]
    config = SimConfig(instances=2, routers=2, replica_sync=True, scrape_interval_s=0)
    sim = Simulator(records, "least_load", config)
    assert all(r.status == "ok" for r in sim.run().requests)
    assert calls["live"] == ["apply_peer_dispatch", "apply_peer_first_token", "apply_peer_end"]
    assert sorted(calls["replay"]) == sorted(calls["live"] * 2)
    for router in sim.routers:
        assert router.state.in_flight.sum() == 0 and router.state.pending.sum() == 0


# ----------------------------------------------------------------- the migration choice


class Recording(RoundRobinPolicy):
    """A migrating policy that notes what it is shown and moves every movable request to
    ``target``."""

    migrates = True

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.shown: list[list[QueuedRequest]] = []

    def migrations(
        self, view: ClusterView, queued: Sequence[QueuedRequest], now: float
    ) -> list[Migration]:
        self.shown.append(list(queued))
        return [
            Migration(q.features.request_id, q.instance_id, self.target, 1.0)
            for q in queued
            if q.movable
        ]


def test_the_migration_choice_shows_the_policy_the_queues_the_decision_named():
    """``choose_migrations``: the requests waiting on the instances the last decision
    named (chosen one and candidates), in the driver's order, movable only if the driver
    can take them back and the lifecycle allows another attempt."""
    state = ClusterState(block_size=16)
    for name in ("i0", "i1", "i2"):
        state.add_instance(name)
    policy = Recording("i2")
    lives = []
    for k, (instance, candidates) in enumerate([("i0", ()), ("i2", ()), ("i1", ("i0", "i1"))]):
        features = build_features(f"r{k}", list(range(32)), 0.0, block_size=16)
        life = RequestLifecycle(features, policy, state, max_attempts=2)
        decision = Decision(instance, 0, "score", 0, (), np.zeros(3), {"candidates": candidates})
        life.attempts.append(Attempt(instance, decision, "first", 0.0))
        life.decision = decision  # as route() would have it
        life.dispatch(float(k))
        lives.append(life)
    moves = choose_migrations(
        lives[2], lives, lambda life: life.request_id != "r2", state.view(), 5.0
    )
    (shown,) = policy.shown
    assert [(q.features.request_id, q.instance_id, q.dispatch_time) for q in shown] == [
        ("r0", "i0", 0.0),
        ("r2", "i1", 2.0),
    ]
    assert [q.movable for q in shown] == [True, False]  # r2: the driver cannot take it back
    assert shown[1].candidates == ("i0", "i1") and shown[0].uncached_tokens == 32
    assert [(m.request_id, m.source, m.target) for m in moves] == [("r0", "i0", "i2")]
    lives[0].migrate("i2", 5.0)
    lives[0].dispatch(5.0)
    # a migrated request keeps its last decision's candidates, and is out of attempts
    policy.shown.clear()
    choose_migrations(lives[2], lives, lambda life: True, state.view(), 6.0)
    assert [(q.features.request_id, q.movable) for q in policy.shown[0]] == [("r2", True)]
    assert lives[0].decision is lives[0].attempts[0].decision


def test_both_drivers_choose_migrations_through_one_function(monkeypatch):
    calls: dict[str, list[str]] = {"live": [], "replay": []}

    def recording(driver: str, module: Any) -> None:
        assert module.choose_migrations is lifecycle_module.choose_migrations  # no copy

        def wrapped(decided: RequestLifecycle, *args: Any) -> Any:
            calls[driver].append(decided.request_id)
            return lifecycle_module.choose_migrations(decided, *args)

        monkeypatch.setattr(module, "choose_migrations", wrapped)

    recording("live", observers_module)
    recording("replay", simulator_module)
    # replay: dualmap moves requests off a hot instance
    config = SimConfig(
        instances=4, scrape_interval_s=0.5, policy_params={"dualmap": {"slo_ttft_s": 1.0}}
    )
    result = Simulator(hotspot(), "dualmap", config).run()
    assert result.migrations > 0 and len(calls["replay"]) >= len(result.requests)
    # live: a dispatch of a request the router can still take back asks the policy
    core = make_core(NO_ENGINES, "dualmap")
    plan = make_call(core, stream=True).plan

    async def send() -> None:  # sent as the plan's own, movable task
        plan.sent()

    asyncio.run(plan.run_movable(send()))
    assert calls["live"] == [plan.request_id]


# ----------------------------------------------------------------- observers


class Noted(LifecycleObserver):
    """Notes each hook it is told of: (hook, instance, phase)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str, str]] = []

    def _note(self, hook: str, attempt: Attempt) -> None:
        self.heard.append((hook, attempt.instance, attempt.phase.value))

    def routed(self, life: RequestLifecycle, attempt: Attempt) -> None:
        self._note("routed", attempt)

    def sending(self, life: RequestLifecycle, attempt: Attempt) -> None:
        self._note("sending", attempt)

    def dispatched(self, life: RequestLifecycle, attempt: Attempt) -> None:
        self._note("dispatched", attempt)

    def first_token(self, life: RequestLifecycle, attempt: Attempt) -> None:
        self._note("first_token", attempt)

    def ended(self, life: RequestLifecycle, attempt: Attempt) -> None:
        self._note("ended", attempt)

    def closed(self, life: RequestLifecycle, outcome: Any) -> None:
        self.heard.append(("closed", str(outcome), ""))


def test_the_lifecycle_tells_its_observers_each_transition_once():
    """What both drivers' observers (the live router's peers, metrics, telemetry and
    captures; the simulator's peer reports) rely on: each transition once, after the
    accounting (``sending`` before it), late reports and second closes not at all."""
    state = ClusterState(block_size=16)
    for name in ("i0", "i1"):
        state.add_instance(name)
    noted = Noted()
    features = build_features("r0", list(range(32)), 0.0, block_size=16)
    policy = RoundRobinPolicy()
    life = RequestLifecycle(features, policy, state, observers=LifecycleObservers(noted))
    first = life.route(state.view(), 0.0).instance
    life.dispatch(0.1)
    verdict = life.fail(state.view(), 0.2, "http_5xx")
    assert verdict.attempt is not None
    second = verdict.attempt.instance
    life.dispatch(0.3)
    life.migrate(first, 0.4)  # a migration is an attempt, not a decision: no "routed"
    life.dispatch(0.5)
    assert life.first_token(0.6, 0.6) and not life.first_token(0.7, 0.7, life.attempts[0])
    assert life.finish(0.8, 4) and not life.finish(0.9, 4)
    assert life.close(1.0, "served") and not life.close(1.1, "again")
    assert noted.heard == [
        ("routed", first, "routed"),
        ("sending", first, "routed"),
        ("dispatched", first, "dispatched"),
        ("ended", first, "failed"),
        ("routed", second, "routed"),
        ("sending", second, "routed"),
        ("dispatched", second, "dispatched"),
        ("ended", second, "migrated"),
        ("sending", first, "routed"),
        ("dispatched", first, "dispatched"),
        ("first_token", first, "first_token"),
        ("ended", first, "finished"),
        ("closed", "served", ""),
    ]
    # an attempt that fails before it was sent was never dispatched: no "ended"
    noted.heard.clear()
    life = RequestLifecycle(
        build_features("r1", [1, 2], 0.0, block_size=16),
        policy,
        state,
        observers=LifecycleObservers(noted),
    )
    life.route(state.view(), 2.0)
    life.fail(state.view(), 2.1, "connect", final=True)
    assert [hook for hook, *_ in noted.heard] == ["routed"]


def test_both_drivers_tell_peers_from_the_lifecycles_transitions(
    engines, replay_lives, monkeypatch
):
    # live: the first instance answers with a 500, the next serves: peers hear the first
    # dispatch end badly and the second end well (its first token too: a non-streamed
    # request that can be continued is streamed from the engine)
    core = make_core(engines.instances())
    core.peers = peers = listening_peers(core)
    call = make_call(core, f"{PROMPT}{POISON}")
    first = call.plan.instance
    with faults(engines) as fault:
        fault(first, "poison", match=POISON)
        served = serve(core, call)
    assert served.status == 200 and len(served.sent) == 2
    second = served.sent[1]
    assert published(peers) == [
        ("d", first),
        ("e", False),
        ("d", second),
        ("f",),
        ("e", True),
    ]
    assert any(isinstance(o, PeerReports) for o in call.plan.observers.all)
    # replay: two synced routers; an instance dies under them (failures, retries). The same
    # PeerReports tells the peers of every dispatch, with the cached tokens it was
    # accounted with, and of every end, failures included.
    heard: list[tuple[str, str, int | None]] = []
    delivery = simulator_module._PeerDelivery
    original_dispatched, original_ended = delivery.dispatched, delivery.ended

    def dispatched(self: Any, request_id: str, instance: str, features: Any, cached: Any) -> None:
        heard.append(("d", request_id, cached))
        original_dispatched(self, request_id, instance, features, cached)

    def ended(self: Any, request_id: str, ok: bool) -> None:
        heard.append(("e", request_id, None))
        original_ended(self, request_id, ok)

    monkeypatch.setattr(delivery, "dispatched", dispatched)
    monkeypatch.setattr(delivery, "ended", ended)
    records = [TraceRecord(k, 0.05 * k, 3000, 40) for k in range(40)]
    config = SimConfig(instances=3, routers=2, replica_sync=True, faults=(Fault(0.6, 1, "fail"),))
    sim = Simulator(records, "least_load", config)
    sim.run()
    assert all(type(router.peer_reports) is PeerReports for router in sim.routers)
    dispatches = [
        (life.request_id, life.features.prompt_tokens - attempt.uncached_tokens)
        for life in replay_lives
        for attempt in life.attempts
        if attempt.dispatched_at is not None
    ]
    failed = {
        life.request_id for life in replay_lives for a in life.attempts if a.phase is Phase.FAILED
    }
    ends = [r for h, r, _ in heard if h == "e"]
    assert failed and len(dispatches) >= len(records)
    assert sorted((r, c) for h, r, c in heard if h == "d") == sorted(dispatches)
    assert failed <= set(ends) and len(ends) == len(dispatches)
