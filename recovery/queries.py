"""Read-side queries shared by the Console and the API."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery

from recovery.choices import RecommendationStatus
from recovery.models import Anomaly, AuditEvent, Recommendation, Workload


def fleet_workloads(
    *,
    cluster: str = "",
    state: str = "",
    search: str = "",
) -> QuerySet[Workload]:
    """Monitored workloads with their latest anomaly and pending recommendation, one query."""
    latest_anomaly = Anomaly.objects.filter(workload=OuterRef("pk")).order_by("-detected_at", "-id")
    pending = Recommendation.objects.filter(
        workload=OuterRef("pk"), status=RecommendationStatus.AWAITING_APPROVAL
    ).order_by("-created_at", "-id")
    workloads = (
        Workload.objects.select_related("cluster")
        .annotate(
            latest_anomaly_category=Subquery(latest_anomaly.values("category")[:1]),
            latest_anomaly_kind=Subquery(latest_anomaly.values("kind")[:1]),
            pending_action=Subquery(pending.values("action")[:1]),
            pending_recommendation_id=Subquery(pending.values("pk")[:1]),
        )
        .order_by("-submit_time", "-id")
    )
    if cluster:
        workloads = workloads.filter(cluster__name=cluster)
    if state:
        workloads = workloads.filter(state=state)
    if search:
        term = search.strip()
        workloads = workloads.filter(job_id=term) | workloads.filter(name__icontains=term)
    return workloads


def pending_approvals() -> QuerySet[Recommendation]:
    return (
        Recommendation.objects.filter(status=RecommendationStatus.AWAITING_APPROVAL)
        .select_related("workload__cluster", "anomaly")
        .order_by("created_at", "id")
    )


def workload_trail(workload: Workload) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(workload=workload).order_by("occurred_at", "id")
