from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from recovery.choices import (
    OPEN_RECOMMENDATION_STATUSES,
    RECOMMENDATION_TRANSITIONS,
    Disposition,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
)
from recovery.models.anomaly import Anomaly
from recovery.models.cluster import Node
from recovery.models.workload import Attempt, Workload


class InvalidTransition(Exception):
    """The recommendation is not in a status from which the requested change is allowed."""


class Recommendation(models.Model):
    """What the policy engine advises for a workload, and how far that advice has gone.

    Recorded before anything acts on it. Status changes are conditional UPDATEs, so two
    controllers or two operators racing on one recommendation cannot both succeed.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="recommendations")
    attempt = models.ForeignKey(
        Attempt, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    anomaly = models.ForeignKey(
        Anomaly, on_delete=models.SET_NULL, null=True, blank=True, related_name="recommendations"
    )
    action = models.CharField(max_length=24, choices=RecommendationAction.choices)
    node = models.ForeignKey(
        Node,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="recommendations",
        help_text="The node a drain or resume is for; empty for a job's restart or stop.",
    )
    excluded_nodes = models.JSONField(default=list, blank=True)
    exclusion_sources = models.JSONField(
        default=dict,
        blank=True,
        help_text='Why each excluded node is excluded: "implicated" by this job\'s failure, '
        'an "earlier attempt" of it, or the node\'s state on the cluster ("cluster: unhealthy").',
    )
    reason = models.TextField()
    stop_reason = models.CharField(
        max_length=24, choices=StopReason.choices, blank=True, help_text="Why a stop, for stops."
    )
    status = models.CharField(
        max_length=24, choices=RecommendationStatus.choices, default=RecommendationStatus.PROPOSED
    )
    decided_by = models.CharField(max_length=150, blank=True)
    approved_by = models.CharField(
        max_length=150,
        blank=True,
        help_text="The operator who approved it; blank when the policy made it ready itself.",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True)
    idempotency_key = models.CharField(max_length=128, unique=True)
    lease_owner = models.CharField(max_length=150, blank=True)
    lease_instance = models.CharField(
        max_length=64,
        blank=True,
        help_text="The controller process holding the lease (the instance id it made at start): "
        "two controllers sharing one token are two holders.",
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Deadline for execution once ready."
    )
    result = models.JSONField(default=dict, blank=True)
    disposition = models.CharField(
        max_length=16,
        choices=Disposition.choices,
        blank=True,
        help_text="Blank until a controller takes it up; then pending until it reports whether "
        "the scheduler reached the wanted state (converged) or not (abandoned).",
    )
    disposition_reason = models.CharField(max_length=500, blank=True)
    acknowledged_by = models.CharField(
        max_length=150, blank=True, help_text="The operator who acknowledged an abandoned action."
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    superseded_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("decide_recommendation", "Can approve or reject recommendations")]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"]),
            models.Index(fields=["workload", "status"]),
            models.Index(fields=["disposition", "acknowledged_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.get_action_display()} {self.workload} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_RECOMMENDATION_STATUSES

    def transition(
        self,
        new_status: str,
        *,
        held_by: str | None = None,
        held_by_instance: str | None = None,
        **changes: Any,
    ) -> None:
        """Move to ``new_status`` if, and only if, the row is still in the status we hold (and,
        with ``held_by`` and ``held_by_instance``, its lease is still that controller process's).

        Raises ``InvalidTransition`` when the table forbids the change or another process
        changed the row first; the instance is refreshed in that case.
        """
        allowed = RECOMMENDATION_TRANSITIONS.get(self.status, frozenset())
        if new_status not in allowed:
            raise InvalidTransition(f"cannot go from {self.status} to {new_status}")
        changes["status"] = new_status
        changes["updated_at"] = timezone.now()
        current = Recommendation.objects.filter(pk=self.pk, status=self.status)
        if held_by is not None:
            current = current.filter(lease_owner=held_by)
        if held_by_instance is not None:
            current = current.filter(lease_instance=held_by_instance)
        updated = current.update(**changes)
        if updated != 1:
            self.refresh_from_db()
            raise InvalidTransition(f"the recommendation is now {self.status}")
        for field, value in changes.items():
            setattr(self, field, value)
