"""Query parameters of each list, validated: a malformed value is a 400 that names it.

Each filter is a serializer (so the OpenAPI schema lists the parameters) and a function that
applies the validated values to a queryset. Clusters are named by name everywhere, as in the
Console; workloads, anomalies and attempts by id. An unknown name or id simply matches nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone
from rest_framework import serializers

from recovery.audit.trail import AuditFilters, WorkloadRef
from recovery.choices import (
    AnomalyKind,
    Attribution,
    AuditKind,
    ClusterMode,
    Confirmation,
    FailureCategory,
    NodeHealth,
    RecommendationStatus,
    WorkloadState,
)
from recovery.models import Anomaly, Attempt, Cluster, Node, Recommendation, Verdict, Workload

_ID = {"min_value": 1, "max_value": 2**63 - 1}


def _cluster() -> serializers.CharField:
    return serializers.CharField(required=False, max_length=63, help_text="Cluster name.")


def _workload() -> serializers.IntegerField:
    return serializers.IntegerField(required=False, help_text="Workload id.", **_ID)


def _flag(help_text: str) -> serializers.BooleanField:
    return serializers.BooleanField(required=False, allow_null=True, help_text=help_text)


class TimeRange(serializers.Serializer):
    since = serializers.DateTimeField(
        required=False,
        default_timezone=UTC,
        help_text="ISO 8601, inclusive; without an offset it is read as UTC.",
    )
    until = serializers.DateTimeField(
        required=False, default_timezone=UTC, help_text="ISO 8601, inclusive."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and until < since:
            raise serializers.ValidationError({"until": ["Is before since."]}, code="invalid_range")
        return attrs


def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value not in (None, "")}


class ClusterFilter(serializers.Serializer):
    name = serializers.CharField(required=False, max_length=63)
    mode = serializers.ChoiceField(required=False, choices=ClusterMode.choices)


def filter_clusters(clusters: QuerySet[Cluster], values: dict[str, Any]) -> QuerySet[Cluster]:
    return clusters.filter(**_present(values))


class NodeFilter(serializers.Serializer):
    cluster = _cluster()
    health = serializers.ChoiceField(required=False, choices=NodeHealth.choices)
    suspect = _flag("Only nodes flagged as suspect (true) or not (false).")
    excluded = _flag("Only nodes recovery currently keeps restarts off (true) or not (false).")


def filter_nodes(nodes: QuerySet[Node], values: dict[str, Any]) -> QuerySet[Node]:
    values = _present(values)
    if "cluster" in values:
        nodes = nodes.filter(cluster__name=values["cluster"])
    if "health" in values:
        nodes = nodes.filter(health=values["health"])
    if "suspect" in values:
        nodes = nodes.filter(suspect_since__isnull=not values["suspect"])
    if "excluded" in values:
        excluded = Q(excluded_until__gt=timezone.now())
        nodes = nodes.filter(excluded if values["excluded"] else ~excluded)
    return nodes


class WorkloadFilter(serializers.Serializer):
    cluster = _cluster()
    state = serializers.ChoiceField(required=False, choices=WorkloadState.choices)
    user = serializers.CharField(required=False, max_length=64)
    job_id = serializers.CharField(required=False, max_length=64)


def filter_workloads(workloads: QuerySet[Workload], values: dict[str, Any]) -> QuerySet[Workload]:
    values = _present(values)
    if "cluster" in values:
        workloads = workloads.filter(cluster__name=values.pop("cluster"))
    return workloads.filter(**values)


class AttemptFilter(serializers.Serializer):
    workload = _workload()


def filter_attempts(attempts: QuerySet[Attempt], values: dict[str, Any]) -> QuerySet[Attempt]:
    return attempts.filter(**_present(values))


class AnomalyFilter(TimeRange):
    cluster = _cluster()
    workload = _workload()
    category = serializers.ChoiceField(required=False, choices=FailureCategory.choices)
    kind = serializers.ChoiceField(required=False, choices=AnomalyKind.choices)
    attribution = serializers.ChoiceField(required=False, choices=Attribution.choices)
    confirmation = serializers.ChoiceField(
        required=False,
        choices=Confirmation.choices,
        help_text="Crashes in this state; anomalies that need no confirmation have none.",
    )


def filter_anomalies(anomalies: QuerySet[Anomaly], values: dict[str, Any]) -> QuerySet[Anomaly]:
    values = _present(values)
    if "cluster" in values:
        anomalies = anomalies.filter(workload__cluster__name=values.pop("cluster"))
    if "since" in values:
        anomalies = anomalies.filter(detected_at__gte=values.pop("since"))
    if "until" in values:
        anomalies = anomalies.filter(detected_at__lte=values.pop("until"))
    return anomalies.filter(**values)


class VerdictFilter(serializers.Serializer):
    anomaly = serializers.IntegerField(required=False, help_text="Anomaly id.", **_ID)
    attribution = serializers.ChoiceField(required=False, choices=Attribution.choices)
    provider = serializers.CharField(required=False, max_length=64)


def filter_verdicts(verdicts: QuerySet[Verdict], values: dict[str, Any]) -> QuerySet[Verdict]:
    return verdicts.filter(**_present(values))


class RecommendationFilter(serializers.Serializer):
    status = serializers.ChoiceField(required=False, choices=RecommendationStatus.choices)
    cluster = _cluster()
    workload = _workload()


def filter_recommendations(
    recommendations: QuerySet[Recommendation], values: dict[str, Any]
) -> QuerySet[Recommendation]:
    values = _present(values)
    if "cluster" in values:
        recommendations = recommendations.filter(workload__cluster__name=values.pop("cluster"))
    return recommendations.filter(**values)


class AuditEventFilter(TimeRange):
    cluster = _cluster()
    workload = _workload()
    kind = serializers.MultipleChoiceField(
        required=False,
        choices=AuditKind.choices,
        help_text="Repeat the parameter for several kinds.",
    )
    actor = serializers.CharField(
        required=False, max_length=150, help_text="Exact: policy, watchdog, a user name, …"
    )


def audit_filters(values: dict[str, Any]) -> AuditFilters:
    """The validated parameters as the audit trail's filters, which pick the right index."""
    workload = values.get("workload")
    kinds = values.get("kind") or ()
    return AuditFilters(
        cluster=values.get("cluster") or "",
        workload=WorkloadRef(workload_id=workload) if workload else None,
        # In AuditKind order, so the same filters give the same query.
        kinds=tuple(kind for kind in AuditKind.values if kind in kinds),
        actor=values.get("actor") or "",
        since=_utc(values.get("since")),
        until=_utc(values.get("until")),
    )


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)
