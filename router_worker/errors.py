"""OpenAI/vLLM-shaped error bodies: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
JSON_TYPE = (b"content-type", b"application/json")

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class APIError(Exception):
    """An error answered to the client with ``status`` and the OpenAI error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[type[APIError], tuple[int, str, str | None]]:
        # Raised in intake worker processes and pickled back to the router.
        return (APIError, (self.status, self.message, self.param))


def error_dict(status: int, message: str, param: str | None = None) -> dict[str, object]:
    error_type = _TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def error_bytes(status: int, message: str, param: str | None = None) -> bytes:
    return json.dumps(error_dict(status, message, param)).encode()


def sse_error_event(status: int, message: str) -> bytes:
    """The final events of a stream that failed midway (vLLM streams errors this way)."""
    return b"data: " + error_bytes(status, message) + b"\n\ndata: [DONE]\n\n"


async def send_json(
    send: Send, status: int, payload: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An ASGI answer of ``payload`` as JSON."""
    data = json.dumps(payload).encode()
    headers = [JSON_TYPE, (b"content-length", str(len(data)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def send_error(send: Send, error: APIError) -> None:
    """An ASGI answer of ``error`` in the OpenAI error shape."""
    data = error_bytes(error.status, error.message, error.param)
    headers = [JSON_TYPE, (b"content-length", str(len(data)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="switchyard"'))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
