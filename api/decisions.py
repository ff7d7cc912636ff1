"""Operators' decisions over the API: approve or reject a recommendation awaiting approval.

The same rules as the Console's buttons: only the operator and admin roles may decide, a
repeated call changes nothing, and every change lands in the audit trail with the caller's name.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recovery.loop import recommendations
from recovery.models import Recommendation
from recovery.roles import actor_name, can_decide


class CanDecide(BasePermission):
    message = "Only operators and admins may approve or reject recommendations."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return can_decide(request.user)


class DecisionRequest(serializers.Serializer[None]):
    note = serializers.CharField(max_length=2000, allow_blank=True, required=False, default="")


DECISION_RESPONSE = inline_serializer(
    "DecisionResult",
    {
        "id": serializers.IntegerField(),
        "status": serializers.CharField(),
        "changed": serializers.BooleanField(help_text="False when it was already decided."),
        "message": serializers.CharField(),
        "decided_by": serializers.CharField(),
    },
)


def _decide(request: Request, recommendation_id: int, approve: bool) -> Response:
    body = DecisionRequest(data=request.data)
    body.is_valid(raise_exception=True)
    get_object_or_404(Recommendation, pk=recommendation_id)
    decide = recommendations.approve if approve else recommendations.reject
    decision = decide(
        recommendation_id, operator=actor_name(request.user), note=body.validated_data["note"]
    )
    recommendation = decision.recommendation
    return Response(
        {
            "id": recommendation.pk,
            "status": recommendation.status,
            "changed": decision.changed,
            "message": decision.message,
            "decided_by": recommendation.decided_by,
        }
    )


_EXAMPLE = OpenApiExample(
    "approved",
    value={
        "id": 812,
        "status": "ready",
        "changed": True,
        "message": "Approved.",
        "decided_by": "olivia",
    },
    response_only=True,
)
_RESPONSES = {
    200: DECISION_RESPONSE,
    400: OpenApiResponse(description="The note is too long or not text."),
    403: OpenApiResponse(description="Not logged in, or not an operator or admin."),
    404: OpenApiResponse(description="No such recommendation."),
}


@extend_schema(
    tags=["recommendations"],
    summary="Approve a recommendation awaiting approval (monitor mode)",
    request=DecisionRequest,
    responses=_RESPONSES,
    examples=[
        OpenApiExample(
            "with a note", value={"note": "node drained by hand too"}, request_only=True
        ),
        _EXAMPLE,
    ],
)
@api_view(["POST"])
@permission_classes([CanDecide])
def approve(request: Request, recommendation_id: int) -> Response:
    return _decide(request, recommendation_id, approve=True)


@extend_schema(
    tags=["recommendations"],
    summary="Reject a recommendation awaiting approval",
    request=DecisionRequest,
    responses=_RESPONSES,
    examples=[OpenApiExample("with a reason", value={"note": "known flaky test job"})],
)
@api_view(["POST"])
@permission_classes([CanDecide])
def reject(request: Request, recommendation_id: int) -> Response:
    return _decide(request, recommendation_id, approve=False)
