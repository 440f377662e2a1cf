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


# ----- the agent APIs: /v1/responses (OpenAI's error shape) and /v1/messages (Anthropic's)
AGENT_EXAMPLES = 120
AGENT_VALID: dict[str, dict[str, Any]] = {
    "/v1/responses": {"model": MODEL, "input": "hello there", "max_output_tokens": 4},
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}],
    },
}
NOT_A_ROLE = JUNK.filter(lambda r: r not in ("user", "assistant", "system", "ctx", "msg"))
AGENT_WRONG: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "/v1/responses": {
        "model": st.one_of(st.integers(), st.booleans(), st.none(), st.just("")),
        "input": st.one_of(
            st.none(),
            st.just([]),
            st.integers(),
            st.lists(st.one_of(st.integers(), st.none(), st.booleans()), min_size=1),
            st.lists(st.fixed_dictionaries({"type": st.text(max_size=8)}), min_size=1),
        ),
        "max_output_tokens": st.one_of(
            st.text(max_size=5), st.booleans(), st.integers(max_value=0), st.just(10**7)
        ),
        "previous_response_id": st.one_of(st.integers(), st.booleans(), st.text(max_size=8)),
        "instructions": st.one_of(st.integers(), st.lists(st.integers(), max_size=2)),
        "stream": st.one_of(st.text(max_size=5), st.integers()),
    },
    "/v1/messages": {
        "model": st.one_of(st.integers(), st.booleans(), st.none(), st.just("")),
        "messages": st.one_of(
            st.none(),
            st.text(max_size=10),
            st.integers(),
            st.lists(st.one_of(st.integers(), st.none()), min_size=1, max_size=3),
            st.lists(st.fixed_dictionaries({"role": NOT_A_ROLE, "content": JUNK}), min_size=1),
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.just("user"), "content": st.one_of(st.none(), st.integers())}
                ),
                min_size=1,
            ),
        ),
        "max_tokens": st.one_of(
            st.text(max_size=5), st.booleans(), st.integers(max_value=0), st.just(10**7)
        ),
        "system": st.one_of(st.integers(), st.lists(st.integers(), min_size=1, max_size=2)),
        "stream": st.one_of(st.text(max_size=5), st.integers()),
    },
}


def _agent_case(path: str) -> st.SearchStrategy[bytes]:
    valid = AGENT_VALID[path]
    wrong = AGENT_WRONG[path]
    required = [f for f in ("model", "input", "messages", "max_tokens") if f in valid]
    broken = st.sampled_from(sorted(wrong)).flatmap(
        lambda f: wrong[f].map(lambda v: _encode({**valid, f: v}))
    )
    missing = st.sampled_from(required).map(
        lambda f: _encode({k: v for k, v in valid.items() if k != f})
    )
    unknown = st.text(min_size=1, max_size=30).filter(lambda m: m != MODEL)
    return st.one_of(
        broken,
        missing,
        _not_json(),
        _not_object(),
        unknown.map(lambda m: _encode({**valid, "model": m})),
    )


def _agent_error_body(path: str, text: str) -> bool:
    if path != "/v1/messages":
        return is_error_body(text)
    try:
        body = json.loads(text)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return (
        body.get("type") == "error"
        and isinstance(error, dict)
        and set(error) == {"type", "message"}
        and bool(error["message"])
    )


def test_malformed_agent_requests_get_4xx_in_their_apis_shape(router):
    outcome = Outcome()
    seen: dict[int, int] = {}
    client = httpx.Client(timeout=30, trust_env=False)
    cases = st.sampled_from(sorted(AGENT_VALID)).flatmap(
        lambda path: _agent_case(path).map(lambda raw: (path, raw))
    )

    @settings(
        max_examples=AGENT_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases)
    def check(case: tuple[str, bytes]) -> None:
        path, raw = case
        response = client.post(
            router.url + path, content=raw, headers={"content-type": "application/json"}
        )
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        clear = 400 <= response.status_code < 500 and _agent_error_body(path, response.text)
        outcome.add(
            "clear" if clear else "lost",
            f"{path} {response.status_code} {raw[:120]!r} -> {response.text[:200]}",
        )
        assert clear, (path, response.status_code, raw[:200], response.text[:300])

    try:
        check()
    finally:
        client.close()
        record(
            "malformed Responses and Messages requests (hypothesis)",
            outcome,
            None,
            notes=f"statuses {dict(sorted(seen.items()))}; every answer a 4xx in its API's shape",
        )
    assert router.process.poll() is None, "the router died"
    wait_until(lambda: not any(_indicators(router).values()), 10, "indicators back to zero")
    for path, body in AGENT_VALID.items():
        assert httpx.post(router.url + path, json=body, timeout=30).status_code == 200, path
