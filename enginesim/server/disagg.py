"""vLLM's disaggregated-serving interface (its NIXL connector's ``kv_transfer_params``).

A request's ``kv_transfer_params``, as vLLM's NIXL connector reads them:

* ``{"do_remote_decode": true, ...}`` (the prefill call, sent with ``max_tokens`` 1 and
  ``stream`` false): the instance computes the prompt and, when the request finishes,
  holds its blocks; its answer's ``kv_transfer_params`` say where to read them:
  ``do_remote_prefill`` true, ``do_remote_decode`` false, ``remote_engine_id``,
  ``remote_request_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``,
  ``tp_size``.
* ``{"do_remote_prefill": true, "remote_engine_id": ..., ...}`` (the decode call, those
  params as the prefill answered them): the instance reads the blocks over its link, then
  decodes. vLLM's side channel is a NIXL handshake; enginesim's is the prefill instance's
  own HTTP port: ``POST /kv_transfer/claim`` checks the engine id and the blocks and says
  how many prompt tokens they hold, ``POST /kv_transfer/release`` frees them once read. A
  claim that fails (the prefill instance gone or restarted, the blocks freed by its
  timeout, other blocks than it holds) is a failed transfer: the decode call is answered
  with a 500 before any byte and counted in ``vllm:nixl_num_failed_transfers``.

An instance's role (``--roles``) is what the router is told it is for: a ``prefill``
instance refuses ``do_remote_prefill``, a ``decode`` one ``do_remote_decode``; ``both``
takes either, and every role serves plain requests, as vLLM with ``kv_role: kv_both``
does.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from engine_interface.openai_errors import APIError

log = logging.getLogger(__name__)

PARAM = "kv_transfer_params"
CLAIM_PATH = "/kv_transfer/claim"
RELEASE_PATH = "/kv_transfer/release"
SIDE_CHANNEL_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class RemoteBlocks:
    """Where a decode call reads its prompt's KV: the prefill's answer, as sent back."""

    engine_id: str
    request_id: str
    block_ids: tuple[int, ...]
    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def as_json(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "request_id": self.request_id,
            "block_ids": list(self.block_ids),
        }


@dataclass(frozen=True, slots=True)
class KVTransfer:
    """A request's ``kv_transfer_params``: a prefill for a remote decode (``hold``), or a
    decode of a remote prefill (``remote``)."""

    hold: bool
    remote: RemoteBlocks | None


def _field(params: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = params.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise APIError(400, f"{PARAM}.{name} must be {what}, got {value!r}", f"{PARAM}.{name}")
    return value


def _flag(params: dict[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(400, f"{PARAM}.{name} must be a boolean, got {value!r}", f"{PARAM}.{name}")
    return value


def parse_kv_transfer(body: dict[str, Any], role: str, stream: bool) -> KVTransfer | None:
    """The body's ``kv_transfer_params`` (None: absent or asking for nothing); a 400
    naming the field when malformed or not for this instance's role."""
    params = body.get(PARAM)
    if params is None:
        return None
    if not isinstance(params, dict):
        raise APIError(400, f"{PARAM} must be an object", PARAM)
    decode, prefill = _flag(params, "do_remote_decode"), _flag(params, "do_remote_prefill")
    if decode and prefill:
        raise APIError(
            400, f"{PARAM}: do_remote_decode and do_remote_prefill exclude each other", PARAM
        )
    if decode:
        if role == "decode":
            raise APIError(400, f"{PARAM}.do_remote_decode: this is a decode instance", PARAM)
        if stream:
            raise APIError(400, f"{PARAM}.do_remote_decode needs stream false", "stream")
        return KVTransfer(hold=True, remote=None)
    if not prefill:
        return None
    if role == "prefill":
        raise APIError(400, f"{PARAM}.do_remote_prefill: this is a prefill instance", PARAM)
    ids = _field(params, "remote_block_ids", list, "a list of block ids")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise APIError(400, f"{PARAM}.remote_block_ids must hold block ids (integers >= 0)", PARAM)
    port = _field(params, "remote_port", int, "a port number")
    if not 0 < port < 65536:
        raise APIError(400, f"{PARAM}.remote_port must be a port number, got {port}", PARAM)
    remote = RemoteBlocks(
        engine_id=_field(params, "remote_engine_id", str, "the prefill engine's id"),
        request_id=_field(params, "remote_request_id", str, "the prefill's request id"),
        block_ids=tuple(ids),
        host=_field(params, "remote_host", str, "a host name"),
        port=port,
    )
    return KVTransfer(hold=False, remote=remote)


def answer_params(
    engine_id: str, request_id: str, block_ids: list[int], host: str, port: int
) -> dict[str, Any]:
    """The prefill answer's ``kv_transfer_params``: where the decode instance reads."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_block_ids": block_ids,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    }


class TransferFailed(Exception):
    """A decode call's blocks cannot be read."""


class SideChannel:
    """A decode instance's calls to prefill instances' side channels."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=SIDE_CHANNEL_TIMEOUT)
        return self._client

    async def claim(self, remote: RemoteBlocks) -> int:
        """Prompt tokens the blocks hold; :class:`TransferFailed` if they cannot be read."""
        try:
            response = await self.client.post(remote.base_url + CLAIM_PATH, json=remote.as_json())
        except httpx.HTTPError as error:
            raise TransferFailed(f"prefill side channel {remote.base_url}: {error!r}") from None
        if response.status_code != 200:
            raise TransferFailed(f"prefill {remote.engine_id}: {response.text}")
        return int(response.json()["num_tokens"])

    def release(self, remote: RemoteBlocks) -> None:
        """Tell the prefill instance its blocks were read (in the background)."""
        task = asyncio.ensure_future(self._release(remote))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _release(self, remote: RemoteBlocks) -> None:
        try:
            await self.client.post(remote.base_url + RELEASE_PATH, json=remote.as_json())
        except httpx.HTTPError as error:  # the hold times out on its own
            log.warning("release of %s on %s failed: %r", remote.request_id, remote.host, error)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
