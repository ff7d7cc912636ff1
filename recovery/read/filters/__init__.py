"""The query parameters of every list, shared by the API and the Console's list pages.

``filtersets`` holds one django-filter FilterSet per list (and the Console pages' subclasses);
``fields`` holds the form fields and filters they are built from.
"""

from __future__ import annotations

from recovery.read.filters.filtersets import (
    ANOMALY_CHOICES,
    ATTENTION_SORT,
    NODE_FLAGS,
    AnomalyFilterSet,
    ApprovalQueueFilterSet,
    AttemptFilterSet,
    AuditEventFilterSet,
    AuditTrailFilterSet,
    ClusterFilterSet,
    FilterProblem,
    FlaggedNodeFilterSet,
    FleetFilterSet,
    ListFilterSet,
    NodeFilterSet,
    RecommendationFilterSet,
    VerdictFilterSet,
    WorkflowFilterSet,
    WorkflowListFilterSet,
    WorkloadFilterSet,
    attention_ordered,
)

__all__ = [
    "ANOMALY_CHOICES",
    "ATTENTION_SORT",
    "NODE_FLAGS",
    "AnomalyFilterSet",
    "ApprovalQueueFilterSet",
    "AttemptFilterSet",
    "AuditEventFilterSet",
    "AuditTrailFilterSet",
    "ClusterFilterSet",
    "FilterProblem",
    "FlaggedNodeFilterSet",
    "FleetFilterSet",
    "ListFilterSet",
    "NodeFilterSet",
    "RecommendationFilterSet",
    "VerdictFilterSet",
    "WorkflowFilterSet",
    "WorkflowListFilterSet",
    "WorkloadFilterSet",
    "attention_ordered",
]
