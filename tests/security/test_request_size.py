"""Every request body is capped before it is read (workload_recovery/body_limit.py): the API,
the sign-in forms, the admin and any other path, each with its limit.

The first tests call the middleware directly, with a stand-in application that reads its body
the way Django does. Then the project's own ASGI application is called in this process, with a
client that counts what the server side reads, and Django's test client goes through the
middleware inside Django. The last ones start the project's web server (uvicorn on the real ASGI
application, on the test database) and push a 500 MB body at it from a raw socket, measuring
when the answer arrives and how much the server's memory grows while the client keeps sending.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import json
import os
import secrets
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.core.handlers import asgi as django_asgi
from django.core.signals import request_started
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client as DjangoClient
from django.test import RequestFactory
from rest_framework.test import APIClient

from api.ingest.views import MAX_HEARTBEAT_BYTES
from recovery.loop.push import MAX_LOG_BYTES
from recovery.models import IngestToken, IngestTokenKind
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory
from workload_recovery.body_limit import (
    INVALID_LENGTH_MESSAGE,
    BodyLimit,
    BodyLimitMiddleware,
    BodyLimits,
    Message,
    Receive,
    Scope,
    Send,
)
from workload_recovery.stack import free_port, web_command

LIMIT = 1000
LOGIN_LIMIT = 300
ADMIN_LIMIT = 2000
DEFAULT_LIMIT = 500
LIMITS = BodyLimits(
    DEFAULT_LIMIT,
    {
        "/api/": LIMIT,
        "/admin/": ADMIN_LIMIT,
        "/admin/login/": LOGIN_LIMIT,
        "/accounts/login/": LOGIN_LIMIT,
    },
)
LOGS = "/api/v1/ingest/logs/"
BASE_DIR = Path(settings.BASE_DIR)


# ---------- the middleware, called directly ----------


@dataclass
class BodyReader:
    """An application that reads its whole body first, as Django's ASGI handler does, then
    answers 200 with the body's length; and answers again after a disconnect, which must never
    reach the client."""

    received: list[Message] = field(default_factory=list)
    called: bool = False
    scope: Scope | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.called = True
        self.scope = scope
        length = 0
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect":
                break
            length += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(length).encode()})


@dataclass
class Client:
    """The server's side of one request: body chunks to hand over, and what was sent back."""

    chunks: list[bytes]
    reads: int = 0
    sent: list[Message] = field(default_factory=list)

    async def receive(self) -> Message:
        self.reads += 1
        if not self.chunks:
            return {"type": "http.disconnect"}
        chunk = self.chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        assert len(starts) == 1, f"expected one response, got {self.sent}"
        status: int = starts[0]["status"]
        return status

    @property
    def headers(self) -> dict[bytes, bytes]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return dict(start["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def http_scope(path: str = LOGS, headers: list[tuple[bytes, bytes]] | None = None) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": headers or [],
    }


def length_header(value: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", value)]


def run(app: BodyReader, scope: Scope, client: Client) -> None:
    async_to_sync(BodyLimit(app, LIMITS))(scope, client.receive, client.send)


def assert_too_large(client: Client, limit: int = LIMIT) -> None:
    assert client.status == 413
    assert client.headers[b"content-type"] == b"application/json"
    assert client.headers[b"connection"] == b"close"
    body = json.loads(client.body)
    assert body["code"] == "too_large"
    assert body["error"] == body["detail"]
    assert f"at most {limit} bytes" in body["error"]
    assert int(client.headers[b"content-length"]) == len(client.body)


def assert_page_too_large(client: Client, limit: int) -> None:
    """Outside the API the same 413 is plain text, which a browser that posted a form shows."""
    assert client.status == 413
    assert client.headers[b"content-type"] == b"text/plain; charset=utf-8"
    assert client.headers[b"connection"] == b"close"
    assert client.body.decode() == (
        f"The request body is too large: this address accepts at most {limit} bytes per request.\n"
    )


def test_it_refuses_a_declared_length_over_the_limit_without_reading_the_body() -> None:
    app = BodyReader()
    client = Client([b"x" * 100] * 50)

    run(app, http_scope(headers=length_header(b"500000000")), client)

    assert_too_large(client)
    assert client.reads == 0, "the middleware read the body it refused"
    assert not app.called


@pytest.mark.parametrize(
    "value",
    [b"-1", b"+5", b"abc", b"1e3", b"0x10", b"", b"1_000", b"5, 6", "٣".encode()],
)
def test_it_answers_400_for_a_content_length_that_is_not_a_whole_number(value: bytes) -> None:
    app = BodyReader()
    client = Client([b"x" * 5])

    run(app, http_scope(headers=length_header(value)), client)

    assert client.status == 400
    assert client.headers[b"connection"] == b"close"
    body = json.loads(client.body)
    assert body["code"] == "invalid_content_length"
    assert body["error"] == body["detail"] == INVALID_LENGTH_MESSAGE
    assert client.reads == 0
    assert not app.called


def test_it_answers_400_for_two_different_content_lengths() -> None:
    app = BodyReader()
    client = Client([b"x" * 5])
    headers = [(b"content-length", b"5"), (b"content-length", b"900000")]

    run(app, http_scope(headers=headers), client)

    assert client.status == 400
    assert not app.called


def test_it_treats_a_thousand_digit_length_as_too_large() -> None:
    app = BodyReader()
    client = Client([b"x"])

    run(app, http_scope(headers=length_header(b"9" * 1000)), client)

    assert_too_large(client)
    assert not app.called


@pytest.mark.parametrize("value", [b"5", b"005", b"5, 5", b" 5 "])
def test_it_accepts_a_length_repeated_or_padded_with_zeros(value: bytes) -> None:
    app = BodyReader()
    client = Client([b"x" * 5])

    run(app, http_scope(headers=length_header(value)), client)

    assert client.status == 200
    assert client.body == b"5"


def test_it_cuts_off_a_chunked_body_past_the_limit_and_hides_the_apps_answer() -> None:
    """
    GIVEN a body without Content-Length, 400 bytes a message
    WHEN the application has read past the limit of 1000 bytes
    THEN the client gets the 413 once, the application sees a disconnect, nothing more is read,
    AND the application's own answer after the disconnect never reaches the client
    """
    app = BodyReader()
    client = Client([b"x" * 400] * 10)

    run(app, http_scope(headers=[(b"transfer-encoding", b"chunked")]), client)

    assert_too_large(client)
    assert len(client.sent) == 2
    assert [m["type"] for m in app.received] == ["http.request"] * 2 + ["http.disconnect"]
    assert client.reads == 3
    assert len(client.chunks) == 7


def test_it_counts_the_body_also_when_a_length_was_declared() -> None:
    # A server that does not hold the client to its Content-Length is held to the limit anyway.
    app = BodyReader()
    client = Client([b"x" * 600] * 3)

    run(app, http_scope(headers=length_header(b"10")), client)

    assert_too_large(client)
    assert app.received[-1] == {"type": "http.disconnect"}


@pytest.mark.parametrize(
    "headers",
    [length_header(str(LIMIT).encode()), [(b"transfer-encoding", b"chunked")], []],
    ids=["declared", "chunked", "none"],
)
def test_it_passes_a_body_up_to_the_limit_through_unchanged(
    headers: list[tuple[bytes, bytes]],
) -> None:
    app = BodyReader()
    chunks = [b"a" * 500, b"b" * 500]
    client = Client(list(chunks))

    run(app, http_scope(headers=headers), client)

    assert app.received == [
        {"type": "http.request", "body": chunks[0], "more_body": True},
        {"type": "http.request", "body": chunks[1], "more_body": False},
    ]
    assert client.sent == [
        {"type": "http.response.start", "status": 200, "headers": []},
        {"type": "http.response.body", "body": b"1000"},
    ]


PATH_LIMITS = [
    ("/accounts/login/", LOGIN_LIMIT),
    ("/admin/login/", LOGIN_LIMIT),
    ("/admin/recovery/policy/add/", ADMIN_LIMIT),
    ("/admin/", ADMIN_LIMIT),
    ("/metrics", DEFAULT_LIMIT),
    ("/apiary/", DEFAULT_LIMIT),
    ("/recommendations/7/approve/", DEFAULT_LIMIT),
    ("/", DEFAULT_LIMIT),
    ("/no/such/page/", DEFAULT_LIMIT),
]


@pytest.mark.parametrize(("path", "limit"), PATH_LIMITS)
def test_it_refuses_a_declared_length_over_the_paths_own_limit_outside_the_api(
    path: str, limit: int
) -> None:
    """
    GIVEN the sign-in forms, the admin and any other path, each with its limit
    WHEN a client declares one byte more than that limit
    THEN it gets a plain 413 naming the limit, and nothing of the body is read
    """
    app = BodyReader()
    client = Client([b"x" * 100] * 50)

    run(app, http_scope(path, headers=length_header(str(limit + 1).encode())), client)

    assert_page_too_large(client, limit)
    assert client.reads == 0, "the middleware read the body it refused"
    assert not app.called


@pytest.mark.parametrize(("path", "limit"), PATH_LIMITS)
def test_it_cuts_off_a_chunked_body_past_the_paths_own_limit(path: str, limit: int) -> None:
    app = BodyReader()
    client = Client([b"x" * 100] * 50)

    run(app, http_scope(path, headers=[(b"transfer-encoding", b"chunked")]), client)

    assert_page_too_large(client, limit)
    assert app.received[-1] == {"type": "http.disconnect"}
    assert client.reads == limit // 100 + 1


@pytest.mark.parametrize(("path", "limit"), PATH_LIMITS)
def test_it_passes_a_body_of_the_paths_own_limit(path: str, limit: int) -> None:
    app = BodyReader()
    client = Client([b"x" * limit])

    run(app, http_scope(path, headers=length_header(str(limit).encode())), client)

    assert client.status == 200
    assert client.body == str(limit).encode()


def test_the_longest_prefix_gives_the_limit_under_a_mounted_site() -> None:
    # Mounted under /recovery, the paths the URL configuration sees are what count.
    app = BodyReader()
    client = Client([b"x"])
    scope = {
        **http_scope("/recovery/admin/login/", headers=length_header(b"301")),
        "root_path": "/recovery",
    }

    run(app, scope, client)

    assert_page_too_large(client, LOGIN_LIMIT)


def test_an_invalid_length_outside_the_api_is_a_plain_400() -> None:
    app = BodyReader()
    client = Client([b"x"])

    run(app, http_scope("/accounts/login/", headers=length_header(b"-1")), client)

    assert client.status == 400
    assert client.headers[b"content-type"] == b"text/plain; charset=utf-8"
    assert client.body.decode() == INVALID_LENGTH_MESSAGE + "\n"
    assert not app.called


def test_it_leaves_websockets_alone() -> None:
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)

    client = Client([])
    scope: Scope = {"type": "websocket", "path": "/api/ws/", "headers": []}
    async_to_sync(BodyLimit(app, LIMITS))(scope, client.receive, client.send)

    assert seen == [scope]
    assert client.sent == []


def test_the_served_application_applies_the_setting() -> None:
    from workload_recovery.asgi import application

    http_app = application.application_mapping["http"]
    assert isinstance(http_app, BodyLimit)
    assert http_app.limits == BodyLimits.from_settings()
    assert http_app.limits.for_path(LOGS) == settings.API_MAX_BODY_BYTES
    assert http_app.limits.for_path("/admin/login/") == settings.LOGIN_MAX_BODY_BYTES
    assert http_app.limits.for_path("/accounts/login/") == settings.LOGIN_MAX_BODY_BYTES
    assert http_app.limits.for_path("/admin/recovery/policy/") == settings.ADMIN_MAX_BODY_BYTES
    assert http_app.limits.for_path("/approvals/") == settings.MAX_BODY_BYTES


def test_the_sign_in_and_admin_limits_are_below_the_apis() -> None:
    assert settings.LOGIN_MAX_BODY_BYTES < settings.MAX_BODY_BYTES
    assert settings.MAX_BODY_BYTES < settings.ADMIN_MAX_BODY_BYTES < settings.API_MAX_BODY_BYTES


def test_a_body_within_any_default_limit_stays_in_memory() -> None:
    # Django spools a body to a temporary file past FILE_UPLOAD_MAX_MEMORY_SIZE: with every limit
    # below it, no request writes to disk.
    limits = [settings.MAX_BODY_BYTES, *settings.BODY_LIMITS_BY_PREFIX.values()]
    assert max(limits) < settings.FILE_UPLOAD_MAX_MEMORY_SIZE


def test_django_runs_the_limit_first() -> None:
    assert settings.MIDDLEWARE[0] == f"{BodyLimitMiddleware.__module__}.BodyLimitMiddleware"


def test_the_default_limit_leaves_room_for_the_largest_batch_an_endpoint_takes() -> None:
    # Between an endpoint's own limit and this one, the endpoint answers with its own message.
    largest_batch = max(MAX_LOG_BYTES, MAX_HEARTBEAT_BYTES)
    assert largest_batch < settings.API_MAX_BODY_BYTES


def test_the_procfile_runs_the_same_web_server_as_the_stacks() -> None:
    # The limit answers early only behind a server that does not read bodies whole first.
    line = next(
        line
        for line in (BASE_DIR / "deploy" / "Procfile").read_text().splitlines()
        if line.startswith("web:")
    )
    command = line.removeprefix("web:").split()
    expected = web_command("0.0.0.0", 8000, "python")
    assert command[0] == "uvicorn"
    assert command[1:] == ["${PORT:-8000}" if part == "8000" else part for part in expected[3:]]


# ---------- the project's ASGI application, in this process ----------

MIB = 1024 * 1024
PEER_CHUNK = 64 * 1024


class RecordedSpool(tempfile.SpooledTemporaryFile[bytes]):
    """Django's ASGI handler spools a request body into one of these: each records what it was
    given and whether it went to disk."""

    made: list[RecordedSpool] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.written = 0
        RecordedSpool.made.append(self)

    def write(self, data: Any) -> int:
        self.written += len(data)
        return super().write(data)

    @property
    def on_disk(self) -> bool:
        return bool(self._rolled)  # type: ignore[attr-defined]


@pytest.fixture
def spools(monkeypatch: pytest.MonkeyPatch) -> list[RecordedSpool]:
    RecordedSpool.made = []
    # Django's ASGI handler names it through the module, as tempfile.SpooledTemporaryFile.
    assert django_asgi.tempfile is tempfile  # type: ignore[attr-defined]
    monkeypatch.setattr(tempfile, "SpooledTemporaryFile", RecordedSpool)
    return RecordedSpool.made


@pytest.fixture
def requests_started() -> Iterator[list[object]]:
    """Each request Django began to handle (its middleware and views run after this signal)."""
    started: list[object] = []

    def record(sender: object, **kwargs: Any) -> None:
        started.append(sender)

    request_started.connect(record)
    yield started
    request_started.disconnect(record)


@dataclass
class Peer:
    """The server's side of one connection to the real application: it hands over the client's
    body in chunks, ``total`` bytes in all, counting each read, then stays connected until the
    response is complete."""

    total: int
    reads: int = 0
    handed: int = 0
    sent: list[Message] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    async def receive(self) -> Message:
        if self.handed >= self.total:
            await self.finished.wait()
            return {"type": "http.disconnect"}
        self.reads += 1
        piece = b"x" * min(PEER_CHUNK, self.total - self.handed)
        self.handed += len(piece)
        return {"type": "http.request", "body": piece, "more_body": self.handed < self.total}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished.set()

    @property
    def status(self) -> int:
        [start] = [m for m in self.sent if m["type"] == "http.response.start"]
        status: int = start["status"]
        return status

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def call_application(path: str, headers: list[tuple[bytes, bytes]], peer: Peer) -> None:
    from workload_recovery.asgi import application as served

    application: Any = served
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("localhost", 80),
    }
    async_to_sync(application)(scope, peer.receive, peer.send)


