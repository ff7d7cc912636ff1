from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from recovery.read.health import service_statuses
from recovery.sources.provider_status import attribution_status

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
        "attribution": inline_serializer(
            "AttributionStatus",
            {
                "provider": serializers.CharField(
                    required=False, allow_null=True, help_text="Host of the provider, or null."
                ),
                "degraded": serializers.BooleanField(
                    help_text="Built-in rules only: no provider, or its last call failed."
                ),
                "reason": serializers.CharField(required=False),
            },
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
                "attribution": {
                    "provider": "attribution.internal:8080",
                    "degraded": False,
                    "reason": "provider answered in 0.21 s",
                },
            },
            response_only=True,
        ),
        OpenApiExample(
            "Attribution on built-in rules only",
            value={
                "healthy": True,
                "services": [{"name": "database", "ok": True}, {"name": "redis", "ok": True}],
                "attribution": {
                    "provider": None,
                    "degraded": True,
                    "reason": "no provider configured",
                },
            },
            response_only=True,
        ),
    ],
)
@api_view(["GET"])
@permission_classes([AllowAny])
def health(request: Request) -> Response:
    """Liveness for load balancers: 200 when the database and Redis answer, else 503.

    Anonymous callers learn only which service is down; error details need a login. Attribution
    running degraded is reported but leaves the status at 200: recovery still works on its
    built-in rules.
    """
    statuses = service_statuses()
    healthy = all(status.ok for status in statuses)
    services = [asdict(status) for status in statuses]
    attribution = attribution_status()
    attribution_body: dict[str, object] = {
        "provider": attribution.provider,
        "degraded": attribution.degraded,
        "reason": attribution.reason,
    }
    if not request.user.is_authenticated:
        services = [{"name": s["name"], "ok": s["ok"]} for s in services]
        attribution_body = {"degraded": attribution.degraded}
    return Response(
        {"healthy": healthy, "services": services, "attribution": attribution_body},
        status=200 if healthy else 503,
    )
