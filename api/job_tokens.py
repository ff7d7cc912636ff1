"""Job tokens over the API: an operator issues one for a job or a user, and can revoke it.

A job token (``wrj_…``) lets a job push its own heartbeats and log batches and nothing else (see
``recovery.models.ingest_token``). One for a job id names the job's submit time too, so it does
not cover the later job Slurm gives the same id. The key is in the answer to the request that
issues it and nowhere else. Only the operator and admin roles may issue and revoke.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recovery.models import Cluster, IngestToken, IngestTokenKind, Workload
from recovery.models.ingest_token import validate_scope
from recovery.roles import actor_name, can_decide

TAGS = ["job tokens"]


class CanIssueJobTokens(BasePermission):
    message = "Only operators and admins may issue or revoke job tokens."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return can_decide(request.user)


class JobTokenRequest(serializers.Serializer[dict[str, Any]]):
    workload = serializers.IntegerField(
        required=False, help_text="For this workload's job (its job id and submit time)."
    )
    job_id = serializers.CharField(max_length=64, required=False, help_text="For this job only.")
    submit_time = serializers.DateTimeField(
        required=False,
        help_text="Required with job_id: that job's submit time, so a later job reusing the id "
        "is not covered.",
    )
    user = serializers.CharField(
        max_length=64, required=False, help_text="For this scheduler user's jobs."
    )
    ttl_hours = serializers.IntegerField(
        min_value=1,
        max_value=settings.JOB_TOKEN_MAX_TTL_HOURS,
        required=False,
        help_text=f"Hours until it expires (default {settings.JOB_TOKEN_TTL_HOURS}).",
    )
    name = serializers.CharField(max_length=100, required=False, help_text="What it is for.")


TOKEN_FIELDS: dict[str, serializers.Field[Any, Any, Any, Any]] = {
    "id": serializers.IntegerField(),
    "cluster": serializers.CharField(),
    "kind": serializers.CharField(),
    "name": serializers.CharField(),
    "scope": serializers.CharField(help_text="What it may push for."),
    "expires_at": serializers.DateTimeField(allow_null=True),
    "revoked_at": serializers.DateTimeField(allow_null=True),
}
ISSUED = inline_serializer(
    "JobTokenIssued",
    {**TOKEN_FIELDS, "key": serializers.CharField(help_text="Shown once: store it now.")},
)
REVOKED = inline_serializer("JobTokenRevoked", TOKEN_FIELDS)


def _described(token: IngestToken) -> dict[str, Any]:
    return {
        "id": token.pk,
        "cluster": token.cluster.name,
        "kind": token.kind,
        "name": token.name,
        "scope": token.scope,
        "expires_at": token.expires_at,
        "revoked_at": token.revoked_at,
    }


@extend_schema(
    tags=TAGS,
    summary="Issue a job token for one job or one user's jobs on this cluster",
    request=JobTokenRequest,
    responses={
        201: ISSUED,
        400: OpenApiResponse(
            description="Not exactly one of workload, job_id or user, or a job_id without its "
            "submit_time."
        ),
        403: OpenApiResponse(description="Not logged in as an operator or admin."),
        404: OpenApiResponse(description="No such cluster or workload."),
    },
    examples=[
        OpenApiExample("For a workload", value={"workload": 812}, request_only=True),
        OpenApiExample(
            "For a job id",
            value={"job_id": "48213", "submit_time": "2026-11-29T01:12:09Z"},
            request_only=True,
        ),
        OpenApiExample(
            "For a user, one day", value={"user": "alice", "ttl_hours": 24}, request_only=True
        ),
        OpenApiExample(
            "Issued",
            value={
                "id": 31,
                "cluster": "a100-prod",
                "kind": "job",
                "name": "job-48213",
                "scope": "job 48213",
                "expires_at": "2026-12-04T09:00:00Z",
                "revoked_at": None,
                "key": "wrj_…",
            },
            response_only=True,
            status_codes=["201"],
        ),
    ],
)
@api_view(["POST"])
@permission_classes([CanIssueJobTokens])
def issue(request: Request, cluster_id: int) -> Response:
    cluster = get_object_or_404(Cluster, pk=cluster_id)
    body = JobTokenRequest(data=request.data)
    body.is_valid(raise_exception=True)
    valid = body.validated_data
    job_id: str = valid.get("job_id", "")
    submit_time = valid.get("submit_time")
    if "workload" in valid:
        if job_id or submit_time:
            raise serializers.ValidationError({"workload": ["Give a workload or a job id."]})
        workload = get_object_or_404(Workload, pk=valid["workload"], cluster=cluster)
        job_id, submit_time = workload.job_id, workload.submit_time
    user: str = valid.get("user", "")
    problem = validate_scope(IngestTokenKind.JOB, job_id, submit_time, user)
    if problem:
        raise serializers.ValidationError({"non_field_errors": [problem]})
    ttl_hours = valid.get("ttl_hours", settings.JOB_TOKEN_TTL_HOURS)
    token, key = IngestToken.issue(
        cluster,
        IngestTokenKind.JOB,
        name=valid.get("name") or (f"job-{job_id}" if job_id else f"user-{user}"),
        issued_by=actor_name(request.user),
        job_id=job_id,
        job_submit_time=submit_time,
        user=user,
        expires_at=timezone.now() + timedelta(hours=ttl_hours),
    )
    return Response({**_described(token), "key": key}, status=status.HTTP_201_CREATED)


@extend_schema(
    tags=TAGS,
    summary="Revoke a job token (at once; a repeat changes nothing)",
    request=None,
    responses={
        200: REVOKED,
        403: OpenApiResponse(description="Not logged in as an operator or admin."),
        404: OpenApiResponse(description="No such job token."),
    },
)
@api_view(["POST"])
@permission_classes([CanIssueJobTokens])
def revoke(request: Request, token_id: int) -> Response:
    token = get_object_or_404(
        IngestToken.objects.select_related("cluster"), pk=token_id, kind=IngestTokenKind.JOB
    )
    IngestToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    token.refresh_from_db()
    return Response(_described(token))
