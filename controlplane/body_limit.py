"""Request-body size limits, enforced in front of Django before a byte of the body is read.

Django's ASGI handler reads the whole body (rolling over to a temporary file past
FILE_UPLOAD_MAX_MEMORY_SIZE) before any middleware, authentication or view runs, so a size
check in a view comes after an anonymous client has already written its body to disk. This
ASGI middleware wraps the Django application instead:

- a body whose Content-Length is over the request's limit is answered 413 at once, unread
  (a client that sent ``Expect: 100-continue`` never sends it at all);
- a body without Content-Length (chunked) is counted as it arrives and cut off at the limit;
- every request gets the small limit (``SWITCHYARD_MAX_BODY_BYTES``, kept below Django's
  in-memory spool size so a refused body never reaches the disk), except a request to an
  upload view (``UPLOAD_VIEWS``) whose session belongs to a user with the view's role: it
  gets the upload limit (the trace size plus room for the form's other fields).

Knowing the user cheaply: a session cookie's mere presence costs nothing, but anyone can send
one, so it would hand the upload allowance to anonymous clients. The session is loaded
instead (the session row and the user, the reads Django's own middleware makes for every
request), and only for a declared length over the small limit on an upload path, so other
requests pay nothing. Chunked bodies keep the small limit everywhere: browsers send
Content-Length with form uploads, and a length known up front is what lets us refuse before
reading.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.db import close_old_connections
from django.http.cookie import parse_cookie
from django.urls import Resolver404, resolve

from controlplane.services.roles import has_role

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger(__name__)
# View name -> the role its uploads need (the view's own access rule).
UPLOAD_VIEWS = {"web:replay_create": "operator"}
# Multipart boundaries and the form's other fields, on top of the uploaded file itself.
FORM_ALLOWANCE_BYTES = 1024 * 1024
MIB = 1024 * 1024


def small_limit() -> int:
    return int(settings.SWITCHYARD_MAX_BODY_BYTES)


def upload_limit() -> int:
    return int(settings.SWITCHYARD_MAX_TRACE_UPLOAD_BYTES) + FORM_ALLOWANCE_BYTES


class BodySizeLimit:
    """ASGI middleware: refuse (413) a request body over its limit before it is spooled."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            declared = declared_length(scope)
        except ValueError:
            await refuse(scope, send, 400, "Content-Length must be one non-negative integer")
            return
        limit = small_limit()
        if declared is not None and declared > limit:
            limit = await allowance(scope)
            if declared > limit:
                await refuse(scope, send, 413, too_large(scope, declared, limit))
                return
        await self._counted(scope, receive, send, limit)

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Run the app on a receive that stops at ``limit`` bytes: past it the app is told
        the client left (Django then drops the request unanswered) and we answer 413."""
        body = CountingReceive(receive, limit)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, body, tracking_send)
        if body.overflowed and not started:
            await refuse(scope, send, 413, too_large(scope, None, limit))


class CountingReceive:
    """Passes body chunks through until they add up to more than ``limit`` bytes."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive, self.limit = receive, limit
        self.received = 0
        self.overflowed = False

    async def __call__(self) -> Message:
        if self.overflowed:
            return {"type": "http.disconnect"}
        message = await self.receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.overflowed = True
                return {"type": "http.disconnect"}
        return message


def declared_length(scope: Scope) -> int | None:
    """The Content-Length header as an int, None without one; ValueError when malformed."""
    values = [v for k, v in scope.get("headers", []) if k.lower() == b"content-length"]
    if not values:
        return None
    if len(set(values)) > 1 or not values[0].strip().isdigit():
        raise ValueError("bad Content-Length")
    return int(values[0])


async def allowance(scope: Scope) -> int:
    """The upload limit for a signed-in user with the upload view's role, else the small one."""
    role = upload_role(scope.get("path", ""))
    session_key = session_cookie(scope)
    if role is None or not session_key:
        return small_limit()
    allowed = await sync_to_async(session_has_role)(session_key, role)
    return upload_limit() if allowed else small_limit()


def upload_role(path: str) -> str | None:
    try:
        return UPLOAD_VIEWS.get(resolve(path).view_name)
    except Resolver404:
        return None


def session_cookie(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"cookie":
            key = parse_cookie(value.decode("latin-1")).get(settings.SESSION_COOKIE_NAME)
            if key:
                return key
    return None


def session_has_role(session_key: str, role: str) -> bool:
    """Whether the session is a signed-in, active user holding ``role`` (Django's own session
    and auth-hash checks, as its middleware would make them for the request)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    try:
        # get_user reads only the session (django-stubs asks for a whole request)
        return has_role(get_user(SimpleNamespace(session=store)), role)  # type: ignore[arg-type]
    finally:
        close_old_connections()


def too_large(scope: Scope, declared: int | None, limit: int) -> str:
    size = f"of {declared} bytes" if declared is not None else "without Content-Length"
    message = (
        f"request body too large: a body {size} is over this request's limit of "
        f"{limit} bytes ({limit / MIB:.1f} MiB)"
    )
    if upload_role(scope.get("path", "")) is not None and limit < upload_limit():
        message += (
            f"; trace uploads of up to {upload_limit() / MIB:.0f} MiB need a signed-in "
            "operator and a Content-Length header"
        )
    return message


async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    """An error answer (JSON on the API, plain text elsewhere) that also closes the
    connection, so the server stops reading a body nobody will use."""
    log.warning(
        "refused %s %s from %s: %s",
        scope.get("method"),
        scope.get("path"),
        (scope.get("client") or ("?",))[0],
        message,
    )
    if scope.get("path", "").startswith("/api/"):
        body, kind = json.dumps({"detail": message}).encode(), b"application/json"
    else:
        body, kind = f"{message}\n".encode(), b"text/plain; charset=utf-8"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", kind),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
