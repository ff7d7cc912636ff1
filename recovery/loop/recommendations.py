"""Operator decisions and controller claims on recommendations.

Each function changes the status with a conditional UPDATE and writes its audit event in the
same transaction, so the trail and the status can never disagree, and a repeated call (a
double click, a re-delivered task) acts once.

A claim gives the recommendation to one controller process under a lease, and only the lease's
holder reports on it; what the holder does in between (renewals, the commands it dispatches)
and the lapse of a lease are ``recovery.loop.leases``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from recovery.audit.limits import MAX_COMMANDS_BYTES, MAX_FREE_FORM_BYTES, free_form_problem
from recovery.audit.record import record_event
from recovery.choices import (
    AuditKind,
    Disposition,
    EvidenceTrust,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.loop import drains
from recovery.loop.leases import _holder, _not_held_by, _require_instance
from recovery.loop.lock_conflicts import retrying_lock_conflicts
from recovery.models import Anomaly, Cluster, Node, Recommendation, Workload
from recovery.models.recommendation import InvalidTransition


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
        recommendation = Recommendation.objects.select_related("workload__cluster", "node").get(
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
        if new_status == RecommendationStatus.READY:
            problem = drains.approval_problem(recommendation)
            if problem:
                return Decision(recommendation, changed=False, message=f"Not approved: {problem}.")
        now = timezone.now()
        changes: dict[str, Any] = {"decided_by": operator, "decided_at": now}
        if new_status == RecommendationStatus.READY:
            changes["approved_by"] = operator
        if new_status == RecommendationStatus.READY and recommendation.expires_at is not None:
            # The deadline to execute counts from the approval, as long as it was at creation.
            changes["expires_at"] = now + (recommendation.expires_at - recommendation.created_at)
        try:
            recommendation.transition(new_status, decision_note=note, **changes)
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
                **({"node": recommendation.node.name} if recommendation.node else {}),
            },
        )
    verb = "Approved" if new_status == RecommendationStatus.READY else "Rejected"
    return Decision(recommendation, changed=True, message=f"{verb}.")


def _claimable(now: datetime, cluster: Cluster) -> Q:
    """Ready, or claimed by a controller whose lease ran out; never past its deadline; and
    still allowed to reach the scheduler (``_still_authorised``).

    Acting after ``expires_at`` would act on a state that may be gone, whether or not the
    watchdog has marked it expired yet.
    """
    return (
        (
            Q(status=RecommendationStatus.READY)
            | Q(status=RecommendationStatus.CLAIMED, lease_expires_at__lt=now)
        )
        & (Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        & _still_authorised(cluster)
    )


def _still_authorised(cluster: Cluster) -> Q:
    """Approved by an operator, or made ready by the policy where ``cluster`` still acts on its
    own: action mode, acknowledged, the job in the part of the cluster action mode reaches (its
    canary partitions and share); for a drain, automatic drains on and no canary (a drain takes
    a node from every partition it serves).

    A cluster switched back to monitor mode, whose acknowledgement or automatic drains were
    turned off, or whose canary no longer covers the job, stops what the policy made ready
    before the change: nothing the policy alone decided reaches the scheduler once the cluster
    no longer lets it. ``cluster`` is read in the caller's transaction.
    """
    approved = ~Q(approved_by="")
    if not cluster.acts_automatically:
        return approved
    in_scope = Q(workload__canary_bucket__lt=cluster.action_share_percent)
    if cluster.action_partitions:
        in_scope &= Q(workload__partition__in=[str(p) for p in cluster.action_partitions])
    drains_automatically = Q() if cluster.drains_without_approval else Q(node__isnull=True)
    return approved | (Q(workload__cluster=cluster) & in_scope & drains_automatically)


def claimable_for(cluster: Cluster) -> QuerySet[Recommendation]:
    """What a controller of ``cluster`` may claim now, oldest first.

    Ready recommendations (approved in monitor mode, or made ready by the policy in an
    acknowledged action-mode cluster, within its canary) and claimed ones whose controller's
    lease ran out.
    """
    cluster = Cluster.objects.get(pk=cluster.pk)  # the controls as stored now
    return (
        Recommendation.objects.filter(workload__cluster=cluster)
        .filter(_claimable(timezone.now(), cluster))
        .select_related("workload", "attempt", "node")
        .order_by("created_at", "id")
    )


@retrying_lock_conflicts
def claim(
    recommendation_id: int, *, controller: str, instance: str, lease_seconds: int
) -> Recommendation:
    """Give a recommendation to one controller process for ``lease_seconds``.

    Ready ones, and claimed ones whose lease expired, can be claimed until their deadline; the
    conditional UPDATE lets exactly one of several racing controllers win. A lease that runs is
    nobody else's to take, whatever token they share. Raises ``InvalidTransition`` otherwise.
    """
    _require_instance(instance)
    now = timezone.now()
    with transaction.atomic():
        # Locked like a change of the cluster's controls locks it: a claim sees them before or
        # after a change, never half of one.
        cluster_id = Recommendation.objects.filter(pk=recommendation_id).values_list(
            "workload__cluster_id", flat=True
        )
        cluster = Cluster.objects.select_for_update().get(pk=cluster_id.get())
        claimable = Recommendation.objects.filter(pk=recommendation_id).filter(
            _claimable(now, cluster)
        )
        previous_owner, previous_instance = claimable.values_list(
            "lease_owner", "lease_instance"
        ).first() or ("", "")
        updated = claimable.update(
            status=RecommendationStatus.CLAIMED,
            disposition=Disposition.PENDING,
            lease_owner=controller,
            lease_instance=instance,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            updated_at=now,
        )
        recommendation = Recommendation.objects.select_related("workload__cluster", "node").get(
            pk=recommendation_id
        )
        if updated != 1:
            deadline = recommendation.expires_at
            if deadline is not None and deadline <= now:
                raise InvalidTransition(
                    f"recommendation {recommendation_id} is past its deadline "
                    f"{deadline.isoformat()}"
                )
            raise InvalidTransition(
                f"recommendation {recommendation_id} is {recommendation.status}, held by "
                f"{_holder(recommendation.lease_owner, recommendation.lease_instance)}"
            )
        workload = recommendation.workload
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=AuditKind.CLAIMED,
            actor=controller,
            payload={
                "recommendation": recommendation.pk,
                "lease_seconds": lease_seconds,
                "previous_owner": previous_owner,
                "controller_instance": instance,
                "previous_instance": previous_instance,
            },
        )
    return recommendation


# Keyed by the outcome a controller reports, a plain string (ActionReport.outcome).
REPORT_OUTCOMES: dict[str, AuditKind] = {
    RecommendationStatus.EXECUTED: AuditKind.SCHEDULER_ACTION,
    RecommendationStatus.SKIPPED: AuditKind.ACTION_SKIPPED,
    RecommendationStatus.FAILED: AuditKind.ACTION_FAILED,
}
# Not finished, to be taken up again from the scheduler's state: a read failed, a fact was
# unknown, or the action is half done. The recommendation goes back to ready.
RETRY = "retry"


@dataclass(frozen=True)
class ActionReport:
    """What a controller did with a claimed recommendation, as it observed it."""

    outcome: str  # executed, skipped (already done), failed, or retry
    state_before: dict[str, Any]
    commands: list[dict[str, Any]]
    converged: bool | None = None
    detail: str = ""


@retrying_lock_conflicts
def report(
    recommendation_id: int, *, controller: str, instance: str, result: ActionReport
) -> Recommendation:
    """Record the outcome a controller process reports for the recommendation it holds.

    Reporting the same final outcome again is a no-op (a controller retrying after a lost
    reply). The status changes only where the row is still claimed by this controller process
    (a conditional UPDATE); a report from one that does not hold the lease, another process
    with the same token included, is refused with ``InvalidTransition``, and the refusal is
    itself audited with what the controller said it did, so no executed command is lost from
    the trail.
    """
    _require_instance(instance)
    if result.outcome not in REPORT_OUTCOMES and result.outcome != RETRY:
        raise ValueError(f"outcome must be one of {sorted([*REPORT_OUTCOMES, RETRY])}")
    # Both are kept forever in the trail: the API refuses more, and nothing else may store it.
    for name, value, limit in (
        ("state_before", result.state_before, MAX_FREE_FORM_BYTES),
        ("commands", result.commands, MAX_COMMANDS_BYTES),
    ):
        problem = free_form_problem(value, max_bytes=limit)
        if problem is not None:
            raise ValueError(f"{name}: {problem}")
    now = timezone.now()
    outcome_payload = {
        "outcome": result.outcome,
        "state_before": result.state_before,
        "commands": result.commands,
        "converged": result.converged,
        "detail": result.detail[:2000],
    }
    refusal = ""
    with transaction.atomic():
        recommendation = Recommendation.objects.select_related("workload__cluster").get(
            pk=recommendation_id
        )
        if (
            recommendation.status == result.outcome
            and recommendation.lease_owner == controller
            and recommendation.lease_instance == instance
        ):
            return recommendation
        workload = recommendation.workload
        event = {
            "recommendation": recommendation.pk,
            "action": recommendation.action,
            "excluded_nodes": recommendation.excluded_nodes,
            **outcome_payload,
            "controller_instance": instance,
        }
        retry = result.outcome == RETRY
        disposition, disposition_reason = disposition_of(result)
        try:
            recommendation.transition(
                RecommendationStatus.READY if retry else result.outcome,
                held_by=controller,
                held_by_instance=instance,
                lease_expires_at=None,
                disposition=disposition,
                disposition_reason=disposition_reason[:500],
                **(
                    {"lease_owner": "", "lease_instance": ""}
                    if retry
                    else {"result": outcome_payload}
                ),
            )
        except InvalidTransition:
            refusal = _not_held_by(controller, instance, recommendation_id)
            kind, payload = AuditKind.REPORT_REFUSED, {**event, "refused": refusal}
        else:
            if result.outcome == RecommendationStatus.EXECUTED and recommendation.excluded_nodes:
                _mark_excluded(workload, recommendation.excluded_nodes, now)
            kind, payload = REPORT_OUTCOMES.get(result.outcome, AuditKind.ACTION_RETRY), event
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=kind,
            actor=controller,
            payload=payload,
        )
        if not refusal and _stopped(recommendation, result):
            _record_stopped(recommendation, controller)
    if refusal:
        # Raised after the transaction so that the refusal's audit row is kept.
        raise InvalidTransition(refusal)
    return recommendation


def disposition_of(result: ActionReport) -> tuple[str, str]:
    """Converged, abandoned (with why) or still pending, from what the controller verified.

    An action reported done is converged only when the controller re-read the job and saw the
    wanted state; done without that, or refused, or failed, it is abandoned: nothing will
    carry it further, and an operator is told.
    """
    if result.outcome == RETRY:
        return Disposition.PENDING, f"to be continued: {result.detail}" if result.detail else ""
    if result.converged is True:
        return Disposition.CONVERGED, ""
    if result.outcome == RecommendationStatus.FAILED:
        return Disposition.ABANDONED, result.detail or "the action failed"
    return Disposition.ABANDONED, result.detail or "the wanted state was not reached"


def acknowledge(recommendation_id: int, *, operator: str, note: str = "") -> Decision:
    """An operator saw an abandoned action; acknowledging it again changes nothing."""
    note = note.strip()[:2000]
    with transaction.atomic():
        recommendation = (
            Recommendation.objects.select_for_update()
            .select_related("workload__cluster")
            .get(pk=recommendation_id)
        )
        if recommendation.disposition != Disposition.ABANDONED:
            return Decision(recommendation, False, "Not an abandoned action.")
        if recommendation.acknowledged_at is not None:
            return Decision(
                recommendation, False, f"Already acknowledged by {recommendation.acknowledged_by}."
            )
        recommendation.acknowledged_by = operator
        recommendation.acknowledged_at = timezone.now()
        recommendation.save(update_fields=["acknowledged_by", "acknowledged_at", "updated_at"])
        workload = recommendation.workload
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=recommendation.attempt.number if recommendation.attempt else None,
            kind=AuditKind.ABANDONMENT_ACKNOWLEDGED,
            actor=operator,
            payload={
                "recommendation": recommendation.pk,
                "reason": recommendation.disposition_reason,
                "note": note,
            },
        )
    return Decision(recommendation, True, "Acknowledged.")


def _stopped(recommendation: Recommendation, result: ActionReport) -> bool:
    """A stop the controller saw take hold: the job ended and nothing will restart it."""
    return (
        recommendation.action == RecommendationAction.STOP
        and result.outcome in (RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED)
        and result.converged is True
    )


def _record_stopped(recommendation: Recommendation, controller: str) -> None:
    """The workload is STOPPED, with the ``stopped`` event saying why; once."""
    workload = Workload.objects.select_for_update().get(pk=recommendation.workload_id)
    if workload.state == WorkloadState.STOPPED:
        return
    attempt = workload.current_attempt or None
    reason = f"Stopped by recovery: {recommendation.reason}"[:255]
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=attempt,
        kind=AuditKind.STATE_CHANGED,
        actor=controller,
        payload={"from": workload.state, "to": WorkloadState.STOPPED, "reason": reason},
    )
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=attempt,
        kind=AuditKind.STOPPED,
        actor=controller,
        payload={
            "recommendation": recommendation.pk,
            "stop_reason": recommendation.stop_reason,
            "reason": recommendation.reason,
        },
    )
    Workload.objects.filter(pk=workload.pk).update(
        state=WorkloadState.STOPPED, state_reason=reason, updated_at=timezone.now()
    )


def _mark_excluded(workload: Workload, nodes: list[str], now: datetime) -> None:
    """Record until when the nodes a restart left out stay excluded (shown in the Console).

    Only nodes a site fact implicated in this workload: a node left out on what the job
    printed or pushed alone is left out of that job's restart, and not shown as excluded on
    the cluster's node list, which would blame it for every user.
    """
    from recovery.loop.policy import site_policy_for
    from recovery.loop.policy_rules import excluding_nodes

    # The cluster's policy, not the job's: the job names its environment itself.
    site = site_policy_for(workload)
    implicated_by_site: set[str] = set()
    for implicated in (
        Anomaly.objects.filter(workload=workload, evidence_trust=EvidenceTrust.SITE)
        .filter(excluding_nodes(site))
        .values_list("implicated_nodes", flat=True)
    ):
        implicated_by_site.update(implicated or [])
    nodes = [name for name in nodes if name in implicated_by_site]
    if not nodes:
        return
    until = now + timedelta(hours=site.exclusion_hours)
    Node.objects.filter(cluster=workload.cluster, name__in=nodes).filter(
        Q(excluded_until__isnull=True) | Q(excluded_until__lt=until)
    ).update(excluded_until=until)
