"""Sessions without client changes, through a live router: an agent harness's own session
header is a session to SMetric (and the canary arms) unless the cluster switches that
source off (``session_sources``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.router.helpers import MODEL, router_config

PROMPT = "Refactor the parser. " + " ".join(f"file{i}" for i in range(80))


def _basis(router: Any, headers: dict[str, str]) -> list[Any]:
    """SMetric's basis for calling each of two completions a follow-up or not (completions
    carry no turn index: only a session, else a strong local hit, can say)."""
    bases = []
    for turn in range(2):
        body = {"model": MODEL, "prompt": f"{PROMPT} turn {turn}", "max_tokens": 2}
        answer = httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        bases.append(router.state()["recent_decisions"][-1]["details"]["turn_basis"])
    return bases


@pytest.mark.parametrize(
    ("header", "sources", "basis"),
    [
        ("x-claude-code-session-id", None, "session_key"),
        ("session-id", None, "session_key"),  # Codex
        ("x-claude-code-session-id", ["header", "response_chain", "user"], "local_hit"),
        ("x-session-id", ["header"], "session_key"),
        ("x-session-id", ["harness", "user"], "local_hit"),
    ],
)
def test_harness_session_headers_and_switching_them_off(
    fleet, router_factory, header, sources, basis
):
    extra = {} if sources is None else {"session_sources": sources}
    router = router_factory(router_config(fleet, "smetric", **extra))
    assert _basis(router, {header: "agent-run-7"}) == [basis, basis]