FORM = (b"content-type", b"application/x-www-form-urlencoded")
APPLICATION_PATHS = [
    ("/accounts/login/", "LOGIN_MAX_BODY_BYTES"),
    ("/admin/login/", "LOGIN_MAX_BODY_BYTES"),
    ("/admin/auth/group/add/", "ADMIN_MAX_BODY_BYTES"),
    ("/no/such/page/", "MAX_BODY_BYTES"),
    ("/", "MAX_BODY_BYTES"),
    (LOGS, "API_MAX_BODY_BYTES"),
]


@pytest.mark.parametrize(("path", "setting"), APPLICATION_PATHS)
def test_the_application_refuses_a_declared_5_mib_before_reading_any_of_it(
    path: str, setting: str, spools: list[RecordedSpool], requests_started: list[object]
) -> None:
    """
    GIVEN the project's ASGI application with its default limits
    WHEN an anonymous client declares a 5 MiB form to a sign-in form, the admin, a page that
        does not exist or the API
    THEN it gets 413 naming that path's limit, the server side is never asked for the body,
        Django spools nothing and never begins the request
    """
    peer = Peer(total=5 * MIB)

    call_application(path, [FORM, (b"content-length", str(5 * MIB).encode())], peer)

    assert peer.status == 413
    assert str(getattr(settings, setting)).encode() in peer.body
    assert peer.reads == 0, f"the body was read: {peer.reads} chunks"
    assert spools == []
    assert requests_started == []


