"""The one HTTP client for every outside service: log stores, metric stores, the attribution
provider.

Built on httpx, with what every caller needs and nothing it has to remember:

- a timeout on each phase (connect, each read, each write) and a deadline on the whole exchange,
  checked while the body streams in, so a server that trickles bytes counts as timing out; with
  ``hard_deadline`` the exchange runs in a daemon thread abandoned at the deadline, which also
  bounds a server that trickles its headers;
- no redirect followed: a redirect would resend the credentials wherever it points (often a login
  page), so it is returned as the answer, with its ``Location``;
- a body read in chunks and refused past a size limit rather than held in memory;
- a bearer token or basic auth, and JSON decoding that says what the server sent.

A failure to get an answer at all raises ``HttpError`` (or the caller's subclass) with an
``ErrorKind`` and a one-line diagnosis that names the server, never its credentials. An answer of
any status is returned as a ``Reply`` for the caller to interpret.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any

import httpx

logger = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
# The body of an error is a courtesy, read for the server's own explanation: never more.
ERROR_BODY_BYTES = 64 * 1024
MAX_SERVER_MESSAGE = 300
MAX_REASON_CHARS = 200


class ErrorKind(StrEnum):
    """What went wrong, for code; ``str(error)`` says it for people."""

    INVALID_URL = "invalid_url"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    AUTH = "auth"
    BAD_QUERY = "bad_query"
    NOT_FOUND = "not_found"
    # The server answered, but it is not the Prometheus API (a UI, a proxy, another service).
    NOT_PROMETHEUS = "not_prometheus"
    SERVER = "server"
    MALFORMED = "malformed"
    OVERSIZED = "oversized"
    HTTP = "http"


class HttpError(Exception):
    """An outside service could not be read; ``str()`` is a one-line diagnosis.

    ``reason`` is the bare cause without the server's name (``[Errno 111] Connection refused``),
    for callers that phrase their own diagnosis.
    """

    def __init__(
        self, kind: str, diagnosis: str, *, status: int | None = None, reason: str = ""
    ) -> None:
        super().__init__(diagnosis)
        self.kind = kind
        self.diagnosis = diagnosis
        self.status = status
        self.reason = reason or diagnosis


@dataclass(frozen=True)
class Wording:
    """How a caller's diagnoses end, where it knows better than "is this an HTTP server?"."""

    # After "<where> refused the connection: nothing listens there".
    refused: str = ""
    # A peer that does not speak HTTP: the kind, and the question after "did not answer in HTTP".
    not_http_kind: ErrorKind = ErrorKind.MALFORMED
    not_http: str = "is this an HTTP server?"
    # What to change when the body is larger than the limit.
    oversized: str = "narrow the query"


PLAIN = Wording()


@dataclass(frozen=True)
class Reply:
    """An answer of any status. The body of a 2xx is whole; of anything else, its first 64 KiB."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def authorization(*, bearer_token: str = "", username: str = "", password: str = "") -> str:
    """The ``Authorization`` header value for a bearer token or basic auth ("" for neither)."""
    if bearer_token:
        return f"Bearer {bearer_token}"
    if username:
        pair = f"{username}:{password}".encode()
        return "Basic " + base64.b64encode(pair).decode()
    return ""


def describe_url(url: str) -> str:
    """``url`` without credentials, query or fragment: fit for a diagnosis."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or ""
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path.rstrip('/')}"


def with_query(url: str, params: Mapping[str, str | int] | list[tuple[str, str]]) -> str:
    """``url`` with ``params`` form-encoded as its query string (none when empty)."""
    encoded = urllib.parse.urlencode(params)
    return url + ("?" + encoded if encoded else "")


def parse_json(body: bytes, *, replace_invalid_utf8: bool = False) -> Any:
    """The JSON value of ``body``; ``ValueError`` when it is not JSON.

    With ``replace_invalid_utf8`` a bad byte inside a string becomes U+FFFD instead of costing
    the whole body.
    """
    if replace_invalid_utf8:
        return json.loads(body.decode("utf-8", errors="replace"))
    return json.loads(body)


def server_message(body: bytes, *, skip_html: bool = False) -> str:
    """The server's own explanation, from a JSON error object or plain text, on one line.

    With ``skip_html`` an HTML page says nothing (its markup would only be noise).
    """
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key in ("error", "message", "msg"):
            if isinstance(data.get(key), str):
                text = data[key]
                break
    elif skip_html and text.startswith("<"):
        return ""
    return " ".join(text.split())[:MAX_SERVER_MESSAGE]


def exchange(
    method: str,
    url: str,
    *,
    timeout: float,
    max_response_bytes: int,
    where: str,
    headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
    wording: Wording = PLAIN,
    error: type[HttpError] = HttpError,
    hard_deadline: bool = False,
) -> Reply:
    """Send one request and return the answer, whatever its status, within ``timeout`` in all.

    ``where`` names the server in diagnoses. Raises ``error`` (``HttpError`` or a subclass)
    when no answer could be had: unreachable, too slow, not HTTP, or a body over
    ``max_response_bytes``.
    """
    request = _Request(method, url, timeout, max_response_bytes, where, headers, content)

    def attempt() -> Reply:
        return _exchange(request, wording, error)

    if hard_deadline:
        return _within(timeout, attempt, lambda: _timed_out(request, error))
    return attempt()


