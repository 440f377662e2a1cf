"""vLLM's OpenAI-shaped error body, ``{"error": {"message", "type", "param", "code"}}``: what
enginesim answers as vLLM does and what the router answers its clients, in one place.

vLLM names the type after the status (``BadRequestError`` for a 400, ``NotFoundError`` for
a 404); a stream that fails midway ends with one such body as an SSE event and ``[DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

TYPES = {
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
    """An error answered with ``status`` and the OpenAI error body (the router's to its
    clients, enginesim's as vLLM answers)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_dict(self.status, self.message, self.param)

    def __reduce__(self) -> tuple[type[APIError], tuple[int, str, str | None]]:
        # Raised in the router's intake worker processes and pickled back to the router.
        return (APIError, (self.status, self.message, self.param))


def error_dict(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The body of an error answered with ``status``."""
    error_type = TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def error_bytes(status: int, message: str, param: str | None = None) -> bytes:
    return json.dumps(error_dict(status, message, param)).encode()


def sse_error_event(status: int, message: str) -> bytes:
    """The final events of a stream that failed midway (vLLM streams errors this way)."""
    return b"data: " + error_bytes(status, message) + b"\n\ndata: [DONE]\n\n"