@pytest.mark.parametrize(("path", "setting"), APPLICATION_PATHS)
@pytest.mark.parametrize(
    "declared", [None, b"10"], ids=["chunked-without-length", "lying-content-length"]
)
def test_the_application_cuts_off_a_body_without_an_honest_length_at_the_limit(
    path: str,
    setting: str,
    declared: bytes | None,
    spools: list[RecordedSpool],
    requests_started: list[object],
) -> None:
    """
    GIVEN the project's ASGI application with its default limits
    WHEN a client sends 5 MiB without a Content-Length, or after declaring 10 bytes
    THEN the 413 comes once the body passes the path's limit, nothing further is read,
        Django holds at most the limit in memory, nothing on disk, and never begins the request
    """
    limit: int = getattr(settings, setting)
    headers = [FORM]
    headers.append(
        (b"transfer-encoding", b"chunked") if declared is None else (b"content-length", declared)
    )
    peer = Peer(total=5 * MIB)

    call_application(path, headers, peer)

    assert peer.status == 413
    assert str(limit).encode() in peer.body
    assert peer.reads == limit // PEER_CHUNK + 1
    assert peer.handed < 5 * MIB
    assert all(spool.written <= limit and not spool.on_disk for spool in spools)
    assert requests_started == []


@pytest.mark.django_db(transaction=True)
def test_the_application_lets_a_sign_in_within_its_limit_through(
    spools: list[RecordedSpool], requests_started: list[object]
) -> None:
    # The same instruments see Django read a body it is allowed: the tests above can fail.
    peer = Peer(total=200)

    call_application("/accounts/login/", [FORM, (b"content-length", b"200")], peer)

    assert peer.status == 403  # no CSRF cookie: Django's own answer, after reading the body
    assert peer.reads == 1
    assert [spool.written for spool in spools] == [200]
    assert len(requests_started) == 1


