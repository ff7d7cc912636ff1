"""Goodput figures of a workload or a cluster, for dashboards and reports.

Every figure is computed from the audit trail (``recovery.read.goodput``). Durations are in seconds;
a figure the trail cannot give yet (no scheduler action, no checkpoint after the restart) is
null. Distributions give the number of failures with a known value, their median and p95.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recovery.models import Cluster, Workload
from recovery.read.goodput import Distribution, Failure, cluster_goodput, workload_goodput


class _CanView(BasePermission):
    """Logged in with a Console role: the figures describe other people's jobs."""

    permission: str = ""
    message = "Needs a Console role (viewer, operator or admin)."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm(self.permission))


class CanViewWorkloads(_CanView):
    permission = "recovery.view_workload"


class CanViewClusters(_CanView):
    permission = "recovery.view_cluster"


def _distribution_field(name: str, help_text: str) -> serializers.Serializer[dict[str, Any]]:
    return inline_serializer(
        name,
        {
            "count": serializers.IntegerField(help_text="Failures with a known value."),
            "median": serializers.FloatField(allow_null=True),
            "p95": serializers.FloatField(allow_null=True),
        },
        help_text=help_text,
    )


def _distributions(prefix: str) -> dict[str, serializers.Serializer[dict[str, Any]]]:
    return {
        "detection_latency_seconds": _distribution_field(
            f"{prefix}DetectionLatency", "Evidence written → anomaly recorded."
        ),
        "action_latency_seconds": _distribution_field(
            f"{prefix}ActionLatency", "Anomaly recorded → scheduler action done."
        ),
        "time_to_productive_seconds": _distribution_field(
            f"{prefix}TimeToProductive", "Failure → first new checkpoint after the restart."
        ),
        "work_lost_seconds": _distribution_field(
            f"{prefix}WorkLost", "Time from the last checkpoint to the failure."
        ),
    }


WORKLOAD_GOODPUT = inline_serializer(
    "WorkloadGoodput",
    {
        "workload": inline_serializer(
            "GoodputWorkloadRef",
            {
                "id": serializers.IntegerField(),
                "cluster": serializers.CharField(),
                "job_id": serializers.CharField(),
                "name": serializers.CharField(),
                "state": serializers.CharField(),
            },
        ),
        "ettr": serializers.FloatField(
            allow_null=True, help_text="Productive time over wall time, 0..1; null if never ran."
        ),
        "wall_seconds": serializers.FloatField(),
        "unproductive_seconds": serializers.FloatField(),
        "failure_count": serializers.IntegerField(),
        **_distributions("Workload"),
        "failures": inline_serializer(
            "GoodputFailure",
            {
                "at": serializers.DateTimeField(help_text="When the failure happened."),
                "attempt": serializers.IntegerField(allow_null=True),
                "detected_at": serializers.DateTimeField(),
                "detection_latency_seconds": serializers.FloatField(),
                "action_latency_seconds": serializers.FloatField(allow_null=True),
                "time_to_productive_seconds": serializers.FloatField(allow_null=True),
                "work_lost_seconds": serializers.FloatField(allow_null=True),
            },
            many=True,
        ),
    },
)
CLUSTER_GOODPUT = inline_serializer(
    "ClusterGoodput",
    {
        "cluster": inline_serializer(
            "GoodputClusterRef", {"id": serializers.IntegerField(), "name": serializers.CharField()}
        ),
        "ettr": serializers.FloatField(allow_null=True),
        "workload_count": serializers.IntegerField(help_text="Workloads with audit events."),
        "failure_count": serializers.IntegerField(),
        "failed_count": serializers.IntegerField(help_text="Workloads that ended failed."),
        "given_up_count": serializers.IntegerField(
            help_text="Workloads recovery stopped: retries no longer paid off, or the policy said."
        ),
        **_distributions("Cluster"),
    },
)
ERROR = inline_serializer("GoodputError", {"detail": serializers.CharField()})


def _distribution(distribution: Distribution) -> dict[str, Any]:
    return {"count": distribution.count, "median": distribution.median, "p95": distribution.p95}


def _failure(failure: Failure) -> dict[str, Any]:
    return {
        "at": failure.at,
        "attempt": failure.attempt,
        "detected_at": failure.detected_at,
        "detection_latency_seconds": failure.detection_latency_s,
        "action_latency_seconds": failure.action_latency_s,
        "time_to_productive_seconds": failure.time_to_productive_s,
        "work_lost_seconds": failure.work_lost_s,
    }


