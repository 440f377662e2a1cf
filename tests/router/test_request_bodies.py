"""Hypothesis over request bodies against a real router process and an enginesim fleet.

Bodies are built from the fields the router reads, each given a value of any JSON shape
(including nesting, integers far beyond 64 bits, negative and huge token ids, NaN and
Infinity, which Python's json writes though JSON has no such literals), plus unknown
fields, deep nesting and broken bytes. Whatever the body, the router answers below 500,
and every 4xx carries an OpenAI error body.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.drills.clients import is_error_body
from tests.router.helpers import MODEL, router_config

PATHS = ("/v1/completions", "/v1/chat/completions")
EDGE_INTS = st.sampled_from(
    [
        0,
        1,
        -1,
        2**31,
        2**63 - 1,
        2**63,
        2**64 - 1,
        2**64,
        2**64 + 1,
        2**100,
        -(2**63),
        -(2**64),
        10**400,
    ]
)
INTS = st.one_of(st.integers(), EDGE_INTS)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(), st.text(max_size=12))
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
TOKEN_IDS = st.lists(INTS, min_size=0, max_size=6)
PROMPTS = st.one_of(
    st.text(max_size=40),
    st.lists(st.text(max_size=8), max_size=3),
    TOKEN_IDS,
    st.lists(TOKEN_IDS, max_size=3),
    JSONISH,
)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": JSONISH}),
    st.fixed_dictionaries({"type": JSONISH}),
    JSONISH,
)
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system"]),
            "content": st.one_of(st.text(max_size=30), st.lists(PART, max_size=3), JSONISH),
        }
    ),
    st.fixed_dictionaries({"role": JSONISH, "content": JSONISH}),
    JSONISH,
)
FIELD_VALUES = {
    "model": st.one_of(st.just(MODEL), JSONISH),
    "prompt": PROMPTS,
    "messages": st.one_of(st.lists(MESSAGE, max_size=3), JSONISH),
    "stream": st.one_of(st.booleans(), JSONISH),
    "max_tokens": st.one_of(st.integers(1, 8), JSONISH),
    "max_completion_tokens": st.one_of(st.integers(1, 8), JSONISH),
    "n": st.one_of(st.just(1), JSONISH),
    "user": st.one_of(st.text(max_size=8), JSONISH),
    "temperature": st.one_of(st.floats(), JSONISH),
    "stream_options": st.one_of(st.just({"include_usage": True}), JSONISH),
}


def _document(path: str) -> st.SearchStrategy[dict[str, Any]]:
    """A plausible body with a random subset of fields replaced by anything."""
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 4}
    base["messages" if "chat" in path else "prompt"] = (
        [{"role": "user", "content": "hi there"}] if "chat" in path else "hi there"
    )
    replaced = st.dictionaries(st.sampled_from(sorted(FIELD_VALUES)), st.none(), max_size=4)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        document = dict(base)
        for name in draw(replaced):
            if draw(st.booleans()):
                document.pop(name, None)
            else:
                document[name] = draw(FIELD_VALUES[name])
        document.update(draw(st.dictionaries(st.text(max_size=6), JSONISH, max_size=2)))
        return document

    return build()


def bodies() -> st.SearchStrategy[tuple[str, bytes]]:
    documents = st.sampled_from(PATHS).flatmap(
        lambda path: _document(path).map(lambda d: (path, json.dumps(d).encode()))
    )
    nested = st.tuples(
        st.integers(1, 5000),
        st.sampled_from(["array", "object"]),
        st.sampled_from(["prompt", "extra", "messages", "model"]),
    ).map(lambda args: ("/v1/completions", _nested_body(*args)))
    broken = st.tuples(documents, st.integers(0, 400), st.binary(max_size=4)).map(
        lambda args: (args[0][0], args[0][1][: args[1]] + args[2])
    )
    return st.one_of(documents, documents, nested, broken)


def _nested_body(depth: int, kind: str, field: str) -> bytes:
    core = (
        b"[" * depth + b"1" + b"]" * depth
        if kind == "array"
        else (b'{"a":' * depth + b"1" + b"}" * depth)
    )
    return (
        b'{"model": "'
        + MODEL.encode()
        + b'", "prompt": "x", "max_tokens": 2, "'
        + field.encode()
        + b'": '
        + core
        + b"}"
    )


@pytest.fixture
def router(fleet, router_factory):
    return router_factory(router_config(fleet, "lmetric"))


def test_no_request_body_gets_a_5xx(router):
    client = httpx.Client(timeout=30, trust_env=False)
    statuses: dict[int, int] = {}

    @settings(
        max_examples=250,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies())
    def check(case: tuple[str, bytes]) -> None:
        path, raw = case
        response = client.post(
            router.url + path, content=raw, headers={"content-type": "application/json"}
        )
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (raw[:300], response.status_code, response.text[:300])
        if response.status_code >= 400:
            assert is_error_body(response.text), (raw[:300], response.text[:300])

    try:
        check()
    finally:
        client.close()
    assert router.process.poll() is None
    assert "Traceback" not in router.log()
    assert statuses.get(200, 0) > 0 and sum(statuses.values()) >= 250, statuses
