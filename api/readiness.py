"""A cluster's readiness for action mode, as JSON: the report the Console's readiness page shows.

``GET /api/v1/clusters/<name>/readiness/?days=N`` (N from 1 to 365, 30 by default). Read like the
resources under /api/v1/: a person's session or personal token (``Bearer wrp_…``), and the
cluster's view permission, which every Console role has. Durations are in seconds; a figure with
nothing to go on is null. The report itself is ``recovery.read.readiness``.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import exceptions, serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.errors import ERROR_SCHEMA
from api.tokens import PersonalTokenAuthentication
from recovery.models import Cluster
from recovery.read.goodput import Distribution
from recovery.read.readiness import (
    DEFAULT_DAYS,
    MAX_DAYS,
    MIN_DAYS,
    Agreement,
    DaysError,
    Half,
    Readiness,
    parse_days,
    readiness_over_days,
)
from recovery.read.readiness_checklist import CheckState


class CanViewClusters(BasePermission):
    """The Console's read access to clusters (viewer, operator, admin)."""

    message = "Needs a Console role (viewer, operator or admin) to read this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm("recovery.view_cluster"))


@extend_schema_field(
    {"type": "string", "pattern": "^(" + "|".join(state.value for state in CheckState) + ")$"}
)
class CheckStateField(serializers.CharField):
    """A checklist item's state. A pattern, not an enum: the schema's enums are named after
    their field, and "state" is the workloads' already."""


def _distribution(name: str, help_text: str) -> serializers.Serializer[dict[str, Any]]:
    return inline_serializer(
        name,
        {
            "count": serializers.IntegerField(help_text="Values known."),
            "median": serializers.FloatField(allow_null=True),
            "p95": serializers.FloatField(allow_null=True),
        },
        help_text=help_text,
    )


def _agreement(name: str) -> serializers.Serializer[dict[str, Any]]:
    return inline_serializer(
        name,
        {
            "key": serializers.CharField(),
            "label": serializers.CharField(),
            "approved": serializers.IntegerField(),
            "rejected": serializers.IntegerField(),
            "rate": serializers.FloatField(
                allow_null=True, help_text="approved / (approved + rejected); null if none."
            ),
        },
        many=True,
    )


READINESS = inline_serializer(
    "ClusterReadiness",
    {
        "cluster": inline_serializer(
            "ReadinessCluster",
            {
                "id": serializers.IntegerField(),
                "name": serializers.CharField(),
                "mode": serializers.CharField(),
                "acknowledge_scheduler_actions": serializers.BooleanField(),
                "drain_automatically": serializers.BooleanField(),
                "acts_automatically": serializers.BooleanField(),
                "action_scope": serializers.CharField(
                    help_text="The part of the cluster action mode reaches, in words."
                ),
                "has_canary": serializers.BooleanField(),
            },
        ),
        "since": serializers.DateTimeField(),
        "until": serializers.DateTimeField(),
        "days": serializers.IntegerField(),
        "counts": inline_serializer(
            "ReadinessCounts",
            {
                "recommended": serializers.IntegerField(
                    help_text="The policy's restarts, stops and drains (superseded left out)."
                ),
                "approved": serializers.IntegerField(),
                "rejected": serializers.IntegerField(),
                "expired": serializers.IntegerField(help_text="Expired before anyone decided."),
                "awaiting": serializers.IntegerField(),
                "ready_without_approval": serializers.IntegerField(
                    help_text="Made ready by the policy itself."
                ),
                "expired_unclaimed": serializers.IntegerField(
                    help_text="Approved or made ready, then expired before a controller acted."
                ),
            },
        ),
        "time_to_approval_seconds": _distribution(
            "ReadinessTimeToApproval", "Recommendation created → approved."
        ),
        "approval_cost": inline_serializer(
            "ReadinessApprovalCost",
            {
                "unit": serializers.CharField(help_text="node-hours"),
                "size_counted_as": serializers.CharField(),
                "total": serializers.FloatField(),
                "counted": serializers.IntegerField(),
                "size_unknown": serializers.IntegerField(),
            },
        ),
        "agreement_by_action": _agreement("ReadinessAgreementByAction"),
        "agreement_by_category": _agreement("ReadinessAgreementByCategory"),
        "halves": inline_serializer(
            "ReadinessHalf",
            {
                "half": serializers.ChoiceField(choices=[h.value for h in Half]),
                "label": serializers.CharField(),
                "recommended": serializers.IntegerField(),
                "approved": serializers.IntegerField(),
                "rejected": serializers.IntegerField(),
                "carried_out_without_approval": serializers.IntegerField(),
                "to_dispatch_seconds": _distribution(
                    "ReadinessToDispatch", "Recommendation created → a controller's first dispatch."
                ),
                "converged": serializers.IntegerField(),
                "abandoned": serializers.IntegerField(),
            },
            many=True,
            help_text="Empty when the cluster has no canary.",
        ),
        "policy": inline_serializer(
            "ReadinessPolicy",
            {
                "name": serializers.CharField(),
                "built_in": serializers.BooleanField(),
                "blast_radius_percent": serializers.IntegerField(),
                "blast_radius_window_minutes": serializers.IntegerField(),
                "drain_nodes": serializers.BooleanField(),
                "max_attempts": serializers.IntegerField(),
                "max_attempts_without_checkpoint": serializers.IntegerField(),
                "stop_on_application_fault": serializers.BooleanField(),
                "exclusion_hours": serializers.IntegerField(),
                "decision_timeout_seconds": serializers.IntegerField(),
                "recommendation_ttl_minutes": serializers.IntegerField(),
                "divergence_action": serializers.CharField(),
                "straggler_action": serializers.CharField(),
            },
        ),
        "checklist": inline_serializer(
            "ReadinessCheckItem",
            {
                "key": serializers.CharField(),
                "title": serializers.CharField(),
                "state": CheckStateField(help_text="ok, attention or unknown (check by hand)."),
                "detail": serializers.CharField(),
            },
            many=True,
        ),
    },
)

