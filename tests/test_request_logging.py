"""A refused request is logged once, as one line; a server error keeps its traceback."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from workload_recovery.log_filters import OneLineClientErrors


@pytest.fixture
def console_log() -> Iterator[io.StringIO]:
    """What the configured console handler writes, whatever stream it had."""
    (handler,) = [
        h
        for h in logging.getLogger().handlers
        if any(isinstance(f, OneLineClientErrors) for f in h.filters)
    ]
    assert isinstance(handler, logging.StreamHandler)
    captured = io.StringIO()
    previous = handler.setStream(captured)
    try:
        yield captured
    finally:
        handler.setStream(previous)


@pytest.mark.django_db
def test_a_refused_page_is_one_line_in_the_log(outsider: User, console_log: io.StringIO) -> None:
    client = Client()
    client.force_login(outsider)
    assert client.get(reverse("console:fleet")).status_code == 403
    lines = console_log.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "Forbidden (Permission denied): /" in lines[0]
    assert "Traceback" not in console_log.getvalue()


def test_django_records_reach_only_the_root_handler() -> None:
    assert logging.getLogger("django").handlers == []
    assert logging.getLogger("django").propagate


def test_a_server_error_keeps_its_traceback() -> None:
    try:
        raise RuntimeError("the database went away")
    except RuntimeError as exc:
        record = logging.LogRecord(
            "django.request",
            logging.ERROR,
            __file__,
            1,
            "Internal Server Error: /",
            (),
            (type(exc), exc, exc.__traceback__),
        )
    record.status_code = 500
    assert OneLineClientErrors().filter(record)
    assert record.exc_info is not None
    record.status_code = 403
    assert OneLineClientErrors().filter(record)
    assert record.exc_info is None
