"""Read-side queries shared by the Console and the API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import OuterRef, QuerySet, Subquery

from recovery.choices import (
    NODE_ACTIONS,
    OPEN_RECOMMENDATION_STATUSES,
    Disposition,
    RecommendationStatus,
)
from recovery.models import Anomaly, AuditEvent, Recommendation, Workload

# Sort keys the fleet offers, as the reader sees them → the fields they order by.
FLEET_SORTS: dict[str, tuple[str, ...]] = {
    "submitted": ("submit_time", "id"),
    "job": ("job_id", "id"),
    "name": ("name", "id"),
    "cluster": ("cluster__name", "submit_time", "id"),
    "user": ("user", "submit_time", "id"),
    "state": ("state", "submit_time", "id"),
    "attempt": ("current_attempt", "submit_time", "id"),
    "progress": ("last_progress_at", "id"),
    "checkpoint": ("last_checkpoint_step", "id"),
}
ANY_ANOMALY = "any"
NO_ANOMALY = "none"


def fleet_ordering(sort: str) -> list[str]:
    """ORDER BY fields for a sort key such as ``"-progress"``; unknown keys sort newest first."""
    descending = sort.startswith("-")
    fields = FLEET_SORTS.get(sort.removeprefix("-"))
    if fields is None:
        return ["-submit_time", "-id"]
    return [f"-{field}" if descending else field for field in fields]


def fleet_rows(workload_ids: Sequence[int]) -> list[Workload]:
    """The fleet rows of these workloads, in the given order, with their latest anomaly and
    pending recommendation (one query)."""
    latest_anomaly = Anomaly.objects.filter(workload=OuterRef("pk")).order_by("-detected_at", "-id")
    pending = Recommendation.objects.filter(
        workload=OuterRef("pk"), status=RecommendationStatus.AWAITING_APPROVAL
    ).order_by("-created_at", "-id")
    rows = Workload.objects.select_related("cluster").filter(pk__in=list(workload_ids))
    rows = rows.annotate(
        latest_anomaly_category=Subquery(latest_anomaly.values("category")[:1]),
        latest_anomaly_kind=Subquery(latest_anomaly.values("kind")[:1]),
        pending_action=Subquery(pending.values("action")[:1]),
        pending_recommendation_id=Subquery(pending.values("pk")[:1]),
    )
    by_id = {row.pk: row for row in rows}
    return [by_id[pk] for pk in workload_ids if pk in by_id]


def pending_approvals() -> QuerySet[Recommendation]:
    """Recommendations awaiting an operator, oldest first (the approvals page's filterset
    narrows them)."""
    return (
        Recommendation.objects.filter(status=RecommendationStatus.AWAITING_APPROVAL)
        .select_related("workload__cluster", "anomaly", "node")
        .order_by("created_at", "id")
    )


def open_node_actions(node_ids: list[int]) -> dict[int, Recommendation]:
    """For each of the nodes, its newest drain or resume still open (awaiting approval, ready,
    claimed), if any: one query for a page of nodes."""
    found: dict[int, Recommendation] = {}
    open_actions = Recommendation.objects.filter(
        node_id__in=node_ids, action__in=NODE_ACTIONS, status__in=OPEN_RECOMMENDATION_STATUSES
    ).order_by("created_at", "id")
    for recommendation in open_actions:
        assert recommendation.node_id is not None
        found[recommendation.node_id] = recommendation
    return found


def unacknowledged_abandoned() -> QuerySet[Recommendation]:
    """Actions the scheduler did not carry through that no operator acknowledged, newest first."""
    return (
        Recommendation.objects.filter(
            disposition=Disposition.ABANDONED, acknowledged_at__isnull=True
        )
        .select_related("workload__cluster", "anomaly", "node")
        .order_by("-updated_at", "-id")
    )


WORKLOAD_TRAIL_LIMIT = 200


@dataclass(frozen=True)
class WorkloadTrail:
    """The newest events of a workload, newest first, and whether older ones exist."""

    events: list[AuditEvent]
    limit: int
    has_older: bool


def workload_trail(workload: Workload, *, limit: int = WORKLOAD_TRAIL_LIMIT) -> WorkloadTrail:
    """The workload's newest ``limit`` audit events, in one query on (workload, occurred_at).

    A workload may have thousands of events; the rest are on the audit page, filtered by
    workload. One more row than shown is read to know whether there are older ones.
    """
    newest = list(
        AuditEvent.objects.filter(workload=workload).order_by("-occurred_at", "-id")[: limit + 1]
    )
    return WorkloadTrail(events=newest[:limit], limit=limit, has_older=len(newest) > limit)