# ---------- Django's test client: the middleware inside Django ----------


def padded(fields: dict[str, str], size: int) -> dict[str, str]:
    return {**fields, "padding": "x" * size}


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_a_sign_in_over_its_limit_is_refused_and_signs_nobody_in(
    path: str, site_admin: User
) -> None:
    """
    GIVEN the sign-in forms of the Console and the admin, and a staff account
    WHEN its correct name and password come in a form padded past the sign-in limit
    THEN the answer is 413, nobody is signed in and no session is stored
    """
    client = DjangoClient()
    credentials = {"username": site_admin.username, "password": TEST_PASSWORD}

    response = client.post(path, padded(credentials, settings.LOGIN_MAX_BODY_BYTES))

    assert response.status_code == 413
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert f"at most {settings.LOGIN_MAX_BODY_BYTES} bytes" in response.content.decode()
    assert Session.objects.count() == 0
    site_admin.refresh_from_db()
    assert site_admin.last_login is None


@pytest.mark.django_db
def test_an_admin_form_over_its_limit_is_refused_and_stores_nothing(site_admin: User) -> None:
    User.objects.filter(pk=site_admin.pk).update(is_superuser=True)
    client = DjangoClient()
    client.force_login(site_admin)

    response = client.post(
        "/admin/auth/group/add/", padded({"name": "padded"}, settings.ADMIN_MAX_BODY_BYTES)
    )

    assert response.status_code == 413
    assert f"at most {settings.ADMIN_MAX_BODY_BYTES} bytes" in response.content.decode()
    assert not Group.objects.filter(name="padded").exists()
    # Within the limit, the same form is taken: it is the size that was refused.
    client.post("/admin/auth/group/add/", padded({"name": "padded"}, 1000))
    assert Group.objects.filter(name="padded").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/no/such/page/", "/approvals/", "/metrics"])
