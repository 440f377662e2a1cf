"""Admission before intake, through a live router: a request takes its concurrency slot (or
is refused) before its body is read, so a refused request's body is never read or parsed."""

from __future__ import annotations

import socket

import httpx

from devharness import wait_until
from tests.drills.clients import MODEL
from tests.router.helpers import router_config

BODY = b'{"model": "%s", "prompt": "hello there", "max_tokens": 1}' % MODEL.encode()


def _head(length: int) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % length
    )


def test_a_request_over_the_limits_is_refused_before_its_body_is_parsed(fleet, router_factory):
    document = router_config(fleet)
    document["router"].update(max_concurrency=1, max_queue=0)
    router = router_factory(document)
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as slow:
        # Holds the only slot while its body is still coming.
        slow.sendall(_head(len(BODY)) + BODY[:10])
        wait_until(lambda: router.state()["limiter"]["active"] == 1, 5, "slot taken")
        refused = httpx.post(
            router.url + "/v1/completions",
            content=b"{not json at all",
            headers={"content-type": "application/json"},
            timeout=10,
        )
        # The body was never parsed: the refusal is the limiter's, not a 400 for the JSON.
        assert refused.status_code == 429, refused.text
        assert "overloaded" in refused.json()["error"]["message"]
        slow.sendall(BODY[10:])
        answer = slow.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert router.state()["limiter"]["active"] == 0
