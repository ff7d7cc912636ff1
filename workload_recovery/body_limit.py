"""A cap on request bodies under /api/, enforced before the application reads them.

Django reads a whole request body before it calls a view, so the API's own limits (such as the
1 MiB of a log batch in api/ingest/views.py) and its authentication only run once every byte has
arrived. This ASGI middleware sits in front of Django: a declared Content-Length over the cap is
answered 413 without reading the body, and a body without one (chunked) is counted as Django
reads it and cut off once it passes the cap. Either way the answer closes the connection, so the
ASGI server stops reading the rest. It only helps behind a server that hands the body over as it
arrives (uvicorn does; daphne collects it whole first).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from api.errors import API_PREFIX, error_body

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Application = Callable[[Scope, Receive, Send], Awaitable[None]]

# More digits than this is more than any cap, whatever the number; int() is never asked to
# convert an attacker's thousand-digit string.
MAX_LENGTH_DIGITS = 18
UNREASONABLE_LENGTH: int = 10**MAX_LENGTH_DIGITS
DISCONNECT: Message = {"type": "http.disconnect"}


class InvalidContentLength(ValueError):
    """The Content-Length header is not one non-negative whole number."""


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body length the client declared, or None when it declared none (chunked).

    Repeated headers, or a comma-separated list, are accepted only when every value is the same
    (RFC 9110, section 8.6). A value with more than MAX_LENGTH_DIGITS digits is
    UNREASONABLE_LENGTH, over any cap.
    """
    values = [
        part.strip(b" \t")
        for name, value in headers
        if name.lower() == b"content-length"
        for part in value.split(b",")
    ]
    if not values:
        return None
    # bytes.isdigit() is ASCII digits only: no sign, space, underscore, and not empty.
    if not all(value.isdigit() for value in values):
        raise InvalidContentLength
    numbers = {value.lstrip(b"0") or b"0" for value in values}
    if len(numbers) > 1:
        raise InvalidContentLength
    digits = numbers.pop()
    if len(digits) > MAX_LENGTH_DIGITS:
        return UNREASONABLE_LENGTH
    return int(digits)


def too_large_message(limit: int) -> str:
    return f"The request body is too large: the API accepts at most {limit} bytes per request."


INVALID_LENGTH_MESSAGE = "The Content-Length header must be one non-negative whole number of bytes."


async def send_error(send: Send, status: int, message: str, code: str) -> None:
    """An API error in the shape of api/errors.py; the connection closes after it."""
    body = json.dumps(error_body(message, code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body is never read, so the connection cannot carry another
                # request: the server closes it instead of reading on.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class CountedBody:
    """One request's receive and send, cut off once the body passes ``limit`` bytes."""

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self.received = 0
        self.refused = False
        self.response_started = False

    async def receive(self) -> Message:
        if self.refused:
            return DISCONNECT
        message = await self._receive()
        if message["type"] != "http.request":
            return message
        self.received += len(message.get("body", b""))
        if self.received <= self.limit:
            return message
        self.refused = True
        if not self.response_started:
            await send_error(self._send, 413, too_large_message(self.limit), "too_large")
        # An application that already answered can only be stopped: its response stays
        # incomplete and the server drops the connection.
        return DISCONNECT

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.response_started = True
        await self._send(message)


class ApiBodyLimit:
    """ASGI middleware for HTTP: bodies under ``prefix`` may be at most ``max_body_bytes``."""

    def __init__(self, app: Application, max_body_bytes: int, prefix: str = API_PREFIX) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.prefix = prefix

    def applies_to(self, scope: Scope) -> bool:
        if scope["type"] != "http":
            return False
        path: str = scope["path"]
        root_path: str = scope.get("root_path", "")
        if root_path and path.startswith(root_path):
            path = path[len(root_path) :]
        return path.startswith(self.prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.applies_to(scope):
            await self.app(scope, receive, send)
            return
        try:
            length = declared_length(scope.get("headers", []))
        except InvalidContentLength:
            await send_error(send, 400, INVALID_LENGTH_MESSAGE, "invalid_content_length")
            return
        if length is not None and length > self.max_body_bytes:
            await send_error(send, 413, too_large_message(self.max_body_bytes), "too_large")
            return
        body = CountedBody(receive, send, self.max_body_bytes)
        await self.app(scope, body.receive, body.send)
