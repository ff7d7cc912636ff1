from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from recovery.health import service_statuses

HEALTH = inline_serializer(
    "Health",
    {
        "healthy": serializers.BooleanField(),
        "services": inline_serializer(
            "ServiceStatus",
            {
                "name": serializers.CharField(),
                "ok": serializers.BooleanField(),
                "detail": serializers.CharField(required=False),
            },
            many=True,
        ),
    },
)


@extend_schema(
    tags=["health"],
    responses={200: HEALTH, 503: HEALTH},
    examples=[
        OpenApiExample(
            "Healthy",
            value={
                "healthy": True,
                "services": [{"name": "database", "ok": True}, {"name": "redis", "ok": True}],
            },
            response_only=True,
        )
    ],
)
@api_view(["GET"])
@permission_classes([AllowAny])
def health(request: Request) -> Response:
    """Liveness for load balancers: 200 when the database and Redis answer, else 503.

    Anonymous callers learn only which service is down; error details need a login.
    """
    statuses = service_statuses()
    healthy = all(status.ok for status in statuses)
    services = [asdict(status) for status in statuses]
    if not request.user.is_authenticated:
        services = [{"name": s["name"], "ok": s["ok"]} for s in services]
    return Response({"healthy": healthy, "services": services}, status=200 if healthy else 503)
