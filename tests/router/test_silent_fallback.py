"""The silent-fallback alarm (router_worker/hit_audit.py): a router whose tokenizer differs
from the engine's predicts prefix hits the engine's prefix-cache counters do not confirm,
and says so (``switchyard_router_silent_fallback`` 1); with the engine's own tokenizer, on
the same traffic, it stays quiet (0)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chat_templates import load_chat_template
from devharness import Fleet, wait_until
from tests.fleets import fast_fleet
from tests.router.helpers import MODEL, scrape_total
from tests.router.test_chat_templates import engine_equivalent_tokenizer

SYSTEM = "You follow the house rules. " + " ".join(f"rule{i}" for i in range(100))


def _conversations(count: int = 12) -> list[list[dict[str, str]]]:
    """A shared system prompt, then a question of random words: half of each prompt is the
    shared prefix, the other half new to the engine."""
    rng = random.Random(62)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=7)) for _ in range(100 * count)]
    return [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": " ".join(words[100 * i : 100 * (i + 1)])},
        ]
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def engine() -> Iterator[Fleet]:
    with fast_fleet(1) as started:
        yield started


def _tokenizer(directory: Path, conversations: list[list[dict[str, str]]], right: bool) -> str:
    """The engine's tokenization (``right``), or one that knows only the system prompt and
    the template: every question word is the same unknown token to it."""
    template = load_chat_template("chatml")
    shown = (
        conversations if right else [[m for m in c if m["role"] == "system"] for c in conversations]
    )
    texts = [template.render_request({"messages": c}) for c in shown] + [SYSTEM]
    return engine_equivalent_tokenizer(directory / f"tokenizer-{right}.json", texts)


def _document(engine: Fleet, tokenizer_path: str) -> dict[str, Any]:
    return {
        "cluster": "audit",
        "model": MODEL,
        "instances": [{"name": "i0", "url": engine.url(0)}],
        "policy": {"kind": "round_robin", "params": {}},
        "router": {"scrape_interval_s": 0.2, "kv_events": False, "tokenizer_path": tokenizer_path},
    }


@pytest.mark.parametrize(("right", "alarm"), [(False, 1.0), (True, 0.0)])
def test_silent_fallback_alarm(engine, router_factory, tmp_path, right, alarm):
    httpx.post(engine.url(0) + "/reset_prefix_cache", timeout=10)
    conversations = _conversations()
    router = router_factory(_document(engine, _tokenizer(tmp_path, conversations, right)))
    for messages in conversations:
        body = {"model": MODEL, "messages": messages, "max_tokens": 2}
        answer = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
    metrics = router.url
    wait_until(
        lambda: scrape_total(metrics, "switchyard_router_confirmed_hit_ratio", instance="i0") > 0,
        15,
        "a judged window",
    )
    predicted = scrape_total(metrics, "switchyard_router_predicted_hit_ratio", instance="i0")
    confirmed = scrape_total(metrics, "switchyard_router_confirmed_hit_ratio", instance="i0")
    verdict = scrape_total(metrics, "switchyard_router_silent_fallback", instance="i0")
    assert verdict == alarm, (predicted, confirmed)
    # the dashboard's source: the router's snapshot of the instance
    assert router.state()["snapshot"]["instances"][0]["silent_fallback"] is bool(alarm)
    assert predicted >= 0.2  # both tokenizers predict hits: the quiet one is not trivially so
