"""Every API error as the same JSON, and never a stack trace.

The shape extends what the Advisor API already answers (``{"error": "<message>"}``, plus
``"fields"`` for an invalid body)::

    {"error": "<one clear sentence>", "code": "<machine-readable>", "detail": "<same sentence>",
     "fields": {...},  # 400 only: what was wrong with each field or query parameter
     "retry_after": 12}  # 429 only, also sent as the Retry-After header

A database that cannot answer is a 503 (``code``: ``unavailable``) with a Retry-After header.

``detail`` repeats the message for clients written against DRF's default ``{"detail": …}``.
``exception_handler`` is DRF's EXCEPTION_HANDLER; ``not_found`` and ``server_error`` are
Django's handler404 and handler500, which answer JSON under /api/ and the usual pages elsewhere.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from drf_spectacular.utils import inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
SERVER_ERROR_MESSAGE = (
    "Something went wrong on our side; the error is logged. Try again, and tell the operators "
    "if it persists."
)

# For the OpenAPI schema: the body of every error response.
ERROR_SCHEMA = inline_serializer(
    "ApiError",
    {
        "error": serializers.CharField(help_text="What went wrong, in one sentence."),
        "code": serializers.CharField(help_text="Machine-readable, e.g. not_found, throttled."),
        "detail": serializers.CharField(help_text="The same message (DRF's usual key)."),
        "fields": serializers.DictField(
            required=False, help_text="400 only: the problems of each field or parameter."
        ),
        "retry_after": serializers.IntegerField(
            required=False, help_text="429 only: seconds to wait (also the Retry-After header)."
        ),
    },
)

INVALID_MESSAGE = "The request is not valid; the fields say why."
DATABASE_UNAVAILABLE_MESSAGE = (
    "The database cannot answer right now; nothing was changed. Try again in a few seconds."
)
DATABASE_RETRY_AFTER_SECONDS = 5


def error_body(message: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"error": message, "code": code, "detail": message, **extra}


def _first_code(codes: Any) -> str:
    if isinstance(codes, str):
        return codes
    if isinstance(codes, list) and codes:
        return _first_code(codes[0])
    if isinstance(codes, dict) and codes:
        return _first_code(next(iter(codes.values())))
    return "error"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's handler (status, headers such as Retry-After and WWW-Authenticate), reshaped; an
    unexpected exception is logged and answered with a generic 500. A database that cannot
    answer now (down, restarting, a lock wait or deadlock it gave up on) is a 503 with
    Retry-After: callers such as the Advisor Controller try again, and nothing was changed."""
    if isinstance(exc, DatabaseOperationalError | DatabaseInterfaceError):
        logger.warning("database unavailable for an API request: %s", exc)
        set_rollback()
        return Response(
            error_body(DATABASE_UNAVAILABLE_MESSAGE, "unavailable"),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        view = context.get("view")
        logger.exception("Unexpected error in API view %s", type(view).__name__ if view else "?")
        set_rollback()
        return Response(
            error_body(SERVER_ERROR_MESSAGE, "server_error"),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    assert isinstance(exc, exceptions.APIException)
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail
        if isinstance(detail, dict):
            fields = detail
            message = INVALID_MESSAGE
        else:
            fields = {"non_field_errors": detail}
            message = " ".join(str(item) for item in detail) if detail else "Invalid request."
        response.data = error_body(message, _first_code(exc.get_codes()), fields=fields)
        return response
    message = str(exc.detail)
    extra: dict[str, Any] = {}
    if isinstance(exc, exceptions.Throttled):
        # DRF sets Throttled.wait (seconds, or None); djangorestframework-stubs leave it out.
        wait: float | None = getattr(exc, "wait", None)
        if wait is not None:
            extra["retry_after"] = int(response.headers.get("Retry-After", round(wait)))
    codes = exc.get_codes()
    code = codes if isinstance(codes, str) else exc.default_code
    response.data = error_body(message, str(code), **extra)
    return response


def is_api_path(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's 404 (no URL matched, or Http404 outside DRF): JSON under /api/."""
    if is_api_path(request):
        return JsonResponse(
            error_body(f"There is nothing at {request.path}.", "not_found"),
            status=status.HTTP_404_NOT_FOUND,
        )
    return defaults.page_not_found(request, exception or Http404())


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500 (an error outside DRF's handler): JSON under /api/, never a trace."""
    if is_api_path(request):
        return JsonResponse(
            error_body(SERVER_ERROR_MESSAGE, "server_error"),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    return defaults.server_error(request)