@extend_schema(
    tags=["goodput"],
    responses={
        200: WORKLOAD_GOODPUT,
        403: OpenApiResponse(ERROR, description="Not logged in, or without a Console role."),
        404: OpenApiResponse(ERROR, description="No workload with this id."),
    },
    examples=[
        OpenApiExample(
            "Recovered once",
            value={
                "workload": {
                    "id": 41,
                    "cluster": "lab",
                    "job_id": "48213",
                    "name": "llama-70b-pretrain",
                    "state": "completed",
                },
                "ettr": 0.93,
                "wall_seconds": 1000.0,
                "unproductive_seconds": 70.0,
                "failure_count": 1,
                "detection_latency_seconds": {"count": 1, "median": 2.0, "p95": 2.0},
                "action_latency_seconds": {"count": 1, "median": 3.0, "p95": 3.0},
                "time_to_productive_seconds": {"count": 1, "median": 80.0, "p95": 80.0},
                "work_lost_seconds": {"count": 1, "median": 50.0, "p95": 50.0},
                "failures": [
                    {
                        "at": "2026-11-29T10:04:10Z",
                        "attempt": 1,
                        "detected_at": "2026-11-29T10:04:12Z",
                        "detection_latency_seconds": 2.0,
                        "action_latency_seconds": 3.0,
                        "time_to_productive_seconds": 80.0,
                        "work_lost_seconds": 50.0,
                    }
                ],
            },
            response_only=True,
            status_codes=["200"],
        )
    ],
)
@api_view(["GET"])
@permission_classes([CanViewWorkloads])
def workload(request: Request, workload_id: int) -> Response:
    """Goodput of one workload over all its attempts, with each failure's figures."""
    found = get_object_or_404(Workload.objects.select_related("cluster"), pk=workload_id)
    figure = workload_goodput(found)
    failures = figure.failures
    return Response(
        {
            "workload": {
                "id": found.pk,
                "cluster": found.cluster.name,
                "job_id": found.job_id,
                "name": found.name,
                "state": found.state,
            },
            "ettr": figure.ettr,
            "wall_seconds": figure.wall_s,
            "unproductive_seconds": figure.unproductive_s,
            "failure_count": len(failures),
            "detection_latency_seconds": _distribution(
                Distribution.of(f.detection_latency_s for f in failures)
            ),
            "action_latency_seconds": _distribution(
                Distribution.of(f.action_latency_s for f in failures)
            ),
            "time_to_productive_seconds": _distribution(
                Distribution.of(f.time_to_productive_s for f in failures)
            ),
            "work_lost_seconds": _distribution(Distribution.of(f.work_lost_s for f in failures)),
            "failures": [_failure(f) for f in failures],
        }
    )


@extend_schema(
    tags=["goodput"],
    responses={
        200: CLUSTER_GOODPUT,
        403: OpenApiResponse(ERROR, description="Not logged in, or without a Console role."),
        404: OpenApiResponse(ERROR, description="No cluster with this id."),
    },
    examples=[
        OpenApiExample(
            "Two workloads, one failure",
            value={
                "cluster": {"id": 3, "name": "lab"},
                "ettr": 0.965,
                "workload_count": 2,
                "failure_count": 1,
                "detection_latency_seconds": {"count": 1, "median": 2.0, "p95": 2.0},
                "action_latency_seconds": {"count": 1, "median": 3.0, "p95": 3.0},
                "time_to_productive_seconds": {"count": 1, "median": 80.0, "p95": 80.0},
                "work_lost_seconds": {"count": 1, "median": 50.0, "p95": 50.0},
            },
            response_only=True,
            status_codes=["200"],
        )
    ],
)
@api_view(["GET"])
@permission_classes([CanViewClusters])
def cluster(request: Request, cluster_id: int) -> Response:
    """Goodput over every workload of one cluster."""
    found = get_object_or_404(Cluster, pk=cluster_id)
    figure = cluster_goodput(found)
    return Response(
        {
            "cluster": {"id": found.pk, "name": found.name},
            "ettr": figure.ettr,
            "workload_count": figure.workloads,
            "failure_count": figure.detection_latency_s.count,
            "failed_count": figure.failed,
            "given_up_count": figure.given_up,
            "detection_latency_seconds": _distribution(figure.detection_latency_s),
            "action_latency_seconds": _distribution(figure.action_latency_s),
            "time_to_productive_seconds": _distribution(figure.time_to_productive_s),
            "work_lost_seconds": _distribution(figure.work_lost_s),
        }
    )
