"""The Advisor API: how a scheduler-side controller learns what to do and says what it did.

A controller's token belongs to one cluster; it sees and claims only that cluster's
recommendations. Anything of another cluster answers 404, as if it did not exist.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from rest_framework import serializers, status
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import ControllerPrincipal, ControllerTokenAuthentication, IsController
from recovery import recommendations
from recovery.choices import RecommendationStatus
from recovery.models import Recommendation
from recovery.models.recommendation import InvalidTransition


class RecommendationForController(serializers.ModelSerializer):
    job_id = serializers.CharField(source="workload.job_id")
    submit_time = serializers.DateTimeField(source="workload.submit_time")
    job_name = serializers.CharField(source="workload.name")
    partition = serializers.CharField(source="workload.partition")
    attempt = serializers.IntegerField(source="attempt.number", allow_null=True, default=None)

    class Meta:
        model = Recommendation
        fields = [
            "id",
            "idempotency_key",
            "job_id",
            "submit_time",
            "job_name",
            "partition",
            "attempt",
            "action",
            "excluded_nodes",
            "reason",
            "status",
            "lease_owner",
            "lease_expires_at",
            "expires_at",
            "created_at",
        ]


class ClaimRequest(serializers.Serializer):
    lease_seconds = serializers.IntegerField(min_value=10, max_value=3600, default=120)


class CommandRun(serializers.Serializer):
    argv = serializers.ListField(child=serializers.CharField(max_length=4096), max_length=64)
    returncode = serializers.IntegerField()
    output = serializers.CharField(max_length=8192, allow_blank=True, required=False, default="")


class ReportRequest(serializers.Serializer):
    outcome = serializers.ChoiceField(
        choices=[
            RecommendationStatus.EXECUTED,
            RecommendationStatus.SKIPPED,
            RecommendationStatus.FAILED,
        ]
    )
    state_before = serializers.DictField(required=False, default=dict)
    commands = CommandRun(many=True, required=False, default=list)
    converged = serializers.BooleanField(required=False, allow_null=True, default=None)
    detail = serializers.CharField(max_length=2000, allow_blank=True, required=False, default="")


def _principal(request: Request) -> ControllerPrincipal:
    principal = request.user
    assert isinstance(principal, ControllerPrincipal)
    return principal


def _own(request: Request, recommendation_id: int) -> Recommendation:
    return get_object_or_404(
        Recommendation, pk=recommendation_id, workload__cluster=_principal(request).cluster
    )


def _conflict(exc: Exception) -> Response:
    return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)


def _invalid(errors: Any) -> Response:
    return Response(
        {"error": "The request body is not valid.", "fields": errors},
        status=status.HTTP_400_BAD_REQUEST,
    )


@api_view(["GET"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def ready(request: Request) -> Response:
    """Recommendations this cluster's controller may claim now, oldest first."""
    claimable = recommendations.claimable_for(_principal(request).cluster)
    return Response({"results": RecommendationForController(claimable[:100], many=True).data})


@api_view(["POST"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def claim(request: Request, recommendation_id: int) -> Response:
    """Take one recommendation for a lease; only one controller can hold it."""
    _own(request, recommendation_id)
    body = ClaimRequest(data=request.data)
    if not body.is_valid():
        return _invalid(body.errors)
    try:
        claimed = recommendations.claim(
            recommendation_id,
            controller=_principal(request).actor,
            lease_seconds=body.validated_data["lease_seconds"],
        )
    except InvalidTransition as exc:
        return _conflict(exc)
    return Response(RecommendationForController(claimed).data)


@api_view(["POST"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def report(request: Request, recommendation_id: int) -> Response:
    """Say what happened: executed, skipped (the scheduler already showed it done) or failed."""
    _own(request, recommendation_id)
    body = ReportRequest(data=request.data)
    if not body.is_valid():
        return _invalid(body.errors)
    data = body.validated_data
    try:
        reported = recommendations.report(
            recommendation_id,
            controller=_principal(request).actor,
            result=recommendations.ActionReport(
                outcome=data["outcome"],
                state_before=data["state_before"],
                commands=[dict(command) for command in data["commands"]],
                converged=data["converged"],
                detail=data["detail"],
            ),
        )
    except InvalidTransition as exc:
        return _conflict(exc)
    return Response(RecommendationForController(reported).data)
