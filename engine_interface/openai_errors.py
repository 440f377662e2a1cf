"""vLLM's error bodies: what enginesim answers as vLLM does and what the router answers its
clients, in one place.

Two shapes (:data:`ErrorShape`): OpenAI's ``{"error": {"message", "type", "param",
"code"}}`` on the OpenAI endpoints (chat, completions, responses), and Anthropic's
``{"type": "error", "error": {"type", "message"}}`` on ``/v1/messages`` (vLLM translates
its error there). vLLM names the type after the status (``BadRequestError`` for a 400,
``NotFoundError`` for a 404). A stream that fails midway ends with one such body as an SSE
event: OpenAI's as ``data:`` and ``[DONE]``, Anthropic's as an ``error`` event.
"""

from __future__ import annotations

import json
from typing import Any, Literal

ErrorShape = Literal["openai", "anthropic"]

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

    def body(self, shape: ErrorShape = "openai") -> dict[str, Any]:
        return error_dict(self.status, self.message, self.param, shape)

    def __reduce__(self) -> tuple[type[APIError], tuple[int, str, str | None]]:
        # Raised in the router's intake worker processes and pickled back to the router.
        return (APIError, (self.status, self.message, self.param))


def error_dict(
    status: int, message: str, param: str | None = None, shape: ErrorShape = "openai"
) -> dict[str, Any]:
    """The body of an error answered with ``status``."""
    error_type = TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    if shape == "anthropic":
        return {"type": "error", "error": {"type": error_type, "message": message}}
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def error_bytes(
    status: int, message: str, param: str | None = None, shape: ErrorShape = "openai"
) -> bytes:
    return json.dumps(error_dict(status, message, param, shape)).encode()


def sse_error_event(status: int, message: str, shape: ErrorShape = "openai") -> bytes:
    """The final events of a stream that failed midway (vLLM streams errors this way)."""
    if shape == "anthropic":
        return b"event: error\ndata: " + error_bytes(status, message, shape=shape) + b"\n\n"
    return b"data: " + error_bytes(status, message) + b"\n\ndata: [DONE]\n\n"
