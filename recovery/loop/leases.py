"""A controller's lease on a recommendation while it runs, and its lapse.

A lease is held by one controller process: its token's actor (``controller``, the audit
trail's actor) and the instance id the process made at start (``instance``, in the events'
payloads). Two controllers sharing one token, or one restarted, are two holders: neither
renews, dispatches for or reports on the other's lease, and one waits for the other's lease
to lapse before it claims.

Between a claim and a report (``recovery.loop.recommendations``) the holder renews its lease,
and ``record_dispatch`` writes a scheduler command's event ahead of the command, under a lock
on the row it checks (it changes no status). When the holder goes silent, the sweeper hands the
recommendation back to the other controllers. Who holds a lease, and why another may not act
on it, is told here for the claims and reports too.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.limits import MAX_COMMANDS_BYTES, free_form_problem
from recovery.audit.record import record_event
from recovery.choices import AuditKind, RecommendationAction, RecommendationStatus
from recovery.loop.lock_conflicts import retrying_lock_conflicts
from recovery.models import AuditEvent, Recommendation, Workload
from recovery.models.recommendation import InvalidTransition


def _require_instance(instance: str) -> None:
    if not instance:
        raise ValueError("a lease is held by a controller instance: give its instance id")


@retrying_lock_conflicts
def renew_lease(
    recommendation_id: int, *, controller: str, instance: str, lease_seconds: int
) -> Recommendation:
    """Extend the lease of the controller process that holds it, for a long action.

    Only the holder can renew (not another process with the same token), and only while no
    other controller has claimed it since (a lease that ran out but was not taken over is still
    its holder's). Raises ``InvalidTransition`` otherwise: the controller must stop acting,
    another one owns the recommendation now.
    """
    _require_instance(instance)
    now = timezone.now()
    renewed = Recommendation.objects.filter(
        pk=recommendation_id,
        status=RecommendationStatus.CLAIMED,
        lease_owner=controller,
        lease_instance=instance,
    ).update(lease_expires_at=now + timedelta(seconds=lease_seconds), updated_at=now)
    if renewed != 1:
        raise InvalidTransition(_not_held_by(controller, instance, recommendation_id))
    return Recommendation.objects.get(pk=recommendation_id)


# A controller's commands for one claim are numbered from 1; no action takes this many.
MAX_DISPATCH_SEQUENCE = 100_000


@retrying_lock_conflicts
def record_dispatch(
    recommendation_id: int, *, controller: str, instance: str, argv: list[str], sequence: int
) -> AuditEvent:
    """Record the scheduler command the lease holder is about to run: a ``dispatched`` event.

    Written ahead of the command, so that a command the scheduler carried out is in the trail
    even when its controller is killed before it reports. Allowed only to the controller process
    that holds the lease (not another with the same token), and only while the lease runs: a
    holder paused past its lease must not act even if nobody took over yet, the next claimant
    will. The row stays locked until the event is written, so that no claim takes the
    recommendation over in between. Raises ``InvalidTransition`` otherwise, and ``ValueError``
    for an argv or sequence no controller sends. Each call records one event (the controller
    dispatches each command once).
    """
    _require_instance(instance)
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise ValueError("argv must be a non-empty list of strings")
    if isinstance(sequence, bool) or not 1 <= sequence <= MAX_DISPATCH_SEQUENCE:
        raise ValueError(f"sequence must be from 1 to {MAX_DISPATCH_SEQUENCE}")
    problem = free_form_problem(argv, max_bytes=MAX_COMMANDS_BYTES)
    if problem is not None:
        raise ValueError(f"argv: {problem}")
    now = timezone.now()
    with transaction.atomic():
        # Only the recommendation's row is locked (a join would lock its workload too).
        held = (
            Recommendation.objects.select_for_update()
            .filter(
                pk=recommendation_id,
                status=RecommendationStatus.CLAIMED,
                lease_owner=controller,
                lease_instance=instance,
            )
            .first()
        )
        if held is None:
            raise InvalidTransition(_not_held_by(controller, instance, recommendation_id))
        expires = held.lease_expires_at
        if expires is None or expires <= now:
            when = f" at {expires.isoformat()}" if expires is not None else ""
            raise InvalidTransition(
                f"the lease of {controller} on recommendation {recommendation_id} ran out{when}: "
                f"the next claimant acts on it, not {controller}"
            )
        workload = Workload.objects.select_related("cluster").get(pk=held.workload_id)
        # The step the job had reached when restarted: its next attempt resuming at or past it
        # means the restart bought nothing (``recovery.read.precision``).
        restarting = held.action in (
            RecommendationAction.RESTART,
            RecommendationAction.RESTART_EXCLUDING,
        )
        step_reached = workload.last_progress_step if restarting else None
        return record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=AuditKind.DISPATCHED,
            actor=controller,
            payload={
                "recommendation": held.pk,
                "action": held.action,
                "argv": list(argv),
                "sequence": sequence,
                "controller_instance": instance,
                **({"step_reached": step_reached} if step_reached is not None else {}),
            },
        )


def _holder(owner: str, instance: str) -> str:
    if not owner:
        return "nobody"
    return f"{owner} (instance {instance})" if instance else owner


def _not_held_by(controller: str, instance: str, recommendation_id: int) -> str:
    """Why this controller process may not change the recommendation, as the row stands now."""
    status, owner, held_by = Recommendation.objects.values_list(
        "status", "lease_owner", "lease_instance"
    ).get(pk=recommendation_id)
    same_token = (
        ": another process with the same token holds it"
        if owner == controller and held_by != instance
        else ""
    )
    return (
        f"recommendation {recommendation_id} is {status}, held by {_holder(owner, held_by)}, "
        f"not by {_holder(controller, instance)}{same_token}"
    )


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
            previous_instance = recommendation.lease_instance
            if recommendation.lease_expires_at is None or recommendation.lease_expires_at >= now:
                continue
            try:
                recommendation.transition(
                    RecommendationStatus.READY,
                    lease_owner="",
                    lease_instance="",
                    lease_expires_at=None,
                )
            except InvalidTransition:
                continue  # its controller finished or another sweeper got there first
            workload = recommendation.workload
            record_event(
                cluster=workload.cluster,
                workload=workload,
                attempt=workload.current_attempt or None,
                kind=AuditKind.LEASE_EXPIRED,
                actor=Actor.LEASE_SWEEPER,
                payload={
                    "recommendation": recommendation.pk,
                    "previous_owner": previous_owner,
                    "previous_instance": previous_instance,
                },
            )
            released += 1
    return released
