"""The live router's side of prefill/decode disaggregation: the bodies of the two calls.

The flow is vLLM's own with its NIXL connector (the one its disaggregation proxy drives):
the prefill call is the client's body with ``kv_transfer_params.do_remote_decode``,
``max_tokens`` 1 and no streaming; its answer's ``kv_transfer_params`` (the prefill
engine's id, its request id, block ids, side-channel host and port) go into the decode
call, which is the client's body otherwise unchanged and whose answer is relayed to the
client as the response. Placement, the decider and the retry rule are the plan's
(:mod:`router_worker.plan`, :mod:`router_worker.routing.disagg`); sending is the
dispatcher's (:mod:`router_worker.dispatch`).
"""

from __future__ import annotations

import json
from typing import Any

PARAMS = "kv_transfer_params"
PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Sampling limits the prefill call cannot honour with one token.
_PREFILL_DROPS = ("stream_options", "min_tokens", "min_completion_tokens")


def prefill_body(raw: bytes) -> bytes:
    """The prefill call's body: the client's, computing the prompt and one token."""
    body = json.loads(raw)
    body[PARAMS] = dict(PREFILL_PARAMS)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for name in _PREFILL_DROPS:
        body.pop(name, None)
    return json.dumps(body, separators=(",", ":")).encode()


def decode_body(raw: bytes, params: dict[str, Any]) -> bytes:
    """The decode call's body: the client's, with the prefill's ``kv_transfer_params``."""
    body = json.loads(raw)
    body[PARAMS] = params
    return json.dumps(body, separators=(",", ":")).encode()


def answered_params(data: bytes) -> dict[str, Any] | None:
    """The prefill answer's ``kv_transfer_params`` (None: it has none, or not JSON)."""
    try:
        params = json.loads(data).get(PARAMS)
    except (ValueError, AttributeError):
        return None
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None
    return params
