"""Logging filters shared by every role."""

from __future__ import annotations

import logging

CLIENT_ERROR_LOGGERS = ("django.request", "django.security")


class OneLineClientErrors(logging.Filter):
    """A refused or malformed request (4xx) is one line, not a traceback.

    Django logs a 403 or 400 with the exception that produced it; the traceback says nothing an
    operator needs (the request was refused on purpose) and buries real errors. Server errors
    keep theirs.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(CLIENT_ERROR_LOGGERS) and _client_error(record):
            record.exc_info = None
            record.exc_text = None
        return True


def _client_error(record: logging.LogRecord) -> bool:
    status = getattr(record, "status_code", None)
    if isinstance(status, int):
        return 400 <= status < 500
    # django.security.* loggers report SuspiciousOperation, which Django answers with a 400.
    return record.name.startswith("django.security")