def test_any_other_path_over_the_default_limit_is_refused(path: str, operator: User) -> None:
    client = DjangoClient()
    client.force_login(operator)

    response = client.generic(
        "POST", path, b"x" * (settings.MAX_BODY_BYTES + 1), content_type="text/plain"
    )

    assert response.status_code == 413
    assert f"at most {settings.MAX_BODY_BYTES} bytes" in response.content.decode()


@pytest.mark.django_db
def test_the_api_over_its_limit_gets_the_apis_own_413() -> None:
    response = APIClient().generic(
        "POST", LOGS, " " * (settings.API_MAX_BODY_BYTES + 1), content_type="application/json"
    )

    assert response.status_code == 413
    assert response.json()["code"] == "too_large"
    assert f"the API accepts at most {settings.API_MAX_BODY_BYTES}" in response.json()["error"]


class CountingStream(io.BytesIO):
    reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        return super().read(size)


def test_the_django_middleware_refuses_without_reading_or_calling_the_view() -> None:
    stream = CountingStream(b"x" * 100)
    request = RequestFactory().post("/accounts/login/", content_type="text/plain", data=b"x" * 100)
    request.META["CONTENT_LENGTH"] = str(settings.LOGIN_MAX_BODY_BYTES + 1)
    request._stream = stream
    views: list[HttpRequest] = []

    def view(request: HttpRequest) -> HttpResponse:
        views.append(request)
        return HttpResponse("read")

    response = BodyLimitMiddleware(view)(request)

    assert response.status_code == 413
    assert (views, stream.reads) == ([], 0)


