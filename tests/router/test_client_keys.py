"""Client API keys on a live router: only hashes in the configuration, 401 in OpenAI's shape
without a valid key when the cluster requires one, debug headers only for debug keys, and
revocation by the next configuration version."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.router.client_keys import DEBUG_KEY, PLAIN_KEY, client_auth
from tests.router.helpers import MODEL, router_config

ROUTE_HEADERS = (
    "x-switchyard-instance",
    "x-switchyard-arm",
    "x-switchyard-policy",
    "x-switchyard-reason",
)
DEBUG_HEADERS = ("x-switchyard-scores", "x-switchyard-cached-tokens")


def _post(router, key: str | None = None, debug: bool = False, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if debug:
        headers["x-switchyard-debug"] = "1"
    body = {"model": MODEL, "prompt": "the same prompt every time " * 8, "max_tokens": 2}
    return httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=10)


def _assert_401(response: httpx.Response, says: str) -> None:
    assert response.status_code == 401
    error = response.json()["error"]
    assert says in error["message"] and error["code"] == 401
    assert error["type"] == "AuthenticationError"
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.fixture
def locked_router(fleet, router_factory):
    return router_factory(router_config(fleet, "lmetric", client_auth=client_auth(True)))


def test_required_keys_refuse_anonymous_and_wrong_keys_in_openai_shape(locked_router):
    _assert_401(_post(locked_router), "didn't provide an API key")
    _assert_401(_post(locked_router, "syk_guess_" + "x" * 40), "Incorrect API key")
    _assert_401(
        _post(locked_router, None, Authorization="Basic dXNlcjpwdw=="),
        "Send it as `Authorization: Bearer <key>`",
    )
    _assert_401(httpx.get(locked_router.url + "/v1/models", timeout=5), "didn't provide an API key")
    models = httpx.get(
        locked_router.url + "/v1/models",
        timeout=5,
        headers={"Authorization": f"Bearer {PLAIN_KEY}"},
    )
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
    # The openai SDK sends its api_key as the bearer token.
    sdk = openai.OpenAI(base_url=locked_router.url + "/v1", api_key=PLAIN_KEY, max_retries=0)
    assert sdk.completions.create(model=MODEL, prompt="hello", max_tokens=2).choices[0].text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=locked_router.url + "/v1", api_key="wrong", max_retries=0
        ).completions.create(model=MODEL, prompt="x", max_tokens=1)
    # /metrics is the operator's, not the clients': the admin token, not a client key.
    for headers in ({}, {"Authorization": f"Bearer {PLAIN_KEY}"}):
        closed = httpx.get(locked_router.url + "/metrics", timeout=5, headers=headers)
        assert closed.status_code == 401 and "switchyard_router" not in closed.text
    assert 'switchyard_router_rejected_total{status="401"}' in locked_router.metrics()


def test_only_a_debug_key_sees_how_the_router_decided(locked_router):
    plain = _post(locked_router, PLAIN_KEY, debug=True)
    assert plain.status_code == 200 and plain.headers["x-switchyard-request-id"]
    assert not any(name in plain.headers for name in ROUTE_HEADERS + DEBUG_HEADERS)
    _post(locked_router, DEBUG_KEY)  # the prompt is now cached somewhere
    debug = _post(locked_router, DEBUG_KEY, debug=True)
    assert debug.status_code == 200
    assert set(json.loads(debug.headers["x-switchyard-scores"])) == {"i0", "i1", "i2", "i3"}
    assert int(debug.headers["x-switchyard-cached-tokens"]) > 0
    assert debug.headers["x-switchyard-instance"] in {"i0", "i1", "i2", "i3"}


def test_a_revoked_key_is_refused_after_the_next_config_version(locked_router):
    assert _post(locked_router, PLAIN_KEY).status_code == 200
    document = router_config_of(locked_router)
    document.update(version=2, client_auth=client_auth(True, plain=False))
    applied = httpx.post(
        locked_router.url + "/admin/config",
        json=document,
        headers=locked_router.admin_headers,
        timeout=5,
    )
    assert applied.status_code == 200, applied.text
    _assert_401(_post(locked_router, PLAIN_KEY), "Incorrect API key")
    assert _post(locked_router, DEBUG_KEY).status_code == 200


def test_an_open_cluster_serves_anyone_but_debugs_only_for_debug_keys(fleet, router_factory):
    router = router_factory(
        router_config(fleet, "lmetric", client_auth=client_auth(False, plain=False))
    )
    anonymous = _post(router, debug=True)
    assert anonymous.status_code == 200
    assert all(name in anonymous.headers for name in ROUTE_HEADERS)
    assert not any(name in anonymous.headers for name in DEBUG_HEADERS)
    unknown = _post(router, "sk-some-engine-key", debug=True)  # passed on, as before
    assert unknown.status_code == 200 and "x-switchyard-scores" not in unknown.headers
    debug = _post(router, DEBUG_KEY, debug=True)
    assert debug.status_code == 200 and "x-switchyard-scores" in debug.headers


def test_a_key_in_plain_text_is_refused_by_the_config_schema(fleet, router_factory):
    document = router_config(fleet, "lmetric")
    document["client_auth"] = {"keys": [{"sha256": PLAIN_KEY}]}
    router = router_factory(router_config(fleet, "lmetric"))
    refused = httpx.post(
        router.url + "/admin/config",
        json={**document, "version": 5},
        headers=router.admin_headers,
        timeout=5,
    )
    assert refused.status_code == 400 and "client_auth.keys.0.sha256" in refused.text


def router_config_of(router) -> dict:
    response = httpx.get(router.url + "/admin/config", headers=router.admin_headers, timeout=5)
    response.raise_for_status()
    return response.json()
