"""Operator decisions and controller claims on recommendations.

Each function changes the status with a conditional UPDATE and writes its audit event in the
same transaction, so the trail and the status can never disagree, and a repeated call (a
double click, a re-delivered task) acts once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from recovery.audit import record_event
from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import Recommendation
from recovery.models.recommendation import InvalidTransition

LEASE_EXPIRED_ACTOR = "lease-sweeper"


@dataclass(frozen=True)
class Decision:
    recommendation: Recommendation
    changed: bool
    message: str


def approve(recommendation_id: int, *, operator: str, note: str = "") -> Decision:
    """Approve a recommendation awaiting approval; approving it again changes nothing."""
    return _decide(
        recommendation_id,
        operator=operator,
        note=note,
        new_status=RecommendationStatus.READY,
        event_kind=AuditKind.APPROVED,
        already=RecommendationStatus.READY,
    )


def reject(recommendation_id: int, *, operator: str, note: str = "") -> Decision:
    """Reject a recommendation awaiting approval; rejecting it again changes nothing."""
    return _decide(
        recommendation_id,
        operator=operator,
        note=note,
        new_status=RecommendationStatus.REJECTED,
        event_kind=AuditKind.REJECTED,
        already=RecommendationStatus.REJECTED,
    )


def _decide(
    recommendation_id: int,
    *,
    operator: str,
    note: str,
    new_status: str,
    event_kind: str,
    already: str,
) -> Decision:
    note = note.strip()[:2000]
    with transaction.atomic():
        recommendation = Recommendation.objects.select_related("workload__cluster").get(
            pk=recommendation_id
        )
        if recommendation.status != RecommendationStatus.AWAITING_APPROVAL:
            status = recommendation.get_status_display().lower()
            message = (
                f"Already {status}."
                if recommendation.status == already
                else f"Not awaiting approval: it is {status}."
            )
            return Decision(recommendation, changed=False, message=message)
        try:
            recommendation.transition(
                new_status, decided_by=operator, decided_at=timezone.now(), decision_note=note
            )
        except InvalidTransition:
            return Decision(
                recommendation,
                changed=False,
                message=f"Changed meanwhile: it is {recommendation.get_status_display().lower()}.",
            )
        workload = recommendation.workload
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=event_kind,
            actor=operator,
            payload={
                "recommendation": recommendation.pk,
                "action": recommendation.action,
                "excluded_nodes": recommendation.excluded_nodes,
                "note": note,
            },
        )
    verb = "Approved" if new_status == RecommendationStatus.READY else "Rejected"
    return Decision(recommendation, changed=True, message=f"{verb}.")


def claim(recommendation_id: int, *, controller: str, lease_seconds: int) -> Recommendation:
    """Give a ready recommendation to one controller for ``lease_seconds``.

    Raises ``InvalidTransition`` when it is not ready (another controller holds it, or it was
    already carried out).
    """
    now = timezone.now()
    with transaction.atomic():
        recommendation = Recommendation.objects.select_related("workload__cluster").get(
            pk=recommendation_id
        )
        recommendation.transition(
            RecommendationStatus.CLAIMED,
            lease_owner=controller,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
        )
        workload = recommendation.workload
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=AuditKind.CLAIMED,
            actor=controller,
            payload={"recommendation": recommendation.pk, "lease_seconds": lease_seconds},
        )
    return recommendation


def release_expired_leases() -> int:
    """Return claimed recommendations whose controller went silent to ready. Returns the count.

    The next controller reads the scheduler's state before acting, so a recommendation whose
    action did happen before the lease ran out is recorded as skipped, not repeated.
    """
    now = timezone.now()
    released = 0
    expired_ids = list(
        Recommendation.objects.filter(
            status=RecommendationStatus.CLAIMED, lease_expires_at__lt=now
        ).values_list("pk", flat=True)
    )
    for recommendation_id in expired_ids:
        with transaction.atomic():
            recommendation = Recommendation.objects.select_related("workload__cluster").get(
                pk=recommendation_id
            )
            previous_owner = recommendation.lease_owner
            if recommendation.lease_expires_at is None or recommendation.lease_expires_at >= now:
                continue
            try:
                recommendation.transition(
                    RecommendationStatus.READY, lease_owner="", lease_expires_at=None
                )
            except InvalidTransition:
                continue  # its controller finished or another sweeper got there first
            workload = recommendation.workload
            record_event(
                cluster=workload.cluster,
                workload=workload,
                attempt=workload.current_attempt or None,
                kind=AuditKind.LEASE_EXPIRED,
                actor=LEASE_EXPIRED_ACTOR,
                payload={"recommendation": recommendation.pk, "previous_owner": previous_owner},
            )
            released += 1
    return released