@pytest.mark.parametrize("value", [None, ""], ids=["absent", "empty"])
def test_the_django_middleware_lets_a_request_without_a_length_through(
    value: str | None,
) -> None:
    request = RequestFactory().get("/approvals/")
    request.META.pop("CONTENT_LENGTH", None)
    if value is not None:
        request.META["CONTENT_LENGTH"] = value

    response = BodyLimitMiddleware(lambda request: HttpResponse("ok"))(request)

    assert response.status_code == 200


# ---------- the real web server ----------

DECLARED = 500 * 1000 * 1000
CHUNK = 1024 * 1024
MAX_GROWTH = 50 * 1024 * 1024
ANSWER_WITHIN = 1.0


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor != "mysql":
        pytest.fail("The web server shares the test database: run on MariaDB (DATABASE_URL).")
    password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}"
    return f"mysql://{quote(db['USER'], safe='')}{password}@{host}/{db['NAME']}"


@dataclass
class WebServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def memory_kib(self, field_name: str) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith(f"{field_name}:"))
        return int(line.split()[1])

    def reset_peak_memory(self) -> None:
        # Linux: writing 5 sets the peak resident size (VmHWM) back to the current one.
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def answers(self) -> bool:
        request = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            request.request("GET", "/api/v1/health/")
            request.getresponse().read()
            return True
        except OSError:
            return False
        finally:
            request.close()

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def web_server(django_db_setup: None, tmp_path: Path) -> Iterator[WebServer]:
    """The project's web server (workload_recovery.stack.web_command) on the test database.

    A fresh one for each test: memory a previous request left allocated could otherwise be
    reused unseen, and the growth would look smaller than it is.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DEBUG", "DJANGO_ALLOW_ASYNC_UNSAFE"}
        and not key.startswith(("SECRET_KEY", "WR_", "PYTEST_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="workload_recovery.settings",
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        SECRET_KEY=secrets.token_urlsafe(50),
        WR_VAR_DIR=str(tmp_path / "var"),
    )
    port = free_port()
    log = tmp_path / "web.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            web_command("127.0.0.1", port, sys.executable),
            cwd=BASE_DIR, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = WebServer(process, port, log)
    try:
        deadline = time.monotonic() + 60
        while not server.answers():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the web server did not start:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Push:
    """What one 500 MB POST did: when the answer's status line came, what it was, how much the
    client got to send, and the server's peak memory growth meanwhile."""

    response: bytes = b""
    seconds_to_status: float | None = None
    sent: int = 0
    stopped_by: str = "the whole body was sent"
    peak_growth_kib: int = 0

    @property
    def status_line(self) -> str:
        return self.response.split(b"\r\n", 1)[0].decode(errors="replace")

    @property
    def status(self) -> int | None:
        parts = self.status_line.split()
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None

    @property
    def answered(self) -> bool:
        """The whole response is in: its head and as many bytes as its Content-Length says."""
        head, separator, body = self.response.partition(b"\r\n\r\n")
        if not separator:
            return False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                return len(body) >= int(value)
        return False

    @property
    def json(self) -> Any:
        return json.loads(self.text)

    @property
    def text(self) -> str:
        return self.response.partition(b"\r\n\r\n")[2].decode(errors="replace")

    def read(self, sock: socket.socket, started: float) -> bool:
        """Take what the server sent; False once it closed or reset the connection."""
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            self.stopped_by = "the server reset the connection"
            return False
        if not data:
            self.stopped_by = "the server closed the connection"
            return False
        self.response += data
        if self.seconds_to_status is None and b"\r\n" in self.response:
            self.seconds_to_status = time.monotonic() - started
        return True

    def describe(self) -> str:
        seconds = "never" if self.seconds_to_status is None else f"{self.seconds_to_status:.3f} s"
        return (
            f"status line {self.status_line!r} {seconds} after the request headers were sent; "
            f"the client sent {self.sent / 2**20:.1f} MiB of body before {self.stopped_by}; "
            f"the server's peak resident memory grew by {self.peak_growth_kib / 1024:.1f} MiB"
        )


