"""Drills: the router's resource limits, each under real load.

* slowloris: clients that drip a request head or body byte by byte get a 408 and lose
  their connection at the deadline, while normal traffic is served;
* connection flood: hundreds of idle connections are shed (408 at the head deadline,
  503 at once beyond the cap), normal traffic keeps going;
* engines answering garbage SSE, garbage JSON or the wrong content type: nothing of it
  reaches a client (retried elsewhere before the first byte, a clean SSE error event and
  ``[DONE]`` after it);
* an engine dripping tokens just under the read timeout: its answers end at the total
  deadline with a clear 504 instead of holding clients for ever;
* the router out of file descriptors (its RLIMIT_NOFILE lowered under load): clear 503s,
  and no engine is marked down for the router's own trouble.

Clients are strict here: a stream event that is not JSON, or a body that is not, counts
as lost (an SDK would fail on it).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devharness import Fleet, Router, wait_until
from engine_interface import read_samples
from tests.drills.clients import MODEL, body, classify_stream, classify_whole, is_error_body
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import scrape_total

HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
ANSWER_BOUND_S = 15.0  # a slow client or a load request unanswered this long is lost
LIMITS = {"header_timeout_s": HEAD_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S}


# ----- strict clients ----------------------------------------------------------------------
def strict_verdict(stream: bool, status: int, text: str) -> str:
    """The drill clients' verdict, plus: every event / body an SDK would parse is JSON."""
    verdict = classify_stream(status, text) if stream else classify_whole(status, text)
    if verdict == "lost" or not stream or status != 200:
        return verdict
    for line in text.splitlines():
        if not line.strip() or line.startswith(":") or line == "data: [DONE]":
            continue
        try:
            if not line.startswith("data:") or not isinstance(json.loads(line[5:]), dict):
                return "lost"
        except ValueError:
            return "lost"  # garbage reached the client
    return verdict


async def one_strict(client: httpx.AsyncClient, url: str, payload: dict) -> tuple[str, str]:
    stream = bool(payload.get("stream"))
    try:
        async with asyncio.timeout(ANSWER_BOUND_S):  # a dripped answer resets read timeouts
            if stream:
                async with client.stream("POST", url, json=payload) as response:
                    text = (await response.aread()).decode(errors="replace")
            else:
                response = await client.post(url, json=payload)
                text = response.text
    except TimeoutError:
        return "lost", f"no complete answer in {ANSWER_BOUND_S} s"
    except httpx.HTTPError as error:
        return "lost", f"{type(error).__name__}: {error}"
    return strict_verdict(
        stream, response.status_code, text
    ), f"{response.status_code} {text[-200:]}"


async def strict_load(
    client: httpx.AsyncClient,
    url: str,
    concurrency: int,
    until: Callable[[], bool],
    max_tokens: int = 24,
) -> Outcome:
    """``concurrency`` workers alternating stream and not, until ``until()``."""
    outcome = Outcome()
    counter = iter(range(10**9))

    async def worker() -> None:
        while not until():
            k = next(counter)
            verdict, detail = await one_strict(
                client, url, body(f"lim{k}-", k % 2 == 0, max_tokens)
            )
            outcome.add(verdict, detail)
            if verdict != "ok":
                await asyncio.sleep(0.05)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcome


def load_while(
    router: Router,
    concurrency: int,
    seconds: float,
    max_tokens: int = 24,
) -> Outcome:
    async def run() -> Outcome:
        deadline = time.monotonic() + seconds
        async with httpx.AsyncClient(timeout=ANSWER_BOUND_S, trust_env=False) as client:
            return await strict_load(
                client,
                router.url + "/v1/completions",
                concurrency,
                lambda: time.monotonic() >= deadline,
                max_tokens,
            )

    return asyncio.run(run())


def limit_hits(router: Router) -> dict[str, float]:
    samples, _ = read_samples(router.metrics(), ["switchyard_router_limit_hits_total"])
    return {
        s.labels["limit"]: s.value
        for s in samples
        if s.name == "switchyard_router_limit_hits_total"
    }


def marked_down(router: Router) -> list[str]:
    return [line for line in router.log().splitlines() if "-> down" in line]


# ----- slow clients (raw sockets) -------------------------------------------------------------
@dataclass
class SlowResult:
    verdict: str
    detail: str
    held_s: float