@dataclass(frozen=True)
class _Request:
    method: str
    url: str
    timeout: float
    max_response_bytes: int
    where: str
    headers: Mapping[str, str] | None
    content: bytes | None


@cache
def _tls() -> ssl.SSLContext:
    # The system's trust store, as the standard library uses; loading it is the slow part of a
    # client, so one context serves every request.
    return ssl.create_default_context()


def _exchange(request: _Request, wording: Wording, error: type[HttpError]) -> Reply:
    deadline = time.monotonic() + request.timeout
    try:
        with (
            httpx.Client(timeout=request.timeout, follow_redirects=False, verify=_tls()) as client,
            client.stream(
                request.method, request.url, headers=request.headers, content=request.content
            ) as response,
        ):
            if not response.is_success:
                return Reply(response.status_code, response.headers, _error_body(response))
            body = _read_bounded(response, request, deadline, wording, error)
            return Reply(response.status_code, response.headers, body)
    except httpx.TimeoutException:
        raise _timed_out(request, error) from None
    except httpx.ProtocolError as exc:
        raise _not_http(exc, request, wording, error) from None
    except (httpx.ReadError, httpx.WriteError) as exc:
        # A peer that accepted the connection and then reset it, before any HTTP answer, is a
        # port that does not speak HTTP (an SSH daemon reading a request it does not understand
        # resets once the request arrives in more than one segment), not a network failure.
        if isinstance(_root_cause(exc), ConnectionResetError | BrokenPipeError):
            raise _not_http(exc, request, wording, error) from None
        raise _network_error(exc, request, wording, error) from None
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise error(
            ErrorKind.INVALID_URL, f"{request.where}: not a usable URL ({exc})", reason=str(exc)
        ) from None
    except (httpx.TransportError, OSError) as exc:
        raise _network_error(exc, request, wording, error) from None


def _not_http(
    exc: BaseException, request: _Request, wording: Wording, error: type[HttpError]
) -> HttpError:
    cause = _root_cause(exc)
    named = type(exc).__name__
    return error(
        wording.not_http_kind,
        f"{request.where} did not answer in HTTP ({named}): {wording.not_http}",
        reason=f"{named}: {cause if cause is not exc else exc}",
    )


def _read_bounded(
    response: httpx.Response,
    request: _Request,
    deadline: float,
    wording: Wording,
    error: type[HttpError],
) -> bytes:
    limit = request.max_response_bytes
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _oversized(request, int(declared), wording, error)
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes(READ_CHUNK):
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the whole exchange took longer than the timeout")
        size += len(chunk)
        if size > limit:
            raise _oversized(request, size, wording, error)
        chunks.append(chunk)
    if time.monotonic() > deadline:
        raise httpx.ReadTimeout("the whole exchange took longer than the timeout")
    return b"".join(chunks)


def _error_body(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_bytes(READ_CHUNK):
            chunks.append(chunk[: ERROR_BODY_BYTES - size])
            size += len(chunks[-1])
            if size >= ERROR_BODY_BYTES:
                break
    except Exception:  # the body of an error is a courtesy; its absence is not a new error
        logger.debug("the body of an error reply could not be read", exc_info=True)
        return b""
    return b"".join(chunks)


def _oversized(request: _Request, size: int, wording: Wording, error: type[HttpError]) -> HttpError:
    limit = request.max_response_bytes
    return error(
        ErrorKind.OVERSIZED,
        f"{request.where} sent more than {limit:,} bytes (at least {size:,}): {wording.oversized}",
        reason=f"body larger than {limit} bytes",
    )


def _timed_out(request: _Request, error: type[HttpError]) -> HttpError:
    return error(
        ErrorKind.TIMEOUT,
        f"{request.where} did not answer within {request.timeout:g}s",
        reason=f"timed out after {round(request.timeout, 3)} s",
    )


def _network_error(
    exc: BaseException, request: _Request, wording: Wording, error: type[HttpError]
) -> HttpError:
    cause = _root_cause(exc)
    where = request.where
    if isinstance(cause, ConnectionRefusedError):
        text = f"{where} refused the connection: nothing listens there{wording.refused}"
    elif isinstance(cause, socket.gaierror):
        text = f"{where}: the host name does not resolve"
    else:
        said = str(getattr(cause, "strerror", None) or cause)[:MAX_REASON_CHARS]
        text = f"{where} is unreachable: {said}"
    return error(ErrorKind.UNREACHABLE, text, reason=str(cause)[:MAX_REASON_CHARS])


def _root_cause(exc: BaseException) -> BaseException:
    """The operating system's error under httpx's and httpcore's wrappers, when there is one."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def _within(
    timeout: float, attempt: Callable[[], Reply], timed_out: Callable[[], HttpError]
) -> Reply:
    """``attempt()`` if it ends within ``timeout`` seconds, else ``timed_out()`` raised.

    Per-phase timeouts bound each wait, not the whole exchange (a server could trickle its
    headers byte by byte), so the exchange runs in a daemon thread that is abandoned at the
    deadline; its own timeouts end it soon after.
    """
    result: list[Reply | BaseException] = []

    def run() -> None:
        try:
            result.append(attempt())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            result.append(exc)

    worker = threading.Thread(target=run, name="http-exchange", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        raise timed_out()
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
