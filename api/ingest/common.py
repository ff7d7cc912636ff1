"""What every ingestion endpoint shares: the caller's token and cluster, and the error answers
with their OpenAPI descriptions.

The jobs' endpoints (``api.ingest.views``) and the scheduler hooks' (``api.ingest.hooks``) answer
a bad body, a body too large or a refused token alike; those answers are here, apart from either,
so that both import them without importing each other.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import IngestPrincipal
from recovery.models import Cluster

TAGS = ["ingest"]

ERROR = inline_serializer("IngestError", {"error": serializers.CharField()})
INVALID = inline_serializer(
    "IngestInvalid",
    {
        "error": serializers.CharField(),
        "code": serializers.CharField(),
        "detail": serializers.CharField(),
        "fields": serializers.JSONField(
            required=False, help_text="Why each field is not valid (not for unreadable JSON)."
        ),
    },
)
COMMON_RESPONSES: dict[int, Any] = {
    400: OpenApiResponse(
        INVALID, description="The body is not valid (`fields` says why) or not readable JSON."
    ),
    401: OpenApiResponse(description="No token, or an unknown, expired or revoked one."),
    403: OpenApiResponse(
        ERROR,
        description="A token of another kind (a controller token, a hook token for a job's "
        "evidence, a job token for a scheduler event), or a job token for a job it does not name.",
    ),
    413: OpenApiResponse(ERROR, description="More than one request may carry."),
    415: OpenApiResponse(ERROR, description="A body that is not JSON (logs: or plain text)."),
    429: OpenApiResponse(
        ERROR,
        description="This token's request budget is spent for now, or the request would pass "
        "a cap of the job token for its job (streams, heartbeats or log lines per minute): "
        "nothing of it is stored; send it again after Retry-After seconds.",
    ),
}
INVALID_EXAMPLE = OpenApiExample(
    "Invalid",
    value={"error": "The request body is not valid.", "fields": {"step": ["Must be >= 0."]}},
    response_only=True,
    status_codes=["400"],
)


def _principal(request: Request) -> IngestPrincipal:
    principal = request.user
    assert isinstance(principal, IngestPrincipal)
    return principal


def _cluster(request: Request) -> Cluster:
    return _principal(request).cluster


def _error(message: str, code: str, status_code: int, **extra: Any) -> Response:
    # The shape of every API error (api/errors.py): message, code, and DRF's usual "detail".
    return Response(
        {"error": message, "code": code, "detail": message, **extra}, status=status_code
    )


def _invalid(errors: Any) -> Response:
    return _error(
        "The request body is not valid.", "invalid", status.HTTP_400_BAD_REQUEST, fields=errors
    )


def _too_large(what: str) -> Response:
    return _error(f"Too large: {what}.", "too_large", status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)


def _declared_length(request: Request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0
