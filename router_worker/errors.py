"""The router's errors to its clients: :class:`APIError` and the ASGI answers carrying one
in vLLM's OpenAI shape (the body itself is ``engine_interface.openai_errors``'s)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from engine_interface.openai_errors import (
    APIError,
    ErrorShape,
    error_bytes,
    error_dict,
    sse_error_event,
)

__all__ = [
    "APIError",
    "BackOff",
    "ErrorShape",
    "error_bytes",
    "error_dict",
    "send_error",
    "send_json",
    "sse_error_event",
]

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
JSON_TYPE = (b"content-type", b"application/json")


async def send_json(
    send: Send, status: int, payload: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An ASGI answer of ``payload`` as JSON."""
    data = json.dumps(payload).encode()
    headers = [JSON_TYPE, (b"content-length", str(len(data)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class BackOff(APIError):
    """A refusal that tells the client when to try again (429, 503: ``Retry-After``)."""

    def __init__(self, status: int, message: str, retry_after_s: int) -> None:
        super().__init__(status, message)
        self.retry_after_s = retry_after_s


async def send_error(send: Send, error: APIError, shape: ErrorShape = "openai") -> None:
    """An ASGI answer of ``error`` in the endpoint's error shape (OpenAI's, or Anthropic's
    on ``/v1/messages``)."""
    data = error_bytes(error.status, error.message, error.param, shape)
    headers = [JSON_TYPE, (b"content-length", str(len(data)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="switchyard"'))
    if isinstance(error, BackOff):
        headers.append((b"retry-after", str(error.retry_after_s).encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
