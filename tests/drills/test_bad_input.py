"""Drill: hypothesis-generated malformed requests to a live router.

Every example starts from a valid request and breaks it one way (invalid JSON, invalid
UTF-8, a non-object body, a field of the wrong type, a missing field, an oversized prompt,
an absurd ``max_tokens``, an unknown model). Every answer must be a 4xx with an
OpenAI-style error body; the router must stay up and its indicators return to zero.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devharness import wait_until
from tests.drills.clients import MODEL, is_error_body
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import launch_router

MAX_BODY = 16 * 1024
EXAMPLES = 300
VALID = {
    "/v1/completions": {"model": MODEL, "prompt": "hello there", "max_tokens": 4},
    "/v1/chat/completions": {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}],
    },
}
FIELDS = ("model", "prompt", "messages", "max_tokens", "stream", "n", "max_completion_tokens")
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _encode(document: Any) -> bytes:
    return json.dumps(document).encode()


def _wrong_type(path: str) -> st.SearchStrategy[bytes]:
    def build(field: str, value: Any) -> bytes:
        document = dict(VALID[path])
        document[field] = value
        return _encode(document)

    wrong = {
        "model": st.one_of(
            st.integers(),
            st.booleans(),
            st.none(),
            st.just(""),
            st.lists(st.text(max_size=3), max_size=2),
        ),
        "prompt": st.one_of(
            st.none(),
            st.booleans(),
            st.floats(allow_nan=False),
            st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
            st.lists(st.floats(0.5, 9.5), min_size=1, max_size=3),
        ),
        "messages": st.one_of(
            st.just([]),
            st.text(max_size=10),
            st.integers(),
            st.lists(JUNK, min_size=1, max_size=3),
            st.lists(
                st.fixed_dictionaries({"role": JUNK, "content": JUNK}), min_size=1, max_size=2
            ),
        ),
        "max_tokens": st.one_of(
            st.text(max_size=5),
            st.floats(allow_nan=False),
            st.booleans(),
            st.integers(max_value=0),
            st.integers(min_value=10**7),
        ),
        # null is a valid `stream` (OpenAI's spec and vLLM's `bool | None`): not here.
        "stream": st.one_of(st.text(max_size=5), st.integers()),
        "n": st.one_of(st.text(max_size=3), st.floats(0.1, 9.9), st.integers(max_value=0)),
        "max_completion_tokens": st.one_of(st.text(max_size=3), st.integers(max_value=0)),
    }
    # max_completion_tokens is a chat field: vLLM's completions API ignores it (any value)
    chat_only = () if "chat" in path else ("max_completion_tokens",)
    fields = [
        f
        for f in FIELDS
        if (f not in ("prompt", "messages") or f == ("messages" if "chat" in path else "prompt"))
        and f not in chat_only
    ]
    return st.sampled_from(fields).flatmap(lambda f: wrong[f].map(lambda v: build(f, v)))


def _missing(path: str) -> st.SearchStrategy[bytes]:
    required = ["model", "messages" if "chat" in path else "prompt"]
    return st.sampled_from(required).map(
        lambda f: _encode({k: v for k, v in VALID[path].items() if k != f})
    )


def _not_json() -> st.SearchStrategy[bytes]:
    def unparseable(raw: bytes) -> bool:
        try:
            json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return True
        return False

    return st.binary(max_size=200).filter(unparseable)


def _invalid_utf8(path: str) -> st.SearchStrategy[bytes]:
    bad = st.sampled_from(
        [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\\ud800", b"\\udfff x"]
    )
    field = "messages" if "chat" in path else "prompt"

    def build(junk: bytes) -> bytes:
        text = b'"hello ' + junk + b' there"'
        value = b'[{"role": "user", "content": ' + text + b"}]" if field == "messages" else text
        return (
            b'{"model": "'
            + MODEL.encode()
            + b'", "max_tokens": 4, "'
            + field.encode()
            + b'": '
            + value
            + b"}"
        )

    return bad.map(build)


def _not_object() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.lists(st.integers(), max_size=3),
        st.integers(),
        st.text(max_size=10),
        st.none(),
        st.booleans(),
    ).map(_encode)


def _huge(path: str) -> st.SearchStrategy[bytes]:
    def build(size: int) -> bytes:
        document = dict(VALID[path])
        big = "word " * size
        if "chat" in path:
            document["messages"] = [{"role": "user", "content": big}]
        else:
            document["prompt"] = big
        return _encode(document)

    return st.integers(MAX_BODY // 5 + 10, MAX_BODY).map(build)


def _unknown_model(path: str) -> st.SearchStrategy[bytes]:
    return (
        st.text(min_size=1, max_size=30)
        .filter(lambda m: m != MODEL)
        .map(lambda m: _encode({**VALID[path], "model": m}))
    )


def malformed() -> st.SearchStrategy[tuple[str, bytes]]:
    def for_path(path: str) -> st.SearchStrategy[tuple[str, bytes]]:
        return st.one_of(
            _wrong_type(path),
            _missing(path),
            _not_json(),
            _invalid_utf8(path),
            _not_object(),
            _huge(path),
            _unknown_model(path),
        ).map(lambda raw: (path, raw))

    return st.sampled_from(sorted(VALID)).flatmap(for_path)


@pytest.fixture(scope="module")
def router(drill_fleet, tmp_path_factory):
    document = drill_config(drill_fleet, max_body_bytes=MAX_BODY)
    started = launch_router(tmp_path_factory.mktemp("bad-input"), document)
    yield started
    started.stop()


def _indicators(router) -> dict[str, float]:
    state = router.state()
    totals = {"active": state["limiter"]["active"], "queued": state["limiter"]["queued"]}
    for key in ("in_flight", "pending_prefill_tokens", "batch_size"):
        totals[key] = sum(i[key] for i in state["snapshot"]["instances"])
    return totals


def test_malformed_requests_get_4xx_openai_errors(router):
    outcome = Outcome()
    seen: dict[int, int] = {}
    client = httpx.Client(timeout=30, trust_env=False)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(malformed())
    def check(case: tuple[str, bytes]) -> None:
        path, raw = case
        response = client.post(
            router.url + path, content=raw, headers={"content-type": "application/json"}
        )
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        clear = 400 <= response.status_code < 500 and is_error_body(response.text)
        outcome.add(
            "clear" if clear else "lost",
            f"{response.status_code} {raw[:120]!r} -> {response.text[:200]}",
        )
        assert clear, (response.status_code, raw[:200], response.text[:300])

    try:
        check()
    finally:
        client.close()
        record(
            "malformed requests (hypothesis)",
            outcome,
            None,
            notes=f"statuses {dict(sorted(seen.items()))}; every answer a 4xx error body",
        )
    assert router.process.poll() is None, "the router died"
    wait_until(lambda: not any(_indicators(router).values()), 10, "indicators back to zero")
    assert (
        httpx.post(
            router.url + "/v1/completions", json=VALID["/v1/completions"], timeout=30
        ).status_code
        == 200
    )


@pytest.mark.parametrize("junk", [b"\xed\xa0\x80", b"\\ud800"])
def test_surrogates_are_refused_before_any_engine_sees_them(router, junk):
    """Regression: these reached the engine, which failed with 500 on every instance: a 502
    after three retries, and breaker strikes against healthy instances."""
    raw = b'{"model": "' + MODEL.encode() + b'", "max_tokens": 2, "prompt": "a' + junk + b'"}'
    response = httpx.post(router.url + "/v1/completions", content=raw, timeout=30)
    assert response.status_code == 400 and is_error_body(response.text)
    assert all(b["failures"] == 0 for b in router.state()["breakers"].values())
