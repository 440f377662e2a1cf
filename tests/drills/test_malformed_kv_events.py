"""Drill: malformed ZMQ KV events under load.

Each of the four instances' KV-event endpoints is a ZMQ PUB socket of this test speaking
vLLM's wire format (frames ``[topic, seq, msgpack batch]``). While clients keep sending
requests, every publisher sends garbage: bytes that are not msgpack, batches with wrong
types in every field (from tests/router/helpers.py), too few frames, short
sequence frames. Then each publisher announces, in a well-formed batch, that its
instance holds the prefix of a prompt nobody has sent yet. The router must keep every
subscription (no subscriber restarted), count each bad message (admin state, Prometheus,
telemetry event), and route each of those prompts to the instance that announced it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import msgpack
import zmq

from devharness import Router, wait_until
from tests.drills.clients import MODEL, Load, classify_whole
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import WRONG_TYPES, scrape_total

BLOCK = 16
PROMPT_TOKENS = 256
ROUNDS = 3  # of garbage per publisher
GARBAGE = [
    b"\xc1\xc1 not msgpack",
    b"",
    msgpack.packb("a string, not a batch"),
    *WRONG_TYPES.values(),
]


class Publishers:
    def __init__(self, context: zmq.Context, count: int) -> None:
        self.sockets = [context.socket(zmq.PUB) for _ in range(count)]
        self.ports = [s.bind_to_random_port("tcp://127.0.0.1") for s in self.sockets]
        self.seq = [0] * count

    def send(self, index: int, payload: bytes) -> None:
        self.sockets[index].send_multipart([b"kv", self.seq[index].to_bytes(8, "big"), payload])
        self.seq[index] += 1

    def send_frames(self, index: int, frames: list[bytes]) -> None:
        self.sockets[index].send_multipart(frames)

    def close(self) -> None:
        for socket in self.sockets:
            socket.close(linger=0)


def announce(tokens: list[int], first_hash: int) -> bytes:
    """A vLLM BlockStored batch (positional encoding) for the full blocks of ``tokens``."""
    hashes = list(range(first_hash, first_hash + len(tokens) // BLOCK))
    return msgpack.packb(
        [time.time(), [["BlockStored", hashes, None, tokens, BLOCK, None, "GPU"]], 0]
    )


def prompt_tokens(k: int) -> list[int]:
    return [(7919 * k + 13 * i) % 30000 + 100 for i in range(PROMPT_TOKENS)]


def kv_stats(router: Router) -> dict[str, dict]:
    return router.state()["kv_events"]


def subscribed(router: Router, pubs: Publishers, names: list[str]) -> None:
    """ZMQ drops what is published before a SUB connects: probe until each one answers."""

    def all_received() -> bool:
        stats = kv_stats(router)
        for index, name in enumerate(names):
            if stats.get(name, {}).get("batches", 0) == 0:
                pubs.send(index, msgpack.packb([time.time(), [], 0]))
        return all(stats.get(n, {}).get("batches", 0) > 0 for n in names)

    wait_until(all_received, 20, "every KV subscriber receiving")


def received_after(router: Router, pubs: Publishers, names: list[str], seen: dict) -> None:
    """Each subscriber receives one more (empty) batch beyond ``seen``: it is alive after
    every message sent before. A subscriber that died meanwhile is respawned and counted
    (``crashes``) before one gets through (ZMQ drops what a PUB sends with no SUB)."""

    def all_received() -> bool:
        stats = kv_stats(router)
        for index, name in enumerate(names):
            if stats[name]["batches"] <= seen[name]:
                pubs.send(index, msgpack.packb([time.time(), [], 0]))
        return all(stats[n]["batches"] > seen[n] for n in names)

    wait_until(all_received, 20, "every KV subscriber receiving after the garbage")


def checked_after(router: Router, names: list[str]) -> None:
    """The router's subscriber supervisor has looked at every subscriber once more (it
    respawns and counts, in ``crashes``, a subscriber whose task died)."""
    seen = {name: s["checks"] for name, s in kv_stats(router).items()}
    wait_until(
        lambda: all(s["checks"] > seen[n] for n, s in kv_stats(router).items() if n in names),
        20,
        "a reconcile pass of the KV subscribers",
    )


def send_garbage(pubs: Publishers, count: int) -> int:
    sent = 0
    for _ in range(ROUNDS):
        for index in range(count):
            for payload in GARBAGE:
                pubs.send(index, payload)
            pubs.send_frames(index, [b"kv"])
            pubs.send_frames(index, [b"kv", b"\x00\x01", announce(prompt_tokens(0), 1)])
            sent += len(GARBAGE) + 2
    return sent


def route_checks(router: Router, names: list[str], first: int) -> tuple[Outcome, list[str]]:
    """One request per announced prompt; the instance each went to, in order."""
    outcome, chosen = Outcome(), []
    with httpx.Client(timeout=30, trust_env=False) as client:
        for k in range(len(names)):
            response = client.post(
                router.url + "/v1/completions",
                json={"model": MODEL, "prompt": prompt_tokens(first + k), "max_tokens": 4},
            )
            outcome.add(classify_whole(response.status_code, response.text), response.text[:200])
            chosen.append(response.headers.get("x-switchyard-instance", ""))
    return outcome, chosen


def malformed_metric(router: Router) -> float:
    return scrape_total(router.url, "switchyard_router_kv_events_malformed_total")


def test_malformed_kv_events_are_skipped_and_good_ones_still_steer_routing(
    drill_fleet, router_factory
):
    context = zmq.Context()
    pubs = Publishers(context, drill_fleet.size)
    try:
        instances = [
            {**spec, "kv_events": f"tcp://127.0.0.1:{port}"}
            for spec, port in zip(drill_fleet.instances(), pubs.ports, strict=True)
        ]
        config = drill_config(drill_fleet, "lmetric", kv_events=True)
        config["instances"] = instances
        router = router_factory(config)
        names = [spec["name"] for spec in instances]
        subscribed(router, pubs, names)

        stop, box = threading.Event(), []
        load = Load(router.url + "/v1/completions", concurrency=4, max_tokens=8, pause_s=0.05)
        loader = threading.Thread(
            target=lambda: box.append(asyncio.run(load.run(until=stop.is_set))), daemon=True
        )
        loader.start()
        wait_until(
            lambda: scrape_total(router.url, "switchyard_router_requests_total") >= 4,
            20,
            "the load under way",
        )
        batches_before = {name: s["batches"] for name, s in kv_stats(router).items()}
        started = time.monotonic()
        bad = send_garbage(pubs, len(names))
        for index in range(len(names)):
            pubs.send(index, announce(prompt_tokens(100 + index), 10_000 * (index + 1)))
        wait_until(
            lambda: all(
                s["batches"] > batches_before[name] for name, s in kv_stats(router).items()
            ),
            20,
            "the announcements applied",
        )
        applied_s = time.monotonic() - started
        received_after(router, pubs, names, {n: s["batches"] for n, s in kv_stats(router).items()})
        checked_after(router, names)
        stop.set()
        loader.join(timeout=60)
        wait_until(lambda: router.state()["limiter"]["active"] == 0, 20, "the fleet idle")
        checks, chosen = route_checks(router, names, 100)
        stats = kv_stats(router)
        events = [e for e in router.state()["recent_events"] if e["kind"] == "kv_events_malformed"]
        metric = malformed_metric(router)
    finally:
        pubs.close()
        context.destroy(linger=0)
    outcome = box[0]
    outcome.merge(checks)
    skipped = sum(s["decode_errors"] for s in stats.values())
    crashes = sum(s["crashes"] for s in stats.values())
    record(
        "malformed ZMQ KV events",
        outcome,
        applied_s,
        notes=f"{bad} malformed messages to 4 subscribers (garbage, wrong types, short "
        f"frames): {skipped} skipped and counted, {crashes} subscriber restarts; "
        f"{sum(c == n for c, n in zip(chosen, names, strict=True))}/{len(names)} "
        "announced prefixes steered routing; recovery = garbage sent -> good "
        "batches applied",
        malformed_sent=bad,
        malformed_counted=skipped,
        subscriber_crashes=crashes,
    )
    assert outcome.succeeded == outcome.sent, outcome.lost_examples
    assert (skipped, metric, crashes) == (bad, bad, 0), stats
    assert {e["payload"]["instance"] for e in events} == set(names)
    assert chosen == names  # each prompt went where its announced prefix sits