async def slow_client(port: int, part: str, drip_s: float = 0.1) -> SlowResult:
    """Send a request head (``part == "head"``: never completed) or a body (``"body"``:
    1 MB announced) one byte every ``drip_s``, reading all along; the answer must be an
    OpenAI-style 408 and the connection closed, within ANSWER_BOUND_S."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if part == "head":
        opening, drip = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-slow: ", b"a"
    else:
        opening = (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
            b'application/json\r\ncontent-length: 1000000\r\n\r\n{"prompt": "'
        )
        drip = b"b"
    started = time.monotonic()
    received = bytearray()
    reading = asyncio.ensure_future(_read_until_closed(reader, received))
    try:
        writer.write(opening)
        while not reading.done() and time.monotonic() - started < ANSWER_BOUND_S:
            writer.write(drip)
            await writer.drain()
            await asyncio.wait({reading}, timeout=drip_s)
    except ConnectionError:
        pass
    with_bound = ANSWER_BOUND_S - (time.monotonic() - started)
    await asyncio.wait({reading}, timeout=max(with_bound, 0.1))
    held = time.monotonic() - started
    reading.cancel()
    writer.close()
    head, _, payload = bytes(received).partition(b"\r\n\r\n")
    text = payload.decode(errors="replace")
    clear = head.startswith(b"HTTP/1.1 408") and is_error_body(text) and reading.done()
    return SlowResult(
        "clear" if clear else "lost", f"{part}: {bytes(received)[:200]!r} after {held:.1f} s", held
    )


async def _read_until_closed(reader: asyncio.StreamReader, into: bytearray) -> None:
    try:
        while chunk := await reader.read(65536):
            into += chunk
    except ConnectionError:
        pass


def test_slowloris_heads_and_bodies_get_408_while_traffic_is_served(drill_fleet, router_factory):
    router = router_factory(drill_config(drill_fleet, "round_robin", **LIMITS))
    slow: list[SlowResult] = []

    def attack() -> None:
        async def run() -> list[SlowResult]:
            return await asyncio.gather(
                *(slow_client(router.port, part) for part in ("head", "body") for _ in range(25))
            )

        slow.extend(asyncio.run(run()))

    attacker = threading.Thread(target=attack)
    attacker.start()
    outcome = load_while(router, concurrency=4, seconds=4.0)
    attacker.join()
    slow_outcome = Outcome()
    for result in slow:
        slow_outcome.add(result.verdict, result.detail)
    outcome.merge(slow_outcome)
    hits = limit_hits(router)
    record(
        "slowloris (25 dripped heads + 25 dripped bodies) under load",
        outcome,
        max(r.held_s for r in slow),
        notes=f"head deadline {HEAD_TIMEOUT_S} s, body deadline {BODY_TIMEOUT_S} s; "
        f"failed_clear = the slow clients' 408s; recovery = longest a slow client "
        f"held a connection; limit hits {hits}",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert slow_outcome.failed_clear == 50
    assert outcome.succeeded == outcome.sent - 50
    assert hits.get("header_timeout") == 25 and hits.get("body_timeout") == 25


# ----- connection flood --------------------------------------------------------------------
async def flood(port: int, count: int) -> tuple[int, int, float]:
    """Open ``count`` idle connections; (answered 408, answered 503, seconds until the
    router had closed them all)."""
    started = time.monotonic()

    async def idle() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        received = bytearray()
        await asyncio.wait_for(_read_until_closed(reader, received), ANSWER_BOUND_S)
        writer.close()
        return bytes(received)

    answers = await asyncio.gather(*(idle() for _ in range(count)), return_exceptions=True)
    statuses = [a[:12] for a in answers if isinstance(a, bytes)]
    return (
        statuses.count(b"HTTP/1.1 408"),
        statuses.count(b"HTTP/1.1 503"),
        time.monotonic() - started,
    )


def test_connection_flood_is_shed_and_traffic_keeps_going(drill_fleet, router_factory):
    cap, flooders = 64, 400
    router = router_factory(drill_config(drill_fleet, "round_robin", max_connections=cap, **LIMITS))
    shed: list[tuple[int, int, float]] = []

    def attack() -> None:
        shed.append(asyncio.run(flood(router.port, flooders)))

    attacker = threading.Thread(target=attack)
    attacker.start()
    time.sleep(0.3)  # the flood is in before the traffic
    during = load_while(router, concurrency=4, seconds=3.0)
    attacker.join()
    after = load_while(router, concurrency=4, seconds=1.0)
    got_408, got_503, shed_s = shed[0]
    outcome = Outcome()
    outcome.merge(during)
    outcome.merge(after)
    hits = limit_hits(router)
    record(
        "connection flood (400 idle connections, cap 64) under load",
        outcome,
        shed_s,
        notes=f"flood answered: {got_408} x 408 (head deadline), {got_503} x 503 (over "
        f"the cap); failed_clear = load requests refused 503 while the flood held "
        f"the cap; recovery = until the router had closed every flood connection; "
        f"limit hits {hits}",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert got_408 + got_503 == flooders, (got_408, got_503)
    assert after.succeeded == after.sent
    assert router.process.poll() is None


# ----- engines answering badly ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "extra", "scenario"),
    [
        ("garbage", {"after_chunks": 2}, "engine sends garbage mid-stream / garbage JSON"),
        ("garbage", {"after_chunks": 0}, "engine sends garbage as its first SSE event"),
        ("wrong_content_type", {}, "engine answers text/html (wrong content type)"),
    ],
)
def test_engine_garbage_never_reaches_a_client(drill_fleet, router_factory, mode, extra, scenario):
    router = router_factory(drill_config(drill_fleet, "round_robin"))
    drill_fleet.fault(1, mode, **extra)
    try:
        outcome = load_while(router, concurrency=4, seconds=3.0, max_tokens=16)
    finally:
        drill_fleet.fault(1, "recover")
    hits = limit_hits(router)
    record(
        scenario,
        outcome,
        None,
        notes=f"instance i1 faulty of 4 (round robin); before the first byte: retried "
        f"elsewhere; after it: continued on another instance; limit hits {hits}",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert hits.get("bad_response", 0) > 0
    assert outcome.succeeded > 0


# ----- an engine dripping tokens -------------------------------------------------------------
def test_engine_dripping_under_the_read_timeout_is_cut_at_the_deadline(drill_fleet, router_factory):
    # The period is under the drill's 1 s first_byte_timeout_s, so only the total deadline
    # can cut i1's streams. The engine coalesces the tokens made while a chunk waits, so a
    # dripped 200-token stream is only 2-3 chunks long: the deadline is under 2 periods.
    deadline_s, period_s = 1.4, 0.8
    router = router_factory(
        drill_config(drill_fleet, "round_robin", response_deadline_s=deadline_s)
    )
    drill_fleet.fault(1, "drip", period=period_s)
    try:
        outcome = load_while(router, concurrency=4, seconds=5.0, max_tokens=200)
    finally:
        drill_fleet.fault(1, "recover")
    hits = limit_hits(router)
    record(
        "engine drips tokens just under the read timeout",
        outcome,
        None,
        notes=f"i1 sends a chunk every {period_s} s (read timeout 1 s), 200 tokens a "
        f"request; total deadline {deadline_s} s (router.response_deadline_s) -> "
        f"504 JSON or SSE error event; limit hits {hits}",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert outcome.failed_clear > 0 and outcome.succeeded > 0
    assert hits.get("response_deadline", 0) == outcome.failed_clear
    assert not marked_down(router), marked_down(router)


# ----- the router out of file descriptors ------------------------------------------------------
def lowest_free_fd(pid: int) -> int:
    used = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
    return next(k for k in range(len(used) + 1) if k not in used)


async def warm_client(url: str, connections: int) -> httpx.AsyncClient:
    """A client whose ``connections`` keep-alive connections are open before the limit
    falls (a new one could not be accepted then: that is not what this drill is about)."""
    client = httpx.AsyncClient(
        timeout=ANSWER_BOUND_S,
        trust_env=False,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )
    pending = [client.get(url + "/v1/models") for _ in range(connections)]
    assert all(r.status_code == 200 for r in await asyncio.gather(*pending))
    return client


def test_fd_exhaustion_gets_clear_503s_and_marks_no_engine_down(drill_fleet: Fleet, router_factory):
    router = router_factory(drill_config(drill_fleet, "round_robin"))
    pid = router.process.pid
    _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    url = router.url + "/v1/completions"

    async def run() -> tuple[Outcome, Outcome, float]:
        client = await warm_client(router.url, 16)
        try:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free_fd(pid), hard))
            deadline = time.monotonic() + 3.0
            starved = await strict_load(
                client, url, 16, lambda: time.monotonic() >= deadline, max_tokens=32
            )
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
            restored = time.monotonic()
            count = iter(range(40))
            after = await strict_load(client, url, 8, lambda: next(count, None) is None)
            return starved, after, time.monotonic() - restored
        finally:
            await client.aclose()

    starved, after, recovery_s = asyncio.run(run())
    hits = limit_hits(router)
    down = marked_down(router)
    outcome = Outcome()
    outcome.merge(starved)
    outcome.merge(after)
    record(
        "router out of file descriptors (RLIMIT_NOFILE lowered) under load",
        outcome,
        recovery_s,
        notes=f"limit = the router's lowest free fd for 3 s, 16 kept-alive clients; "
        f"engines marked down: {len(down)}; recovery = limit restored -> 40 more "
        f"requests answered; limit hits {hits}",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert not down, down
    assert hits.get("fd_exhausted", 0) > 0
    assert starved.failed_clear > 0
    assert after.succeeded == after.sent


# ----- bodies of clients that went away --------------------------------------------------------
GONE_BODIES = 24
GONE_BODY_BYTES = int(7.3 * 1024 * 1024)  # just under the default 8 MiB limit


def gone_body(k: int) -> bytes:
    words = f"gone{k} lorem ipsum dolor sit amet consectetur "
    prompt = (words * (GONE_BODY_BYTES // len(words) + 1))[: GONE_BODY_BYTES - 100]
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()


async def send_and_close(port: int, payload: bytes) -> None:
    """One big request, sent whole, then the connection closed without reading the answer."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(payload)
    )
    writer.write(payload)
    await writer.drain()
    writer.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def test_bodies_of_clients_that_went_away_are_dropped_unparsed(drill_fleet, router_factory):
    """Max-size bodies sent and closed at once: the router drops the ones still waiting for
    an intake worker instead of parsing and routing them, and the bytes it held for them
    go back to zero. RSS before, at its peak and after is measured for the notes."""
    # Every body through the intake workers: the warm-up's small one starts them.
    router = router_factory(drill_config(drill_fleet, "round_robin", offload_body_bytes=0))
    pid = router.process.pid
    url = router.url
    warm = {"model": MODEL, "prompt": "warm up", "max_tokens": 1}
    httpx.post(url + "/v1/completions", json=warm, timeout=60).raise_for_status()
    tokenized_before = scrape_total(url, "switchyard_router_tokenization_total")
    closed_before = scrape_total(url, "switchyard_router_requests_total")
    baseline = rss_mib(pid)
    payloads = [gone_body(k) for k in range(GONE_BODIES)]
    peak = [baseline]
    sending = threading.Event()

    def sample_rss() -> None:
        while sending.is_set():
            peak.append(rss_mib(pid))
            time.sleep(0.05)

    sending.set()
    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()

    async def send_all() -> None:
        await asyncio.gather(*(send_and_close(router.port, p) for p in payloads))

    asyncio.run(send_all())
    closed = time.monotonic()
    wait_until(
        lambda: (
            scrape_total(url, "switchyard_router_intake_queued_bytes") == 0
            and scrape_total(url, "switchyard_router_intake_queued") == 0
            and router.state()["limiter"]["active"] == 0
        ),
        30,
        "intake queue empty",
    )
    released_s = time.monotonic() - closed
    sending.clear()
    sampler.join()
    after = rss_mib(pid)
    dropped = scrape_total(url, "switchyard_router_intake_dropped_total")
    unread = scrape_total(url, "switchyard_router_bodies_unread_total")
    abandoned = scrape_total(url, "switchyard_router_intake_abandoned_total")
    routed = scrape_total(url, "switchyard_router_tokenization_total") - tokenized_before
    planned = scrape_total(url, "switchyard_router_requests_total") - closed_before
    # A gone client's body is dropped before routing: only the bodies already in a worker
    # (or taken in) when their client's close was seen get that far.
    assert dropped >= GONE_BODIES / 2, f"{dropped} of {GONE_BODIES} bodies dropped unparsed"
    assert routed < GONE_BODIES / 2, f"{routed} of {GONE_BODIES} bodies of gone clients routed"
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    # No client stays for an answer: each body's fate is read from the router's own
    # counters, each counted where it happened. "Succeeded" = taken in whole (its worker
    # finished it for nobody, or it was planned and closed: requests_total, 499 for a gone
    # client), "failed clear" = dropped unparsed from the queue or left unread (its client
    # closed before the router had it whole); "lost" = a body none of
    # them counts (read, then forgotten).
    outcome = Outcome(
        sent=GONE_BODIES, succeeded=int(abandoned + planned), failed_clear=int(dropped + unread)
    )
    outcome.lost = outcome.sent - outcome.succeeded - outcome.failed_clear
    record(
        "max-size bodies whose clients went away (queued for intake)",
        outcome,
        released_s,
        f"{GONE_BODIES} bodies of {GONE_BODY_BYTES / 2**20:.1f} MiB sent and closed at once "
        "(succeeded = taken in before the close was seen, failed clear = dropped unparsed "
        "or left unread, "
        "lost = counted by neither); "
        f"{dropped:.0f} dropped unparsed from the intake queue, {unread:.0f} left unread, "
        f"{abandoned:.0f} finished by "
        f"a worker for nobody, {planned:.0f} planned ({routed:.0f} routed); the "
        f"queued-bytes gauge back at 0 {released_s:.1f} s after the last close (recovery_s); "
        f"router RSS {baseline:.0f} MiB before, {max(peak):.0f} MiB peak, {after:.0f} MiB after",
    )
    assert outcome.lost == 0, (dropped, unread, abandoned, planned)
