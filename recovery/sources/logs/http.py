"""Reading a log store over HTTP with the standard library: bounded, timed, and explained.

Every failure becomes one ``LogSourceError`` whose message is a one-line diagnosis an operator
can act on (the configurator shows it as is); ``kind`` lets code tell the cases apart.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
READ_CHUNK = 64 * 1024
MAX_SERVER_MESSAGE = 300
USER_AGENT = "workload-recovery-log-connector/1"


class ErrorKind:
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    AUTH = "auth"
    BAD_QUERY = "bad_query"
    NOT_FOUND = "not_found"
    SERVER = "server"
    MALFORMED = "malformed"
    OVERSIZED = "oversized"
    HTTP = "http"


class LogSourceError(Exception):
    """A log store could not be read; ``str()`` is a one-line diagnosis."""

    def __init__(self, kind: str, diagnosis: str, *, status: int | None = None) -> None:
        super().__init__(diagnosis)
        self.kind = kind
        self.diagnosis = diagnosis
        self.status = status


@dataclass(frozen=True)
class HttpSettings:
    """Where a log store answers and how to authenticate; secrets are kept out of ``repr``."""

    base_url: str
    timeout: float = DEFAULT_TIMEOUT
    bearer_token: str = field(default="", repr=False)
    username: str = ""
    password: str = field(default="", repr=False)
    headers: Mapping[str, str] = field(default_factory=dict)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"{self.base_url!r} is not an http(s) URL")
        if parsed.query or parsed.fragment:
            raise ValueError("the base URL must not carry a query or fragment")
        if self.bearer_token and self.username:
            raise ValueError("give a bearer token or a user name and password, not both")
        if not 0 < self.timeout <= 300:
            raise ValueError("the timeout must be between 0 and 300 seconds")
        for name, value in self.headers.items():
            if not name or any(c in name + value for c in "\r\n"):
                raise ValueError(f"header {name!r} is not a valid header")

    def request_headers(self) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **self.headers}
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        elif self.username:
            pair = f"{self.username}:{self.password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        return headers


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would resend the credentials wherever it points; report it instead.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def get(settings: HttpSettings, path: str, params: Mapping[str, str | int], service: str) -> bytes:
    """GET ``base_url + path`` and return the body of a 200, or raise ``LogSourceError``.

    ``service`` names the store in diagnoses ("Loki", "VictoriaLogs"). The whole exchange must
    end within ``timeout`` (a server that trickles bytes counts as timing out), and a body
    larger than ``max_response_bytes`` is refused rather than held in memory.
    """
    url = settings.base_url.rstrip("/") + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers=settings.request_headers(), method="GET")
    where = _describe(settings.base_url)
    deadline = time.monotonic() + settings.timeout
    try:
        with _OPENER.open(request, timeout=settings.timeout) as response:
            return _read_bounded(response, settings, deadline, where)
    except urllib.error.HTTPError as error:
        body = _safe_body(error)
        raise _http_error(error.code, body, where, service, error.headers) from None
    except urllib.error.URLError as error:
        raise _network_error(error.reason, where, settings.timeout) from None
    except TimeoutError:
        raise _network_error(TimeoutError(), where, settings.timeout) from None
    except (ConnectionError, OSError) as error:
        raise _network_error(error, where, settings.timeout) from None
    except http.client.HTTPException as error:
        raise LogSourceError(
            ErrorKind.MALFORMED,
            f"{where} did not answer in HTTP ({type(error).__name__}): is this {service}?",
        ) from None


def get_json(
    settings: HttpSettings, path: str, params: Mapping[str, str | int], service: str
) -> Any:
    body = get(settings, path, params, service)
    try:
        # Invalid UTF-8 inside a line must not cost the whole page: replace it.
        return json.loads(body.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        raise LogSourceError(
            ErrorKind.MALFORMED,
            f"{_describe(settings.base_url)}{path} answered with something that is not JSON "
            f"({_snippet(body)!r}): is this {service}?",
        ) from None


def malformed(settings: HttpSettings, path: str, what: str, service: str) -> LogSourceError:
    return LogSourceError(
        ErrorKind.MALFORMED,
        f"{_describe(settings.base_url)}{path} answered JSON of the wrong shape ({what}): "
        f"is this {service}?",
    )


def _read_bounded(response: Any, settings: HttpSettings, deadline: float, where: str) -> bytes:
    declared = response.headers.get("Content-Length")
    limit = settings.max_response_bytes
    if declared and declared.isdigit() and int(declared) > limit:
        raise _oversized(where, int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = response.read(READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise _oversized(where, size, limit)
        chunks.append(chunk)


def _oversized(where: str, size: int, limit: int) -> LogSourceError:
    return LogSourceError(
        ErrorKind.OVERSIZED,
        f"{where} sent more than {limit:,} bytes (at least {size:,}): lower the page size "
        "or narrow the query",
    )


def _safe_body(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read(64 * 1024) or b""
    except Exception:  # the body of an error is a courtesy; its absence is not a new error
        return b""


def _http_error(status: int, body: bytes, where: str, service: str, headers: Any) -> LogSourceError:
    said = _server_message(body)
    if status in (401, 403):
        verb = "refused the credentials" if status == 401 else "denied access"
        return LogSourceError(
            ErrorKind.AUTH,
            f"{where} {verb} (HTTP {status}): check the token, user/password or tenant"
            + (f" — server said: {said}" if said else ""),
            status=status,
        )
    if status == 400 or status == 422:
        return LogSourceError(
            ErrorKind.BAD_QUERY,
            f"{where} rejected the query (HTTP {status}): {said or 'no reason given'}",
            status=status,
        )
    if status == 404:
        return LogSourceError(
            ErrorKind.NOT_FOUND,
            f"{where} has no such path (HTTP 404): wrong URL or not a {service} server?",
            status=status,
        )
    if 300 <= status < 400:
        target = headers.get("Location", "") if headers is not None else ""
        return LogSourceError(
            ErrorKind.HTTP,
            f"{where} redirects (HTTP {status}) to {target[:200] or 'elsewhere'}: "
            "configure that URL directly",
            status=status,
        )
    if status >= 500:
        return LogSourceError(
            ErrorKind.SERVER,
            f"{where} failed on its side (HTTP {status})" + (f": {said}" if said else ""),
            status=status,
        )
    return LogSourceError(
        ErrorKind.HTTP,
        f"{where} answered HTTP {status}" + (f": {said}" if said else ""),
        status=status,
    )


def _network_error(reason: Any, where: str, timeout: float) -> LogSourceError:
    if isinstance(reason, TimeoutError):
        return LogSourceError(ErrorKind.TIMEOUT, f"{where} did not answer within {timeout:g}s")
    if isinstance(reason, ConnectionRefusedError):
        return LogSourceError(
            ErrorKind.UNREACHABLE, f"{where} refused the connection: nothing listens there"
        )
    if isinstance(reason, socket.gaierror):
        return LogSourceError(ErrorKind.UNREACHABLE, f"{where}: the host name does not resolve")
    text = str(getattr(reason, "strerror", None) or reason)[:200]
    return LogSourceError(ErrorKind.UNREACHABLE, f"{where} is unreachable: {text}")


def _server_message(body: bytes) -> str:
    """The server's own explanation, from a JSON error object or plain text, on one line."""
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
    return " ".join(text.split())[:MAX_SERVER_MESSAGE]


def _snippet(body: bytes) -> str:
    return body[:60].decode("utf-8", errors="replace")


def _describe(base_url: str) -> str:
    # Never echo credentials embedded in a URL.
    parsed = urllib.parse.urlsplit(base_url)
    host = parsed.hostname or ""
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path.rstrip('/')}"
