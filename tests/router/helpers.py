"""What the router tests (and the drills) share: router configurations, routers and a
private Redis on loopback, readers of their metrics and streams, the peer-sync key, and
KV-event batches (well-formed and mis-typed) in vLLM's wire format."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
import redis

from devharness import (
    TRANSIENT,
    Fleet,
    Router,
    free_port,
    router_env,
    start_process,
    start_router,
    stop_process,
    wait_until,
)
from devharness import scrape_total as scrape_with
from router_worker.contract.telemetry import PEER_KEY_ENV
from tests.fleets import fast_fleet

REPO = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen2-7B-Instruct"
ADMIN_TOKEN = "test-admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PEER_KEY = "test-cluster-peer-key-0123456789"
PEER_ENV = {PEER_KEY_ENV: PEER_KEY}


def kv_fleet(size: int, *extra: str) -> Fleet:
    """The router tests' fleet (not yet started): KV events in vLLM's array encoding, as a
    router subscribes to them; ``extra``: more server flags."""
    return fast_fleet(size, kv_events=True, kv_encoding="array", extra=extra)


def scrape_total(url: str, name: str, **labels: str) -> float:
    """Sum of the samples ``name`` (with ``labels`` among theirs) on ``url``/metrics, sent
    with the admin token: a router's /metrics needs it (an engine ignores it)."""
    return scrape_with(url, name, labels=labels, headers=ADMIN_HEADERS)


def stream_entries(
    client: redis.Redis, stream: str
) -> list[tuple[bytes, dict[bytes | str, bytes | str]]]:
    """Every entry of ``stream``; XRANGE gives an id and fields for each (redis-py's type
    admits None for both)."""
    return cast("list[tuple[bytes, dict[bytes | str, bytes | str]]]", client.xrange(stream))


def router_config(
    fleet: Fleet, kind: str = "lmetric", params: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "cluster": "test",
        "model": MODEL,
        "instances": fleet.instances(),
        "policy": {"kind": kind, "params": params or {}},
        "router": {
            "scrape_interval_s": 0.2,
            "health_interval_s": 0.2,
            "breaker_open_s": 0.5,
            "kv_events": False,
        },
    }
    document.update(extra)
    return document


def launch_router(
    directory: Path,
    document: dict[str, Any] | None = None,
    *extra: str,
    redis_url: str = "none",
    wait: bool = True,
    env: dict[str, str] | None = None,
) -> Router:
    """A router with the tests' admin token (standalone when ``document`` is given), logging
    at INFO to ``directory``; ``env``: added to its environment."""
    return start_router(
        directory,
        document,
        *extra,
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        wait=wait,
        env=router_env(**(env or {})),
    )


class PrivateRedis:
    """A throwaway redis-server on a free port (never the machine's shared one: others'
    tests use it), stopped and started again by the tests that need it down."""

    def __init__(self, port: int, directory: str) -> None:
        self.port = port
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.directory,
        ]  # fmt: skip
        self.proc = start_process(argv, stdin=None)
        client = redis.Redis(port=self.port)
        # a refusal, or another server on the port hanging up, is "not yet": a redis-server
        # that could not bind exits, and that ends the wait with its exit
        starting = (*TRANSIENT, redis.RedisError)
        wait_until(lambda: bool(client.ping()), 10, "private redis", self.proc, ignore=starting)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@contextmanager
def private_redis_server(prefix: str = "sy-redis-") -> Iterator[PrivateRedis]:
    """A started :class:`PrivateRedis` in a temp dir; stopped and removed afterwards."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    directory = tempfile.mkdtemp(prefix=prefix)
    server = PrivateRedis(free_port(), directory)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


# ----- KV-event batches in vLLM's wire format -------------------------------------------
BLOCK = 16
TOKENS = list(range(1000, 1064))  # four blocks


def stored(
    hashes: list[Any],
    tokens: list[Any],
    parent: Any = None,
    size: Any = BLOCK,
    lora: Any = None,
    medium: Any = "GPU",
) -> list[Any]:
    return ["BlockStored", hashes, parent, tokens, size, lora, medium]


# Each one killed the subscriber task before: a wrong type where vLLM sends another.
WRONG_TYPES = {
    "ts is a string": msgpack.packb(["soon", [stored([1], TOKENS[:16])], 0]),
    "events map is a number": msgpack.packb({"ts": 1.0, "events": 7}),
    "block_size is a string": msgpack.packb([1.0, [stored([1], TOKENS[:16], size="x")]]),
    "block_size is negative": msgpack.packb([1.0, [stored([1], TOKENS[:16], size=-16)]]),
    "token ids are strings": msgpack.packb([1.0, [stored([1], ["a"] * 16)]]),
    "token id is negative": msgpack.packb([1.0, [stored([1], [-1] * 16)]]),
    "block hash is a map": msgpack.packb([1.0, [stored([{"h": 1}], TOKENS[:16])]]),
    "parent hash is a map": msgpack.packb([1.0, [stored([1], TOKENS[:16], parent={"p": 1})]]),
    "removed hashes is a number": msgpack.packb([1.0, [["BlockRemoved", 5, "GPU"]]]),
    "removed hash is a map": msgpack.packb(
        {"ts": 1.0, "events": [{"type": "BlockRemoved", "block_hashes": [{"x": 1}]}]}
    ),
    "medium is a list": msgpack.packb([1.0, [stored([1], TOKENS[:16], medium=["GPU"])]]),
}