EXAMPLE = {
    "cluster": {
        "id": 3,
        "name": "lab",
        "mode": "monitor",
        "acknowledge_scheduler_actions": False,
        "drain_automatically": False,
        "acts_automatically": False,
        "action_scope": "partition canary",
        "has_canary": True,
    },
    "since": "2026-10-30T10:00:00Z",
    "until": "2026-11-29T10:00:00Z",
    "days": 30,
    "counts": {
        "recommended": 24,
        "approved": 18,
        "rejected": 3,
        "expired": 1,
        "awaiting": 2,
        "ready_without_approval": 0,
        "expired_unclaimed": 0,
    },
    "time_to_approval_seconds": {"count": 18, "median": 240.0, "p95": 1500.0},
    "approval_cost": {
        "unit": "node-hours",
        "size_counted_as": "Job size is the number of nodes of the attempt ...",
        "total": 41.5,
        "counted": 16,
        "size_unknown": 0,
    },
    "agreement_by_action": [
        {"key": "restart_excluding", "label": "Restart excluding nodes", "approved": 12,
         "rejected": 1, "rate": 0.923},
    ],
    "agreement_by_category": [
        {"key": "gpu_hardware", "label": "GPU hardware", "approved": 9, "rejected": 0,
         "rate": 1.0},
    ],
    "halves": [
        {"half": "canary", "label": "Canary (partition canary)", "recommended": 6,
         "approved": 5, "rejected": 1, "carried_out_without_approval": 0,
         "to_dispatch_seconds": {"count": 5, "median": 260.0, "p95": 900.0},
         "converged": 5, "abandoned": 0},
    ],
    "policy": {
        "name": "lab",
        "built_in": False,
        "blast_radius_percent": 10,
        "blast_radius_window_minutes": 60,
        "drain_nodes": True,
        "max_attempts": 10,
        "max_attempts_without_checkpoint": 3,
        "stop_on_application_fault": False,
        "exclusion_hours": 24,
        "decision_timeout_seconds": 300,
        "recommendation_ttl_minutes": 30,
        "divergence_action": "record",
        "straggler_action": "record",
    },
    "checklist": [
        {"key": "trial", "title": "A monitor-mode trial", "state": "ok",
         "detail": "21 decided (18 approved, 3 rejected) in the last 30 days; the trial needs "
         "at least 20."},
        {"key": "backups", "title": "Backups tested", "state": "unknown",
         "detail": "Check by hand: a dump restored into a scratch database, with its triggers "
         "present."},
    ],
}  # fmt: skip