def push_500_mb(server: WebServer, *, token: str | None, chunked: bool, path: str = LOGS) -> Push:
    """POST a body of 500 MB to ``path``, sending until the server stops taking it."""
    headers = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}"]
    headers.append("Content-Type: application/x-www-form-urlencoded")
    if token is not None:
        headers.append(f"Authorization: Bearer {token}")
    if chunked:
        headers.append("Transfer-Encoding: chunked")
        piece = f"{CHUNK:x}\r\n".encode() + b"x" * CHUNK + b"\r\n"
        total = DECLARED // CHUNK * len(piece)
        end = b"0\r\n\r\n"
    else:
        headers.append(f"Content-Length: {DECLARED}")
        piece = b"x" * CHUNK
        total = DECLARED
        end = b""
    push = Push()
    rss_before = server.memory_kib("VmRSS")
    server.reset_peak_memory()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        started = time.monotonic()
        sock.setblocking(False)
        view = memoryview(piece)
        # Sending goes on after an early answer, to see how much more the server takes.
        while not (push.sent == total and push.answered):
            if time.monotonic() - started > 120:
                push.stopped_by = "the client gave up after 120 s"
                break
            readable, writable, _ = select.select(
                [sock], [sock] if push.sent < total else [], [], 1.0
            )
            if readable and not push.read(sock, started):
                break
            if writable:
                offset = push.sent % len(piece)
                try:
                    push.sent += sock.send(view[offset : offset + total - push.sent])
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError) as error:
                    # The answer may have arrived after the last select: take what is queued.
                    sock.settimeout(2)
                    with contextlib.suppress(TimeoutError):
                        while not push.answered and push.read(sock, started):
                            pass
                    push.stopped_by = f"sending failed ({type(error).__name__})"
                    break
                if push.sent == total and end:
                    sock.setblocking(True)
                    sock.sendall(end)
                    sock.setblocking(False)
    push.peak_growth_kib = server.memory_kib("VmHWM") - rss_before
    return push


