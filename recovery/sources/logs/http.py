"""Reading a log store over the shared HTTP client: where it is, how to sign in, what went wrong.

Every failure becomes one ``LogSourceError`` whose message is a one-line diagnosis an operator
can act on (the configurator shows it as is); ``kind`` lets code tell the cases apart.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recovery.sources.http import (
    ErrorKind,
    HttpError,
    Reply,
    Wording,
    authorization,
    describe_url,
    exchange,
    parse_json,
    server_message,
    with_query,
)

__all__ = ["ErrorKind", "HttpSettings", "LogSourceError", "get", "get_json", "malformed"]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
USER_AGENT = "workload-recovery-log-connector/1"


class LogSourceError(HttpError):
    """A log store could not be read; ``str()`` is a one-line diagnosis."""


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
        signed = authorization(
            bearer_token=self.bearer_token, username=self.username, password=self.password
        )
        if signed:
            headers["Authorization"] = signed
        return headers


def get(settings: HttpSettings, path: str, params: Mapping[str, str | int], service: str) -> bytes:
    """GET ``base_url + path`` and return the body of a 2xx, or raise ``LogSourceError``.

    ``service`` names the store in diagnoses ("Loki", "VictoriaLogs"). The whole exchange must
    end within ``timeout`` (a server that trickles bytes counts as timing out), and a body
    larger than ``max_response_bytes`` is refused rather than held in memory.
    """
    where = describe_url(settings.base_url)
    reply = exchange(
        "GET",
        with_query(settings.base_url.rstrip("/") + path, params),
        timeout=settings.timeout,
        max_response_bytes=settings.max_response_bytes,
        where=where,
        headers=settings.request_headers(),
        wording=Wording(
            not_http=f"is this {service}?", oversized="lower the page size or narrow the query"
        ),
        error=LogSourceError,
    )
    if not reply.ok:
        raise _http_error(reply, where, service)
    return reply.body


def get_json(
    settings: HttpSettings, path: str, params: Mapping[str, str | int], service: str
) -> Any:
    body = get(settings, path, params, service)
    try:
        # Invalid UTF-8 inside a line must not cost the whole page: replace it.
        return parse_json(body, replace_invalid_utf8=True)
    except ValueError:
        raise LogSourceError(
            ErrorKind.MALFORMED,
            f"{describe_url(settings.base_url)}{path} answered with something that is not JSON "
            f"({_snippet(body)!r}): is this {service}?",
        ) from None


def malformed(settings: HttpSettings, path: str, what: str, service: str) -> LogSourceError:
    return LogSourceError(
        ErrorKind.MALFORMED,
        f"{describe_url(settings.base_url)}{path} answered JSON of the wrong shape ({what}): "
        f"is this {service}?",
    )


def _http_error(reply: Reply, where: str, service: str) -> LogSourceError:
    status = reply.status
    said = server_message(reply.body)
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
        target = reply.headers.get("Location", "")
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


def _snippet(body: bytes) -> str:
    return body[:60].decode("utf-8", errors="replace")
