from __future__ import annotations

from dataclasses import asdict

from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from recovery.health import service_statuses


@api_view(["GET"])
@permission_classes([AllowAny])
def health(request: Request) -> Response:
    """Liveness for load balancers: 200 when the database and Redis answer, else 503."""
    statuses = service_statuses()
    healthy = all(status.ok for status in statuses)
    return Response(
        {"healthy": healthy, "services": [asdict(status) for status in statuses]},
        status=200 if healthy else 503,
    )