@extend_schema(
    tags=["clusters"],
    summary="A cluster's readiness for action mode",
    parameters=[
        OpenApiParameter(
            "cluster_name",
            {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"},
            OpenApiParameter.PATH,
            description="The cluster's name.",
        ),
        OpenApiParameter(
            "days",
            {"type": "integer", "minimum": MIN_DAYS, "maximum": MAX_DAYS},
            OpenApiParameter.QUERY,
            description=f"Days of history up to now; {DEFAULT_DAYS} when absent.",
        ),
    ],
    responses={
        200: READINESS,
        400: OpenApiResponse(ERROR_SCHEMA, description="days is not a number from 1 to 365."),
        401: OpenApiResponse(
            ERROR_SCHEMA, description="No credentials, or a bad or revoked token."
        ),
        403: OpenApiResponse(ERROR_SCHEMA, description="Logged in, but without a Console role."),
        404: OpenApiResponse(ERROR_SCHEMA, description="No cluster with this name."),
        429: OpenApiResponse(ERROR_SCHEMA, description="Too many requests; see Retry-After."),
    },
    examples=[OpenApiExample("A trial under way", value=EXAMPLE, response_only=True)],
)
@api_view(["GET"])
# The token comes first, as on the resources: no credentials answer 401 with WWW-Authenticate.
@authentication_classes([PersonalTokenAuthentication, SessionAuthentication])
@permission_classes([CanViewClusters])
def cluster_readiness(request: Request, cluster_name: str) -> Response:
    """The policy's recommendations on the cluster over ``days`` days, how they were decided,
    and the checklist of docs/deploy.md section 11."""
    try:
        days = parse_days(request.query_params.get("days"))
    except DaysError as exc:
        raise exceptions.ValidationError({"days": [str(exc)]}) from exc
    cluster = get_object_or_404(Cluster, name=cluster_name)
    return Response(as_json(readiness_over_days(cluster, days), days))


def as_json(report: Readiness, days: int) -> dict[str, Any]:
    """The report in the shape of ``READINESS``."""
    counts = report.counts
    cost = report.approval_cost
    policy = report.policy
    return {
        "cluster": {
            "id": report.cluster_id,
            "name": report.cluster_name,
            "mode": report.mode,
            "acknowledge_scheduler_actions": report.acknowledge_scheduler_actions,
            "drain_automatically": report.drain_automatically,
            "acts_automatically": report.acts_automatically,
            "action_scope": report.action_scope,
            "has_canary": report.has_canary,
        },
        "since": report.since,
        "until": report.until,
        "days": days,
        "counts": {
            "recommended": counts.recommended,
            "approved": counts.approved,
            "rejected": counts.rejected,
            "expired": counts.expired,
            "awaiting": counts.awaiting,
            "ready_without_approval": counts.ready_without_approval,
            "expired_unclaimed": counts.expired_unclaimed,
        },
        "time_to_approval_seconds": _dist(report.time_to_approval),
        "approval_cost": {
            "unit": cost.unit,
            "size_counted_as": cost.size_counted_as,
            "total": cost.total,
            "counted": cost.counted,
            "size_unknown": cost.size_unknown,
        },
        "agreement_by_action": [_agreed(a) for a in report.agreement_by_action],
        "agreement_by_category": [_agreed(a) for a in report.agreement_by_category],
        "halves": [
            {
                "half": h.half.value,
                "label": h.label,
                "recommended": h.recommended,
                "approved": h.approved,
                "rejected": h.rejected,
                "carried_out_without_approval": h.carried_out_without_approval,
                "to_dispatch_seconds": _dist(h.to_dispatch),
                "converged": h.converged,
                "abandoned": h.abandoned,
            }
            for h in report.halves
        ],
        "policy": {
            "name": policy.name,
            "built_in": policy.built_in,
            "blast_radius_percent": policy.blast_radius_percent,
            "blast_radius_window_minutes": policy.blast_radius_window_minutes,
            "drain_nodes": policy.drain_nodes,
            "max_attempts": policy.max_attempts,
            "max_attempts_without_checkpoint": policy.max_attempts_without_checkpoint,
            "stop_on_application_fault": policy.stop_on_application_fault,
            "exclusion_hours": policy.exclusion_hours,
            "decision_timeout_seconds": policy.decision_timeout_seconds,
            "recommendation_ttl_minutes": policy.recommendation_ttl_minutes,
            "divergence_action": policy.divergence_action,
            "straggler_action": policy.straggler_action,
        },
        "checklist": [
            {"key": i.key, "title": i.title, "state": i.state.value, "detail": i.detail}
            for i in report.checklist
        ],
    }


def _dist(distribution: Distribution) -> dict[str, Any]:
    return {"count": distribution.count, "median": distribution.median, "p95": distribution.p95}


def _agreed(agreement: Agreement) -> dict[str, Any]:
    rate = agreement.rate
    return {
        "key": agreement.key,
        "label": agreement.label,
        "approved": agreement.approved,
        "rejected": agreement.rejected,
        "rate": None if rate is None else round(rate, 4),
    }
