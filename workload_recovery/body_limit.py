"""A cap on every request body, enforced before the application reads it.

Django's ASGI handler reads a whole request body, spooling it to a temporary file past 2.5 MiB,
before it calls any middleware or view, so a view's own limits (such as the 1 MiB of a log batch
in api/ingest/views.py), authentication and CSRF only run once every byte has arrived: an
anonymous 200 MiB POST to the sign-in form was read whole, then refused. ``BodyLimit`` is ASGI
middleware in front of Django: a declared Content-Length over the path's limit is answered 413
without reading the body, and a body without one (chunked), or longer than it declared, is
counted as Django reads it and cut off once it passes the limit. Either way the answer closes the
connection, so the ASGI server stops reading the rest. It only helps behind a server that hands
the body over as it arrives (uvicorn does; daphne collects it whole first).

Each path has a limit: the one of the longest prefix in ``settings.BODY_LIMITS_BY_PREFIX`` that
it starts with (the API, the admin, the sign-in forms), else ``settings.MAX_BODY_BYTES``.
``BodyLimitMiddleware`` applies the same limits to a declared length inside Django, for requests
that do not come through the ASGI application (the test client, a WSGI server); there the body is
read only when a view asks for it, so refusing in the first middleware is still before the read.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from api.errors import API_PREFIX, error_body

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Application = Callable[[Scope, Receive, Send], Awaitable[None]]
Headers = Iterable[tuple[bytes, bytes]]

# More digits than this is more than any cap, whatever the number; int() is never asked to
# convert an attacker's thousand-digit string.
MAX_LENGTH_DIGITS = 18
UNREASONABLE_LENGTH: int = 10**MAX_LENGTH_DIGITS
DISCONNECT: Message = {"type": "http.disconnect"}


class InvalidContentLength(ValueError):
    """The Content-Length header is not one non-negative whole number."""


def declared_length(headers: Headers) -> int | None:
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


@dataclass(frozen=True)
class BodyLimits:
    """The largest body a path may send: its longest matching prefix's limit, else ``default``."""

    default: int
    by_prefix: Mapping[str, int]

    @classmethod
    def from_settings(cls) -> BodyLimits:
        return cls(settings.MAX_BODY_BYTES, dict(settings.BODY_LIMITS_BY_PREFIX))

    def for_path(self, path: str) -> int:
        matching = [prefix for prefix in self.by_prefix if path.startswith(prefix)]
        if not matching:
            return self.default
        return self.by_prefix[max(matching, key=len)]


@dataclass(frozen=True)
class Refusal:
    """A 413 or 400 for one path: JSON in the API's error shape under /api/, plain text elsewhere
    (a browser that posted a form shows it as it is)."""

    status: int
    message: str
    code: str
    api: bool

    @property
    def content_type(self) -> bytes:
        return b"application/json" if self.api else b"text/plain; charset=utf-8"

    @property
    def body(self) -> bytes:
        if self.api:
            return json.dumps(error_body(self.message, self.code)).encode()
        return f"{self.message}\n".encode()


def too_large(path: str, limit: int) -> Refusal:
    api = path.startswith(API_PREFIX)
    where = "the API accepts" if api else "this address accepts"
    message = f"The request body is too large: {where} at most {limit} bytes per request."
    return Refusal(413, message, "too_large", api)


INVALID_LENGTH_MESSAGE = "The Content-Length header must be one non-negative whole number of bytes."


def invalid_length(path: str) -> Refusal:
    return Refusal(
        400, INVALID_LENGTH_MESSAGE, "invalid_content_length", path.startswith(API_PREFIX)
    )


def refusal_before_reading(path: str, headers: Headers, limit: int) -> Refusal | None:
    """What to answer from the headers alone, before any of the body is read; None: read on.

    ``limit`` is the path's (``BodyLimits.for_path``).
    """
    try:
        length = declared_length(headers)
    except InvalidContentLength:
        return invalid_length(path)
    if length is not None and length > limit:
        return too_large(path, limit)
    return None


async def send_refusal(send: Send, refusal: Refusal) -> None:
    """The answer, after which the connection closes."""
    body = refusal.body
    await send(
        {
            "type": "http.response.start",
            "status": refusal.status,
            "headers": [
                (b"content-type", refusal.content_type),
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

    def __init__(self, receive: Receive, send: Send, refusal: Refusal, limit: int) -> None:
        self._receive = receive
        self._send = send
        self.refusal = refusal
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
            await send_refusal(self._send, self.refusal)
        # An application that already answered can only be stopped: its response stays
        # incomplete and the server drops the connection.
        return DISCONNECT

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.response_started = True
        await self._send(message)


def application_path(scope: Scope) -> str:
    """The path the URL configuration sees: without the prefix the site is mounted under."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if root_path and path.startswith(root_path):
        return path[len(root_path) :]
    return path


class BodyLimit:
    """ASGI middleware for HTTP: each request's body at most its path's limit."""

    def __init__(self, app: Application, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = application_path(scope)
        limit = self.limits.for_path(path)
        refusal = refusal_before_reading(path, scope.get("headers", []), limit)
        if refusal is not None:
            await send_refusal(send, refusal)
            return
        body = CountedBody(receive, send, too_large(path, limit), limit)
        await self.app(scope, body.receive, body.send)


def refusal_response(refusal: Refusal) -> HttpResponse:
    if refusal.api:
        return JsonResponse(error_body(refusal.message, refusal.code), status=refusal.status)
    return HttpResponse(
        refusal.body, status=refusal.status, content_type=refusal.content_type.decode()
    )


class BodyLimitMiddleware:
    """The first Django middleware: a declared length over the path's limit is refused before
    anything reads the body.

    Behind ``BodyLimit`` (uvicorn) it never refuses, the ASGI layer having done so already; it
    matters where requests reach Django another way. A WSGI request without Content-Length has
    an empty body to Django, so there is nothing further to count.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.asynchronous = iscoroutinefunction(get_response)
        if self.asynchronous:
            markcoroutinefunction(self)

    def refusal(self, request: HttpRequest) -> HttpResponse | None:
        # A WSGI server passes an empty CONTENT_LENGTH for a request that declared none.
        declared = request.META.get("CONTENT_LENGTH") or ""
        headers = [(b"content-length", str(declared).encode())] if declared else []
        path = request.path_info
        found = refusal_before_reading(path, headers, BodyLimits.from_settings().for_path(path))
        return None if found is None else refusal_response(found)

    def __call__(self, request: HttpRequest) -> Any:
        if self.asynchronous:
            return self.__acall__(request)
        return self.refusal(request) or self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        return self.refusal(request) or await self.get_response(request)
