"""Where a request's session comes from (router_worker.routing.sessions): X-Session-ID, then
agent harness headers, then a Responses chain, then ``user``; each source switchable off."""

from __future__ import annotations

import pytest

from router_worker.contract.config import ConfigError, parse_config
from router_worker.routing.sessions import (
    HARNESS_HEADERS,
    SESSION_SOURCES,
    ChainTurn,
    ResponseChains,
    SessionSource,
    session_key_from_request,
)

ALL = {
    "x-session-id": "explicit",
    "x-claude-code-agent-id": "subagent-7",
    "x-claude-code-session-id": "root-1",
    "session-id": "codex-2",
}


def test_sources_in_order_and_each_switchable_off():
    body = {"user": "alice"}
    assert session_key_from_request(ALL, body, chain_root="resp_1") == "hdr:explicit"
    no_header = [s for s in SESSION_SOURCES if s != "header"]
    assert session_key_from_request(ALL, body, no_header, "resp_1") == "agent:subagent-7"
    chain_or_user: list[SessionSource] = ["response_chain", "user"]
    assert session_key_from_request(ALL, body, chain_or_user, "resp_1") == "resp:resp_1"
    assert session_key_from_request(ALL, body, chain_or_user) == "user:alice"
    assert session_key_from_request(ALL, body, ["user", "header"]) == "hdr:explicit"  # order fixed
    assert session_key_from_request(ALL, body, []) is None


@pytest.mark.parametrize("name", HARNESS_HEADERS)
def test_each_harness_header_is_a_session(name):
    assert session_key_from_request({name: "s-1"}, {}) == "agent:s-1"
    assert session_key_from_request({name: "s-1"}, {}, ["header", "user"]) is None


def test_claude_code_subagent_gets_its_own_session():
    root = {"x-claude-code-session-id": "root-1"}
    child = {**root, "x-claude-code-agent-id": "child-9"}
    assert session_key_from_request(root, {}) != session_key_from_request(child, {})


def test_a_long_harness_value_is_digested():
    key = session_key_from_request({"session-id": "s" * 100_000}, {})
    assert key is not None and len(key) < 100


def test_response_chains_are_bounded():
    chains = ResponseChains(2)
    for index in range(3):
        chains.put(f"resp_{index}", ChainTurn("resp_0", index, (1, 2), 32))
    assert chains.get("resp_0") is None and len(chains) == 2
    turn = chains.get("resp_2")
    assert turn is not None and turn.root == "resp_0" and turn.turn == 2


def test_config_refuses_an_unknown_source_naming_the_field():
    document = {
        "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
        "policy": {"kind": "round_robin"},
        "session_sources": ["header", "cookie"],
    }
    with pytest.raises(ConfigError, match="session_sources"):
        parse_config(document)
    document["session_sources"] = ["user"]
    assert parse_config(document).session_sources == ["user"]