@pytest.fixture
def job_token() -> str:
    _, token = IngestToken.issue(
        ClusterFactory(name="size-lab"),
        IngestTokenKind.JOB,
        name="pusher",
        issued_by="test",
        user="alice",
    )
    return token


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
@pytest.mark.parametrize("authenticated", [False, True], ids=["anonymous", "token"])
def test_the_web_server_refuses_500_mb_at_once_without_reading_it(
    web_server: WebServer, job_token: str, authenticated: bool, chunked: bool
) -> None:
    """
    GIVEN the project's web server with the default limit of 2 MiB
    WHEN a client POSTs a 500 MB body to the log endpoint, anonymous or with a token
    THEN the 413 status line arrives within a second of the request headers,
    AND the server stops taking the body and its memory grows by less than 50 MB
    """
    token = job_token if authenticated else None
    push = push_500_mb(web_server, token=token, chunked=chunked)

    assert push.status == 413, f"{push.describe()}\n{web_server.log_tail()}"
    # A bound on "answered before the body was read", not a speed benchmark: reading 500 MB
    # first takes seconds.
    assert push.seconds_to_status is not None and push.seconds_to_status < ANSWER_WITHIN, (
        push.describe()
    )
    assert push.sent < DECLARED // 10, f"the server kept reading the body: {push.describe()}"
    assert push.peak_growth_kib * 1024 < MAX_GROWTH, push.describe()
    assert push.json["code"] == "too_large", push.describe()
    assert f"at most {settings.API_MAX_BODY_BYTES} bytes" in push.json["error"]


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
@pytest.mark.parametrize(
    ("path", "setting"),
    [
        ("/accounts/login/", "LOGIN_MAX_BODY_BYTES"),
        ("/admin/login/", "LOGIN_MAX_BODY_BYTES"),
        ("/no/such/page/", "MAX_BODY_BYTES"),
    ],
)
def test_the_web_server_refuses_500_mb_on_any_path_at_once_without_reading_it(
    web_server: WebServer, path: str, setting: str, chunked: bool
) -> None:
    """
    GIVEN the project's web server with its default limits
    WHEN an anonymous client POSTs a 500 MB form to a sign-in form or a page that does not exist
    THEN the 413 status line arrives within a second of the request headers, naming the path's
        limit, AND the server stops taking the body and its memory grows by less than 50 MB
    """
    push = push_500_mb(web_server, token=None, chunked=chunked, path=path)

    assert push.status == 413, f"{push.describe()}\n{web_server.log_tail()}"
    assert push.seconds_to_status is not None and push.seconds_to_status < ANSWER_WITHIN, (
        push.describe()
    )
    assert push.sent < DECLARED // 10, f"the server kept reading the body: {push.describe()}"
    assert push.peak_growth_kib * 1024 < MAX_GROWTH, push.describe()
    assert f"at most {getattr(settings, setting)} bytes" in push.text, push.describe()


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_the_web_server_still_takes_bodies_under_the_limit(
    web_server: WebServer, job_token: str
) -> None:
    def post(body: bytes) -> tuple[int, Any]:
        request = http.client.HTTPConnection("127.0.0.1", web_server.port, timeout=30)
        try:
            request.request(
                "POST",
                LOGS,
                body=body,
                headers={
                    "Authorization": f"Bearer {job_token}",
                    "Content-Type": "application/json",
                },
            )
            response = request.getresponse()
            return response.status, json.loads(response.read())
        finally:
            request.close()

    status, body = post(json.dumps({"job_id": "777", "lines": ["step 1"]}).encode())
    assert (status, body["code"]) == (404, "not_found"), body

    # Over the endpoint's own 1 MiB, under the server's 2 MiB: the endpoint answers.
    status, body = post(b" " * (MAX_LOG_BYTES + 1000))
    assert status == 413
    assert body["error"] == f"Too large: at most {MAX_LOG_BYTES} bytes per request."
