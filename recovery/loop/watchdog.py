"""The watchdog: when a decision takes too long or never comes, normal scheduling resumes.

Two duties, run by Celery beat whatever state the policy engine is in:

* A job held for a decision longer than its policy's ``decision_timeout_seconds`` is released.
  Held for a decision means its attempt ended into a hold: requeued in held state, by a site's
  hook, by Slurm's ``RequeueExitHold`` or by a controller that died before releasing it. A hold
  put on a job that was waiting to start is its owner's or an administrator's, and is never
  touched. (Slurm's hold reason cannot tell these apart: a requeue-hold by the job's own user
  reads ``JobHeldUser``.) The job is read from the scheduler first, so a repeated or late run
  releases nothing twice.
* A ready recommendation that nobody executed before ``expires_at`` expires: acting on it later
  would act on a state that may be gone.

Both write ``watchdog_released`` / ``expired`` events beside the policy's own. Nothing here
calls the policy engine's decisions; a broken engine only costs the per-policy timeout, for
which the built-in default is used instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import (
    NODE_ACTIONS,
    AuditKind,
    Disposition,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.loop.poll import adapter_for
from recovery.models import (
    AuditEvent,
    Cluster,
    ControllerToken,
    Policy,
    Recommendation,
    Workload,
)
from recovery.models.recommendation import InvalidTransition
from recovery.schedulers.base import Command, SchedulerAdapter, SchedulerError

logger = logging.getLogger(__name__)

# States a workload leaves for a hold that are not an attempt ending: a job waiting to start.
NOT_AN_ENDING = frozenset({"", WorkloadState.PENDING, WorkloadState.HELD})


@dataclass
class WatchdogSummary:
    expired: int = 0
    released: int = 0
    errors: list[str] = field(default_factory=list)


def run_watchdog(
    now: datetime | None = None,
    adapters: dict[int, SchedulerAdapter] | None = None,
) -> WatchdogSummary:
    """Expire stale ready recommendations, then release jobs held past their decision timeout.

    ``adapters`` maps cluster ids to scheduler adapters (tests); otherwise each cluster's own.
    """
    now = now or timezone.now()
    summary = WatchdogSummary()
    summary.expired = expire_stale_recommendations(now)
    for cluster in Cluster.objects.all():
        if not cluster.is_polled:
            continue
        held = list(
            Workload.objects.filter(cluster=cluster, state=WorkloadState.HELD).select_related(
                "cluster"
            )
        )
        if not held:
            continue
        try:
            adapter = (adapters or {}).get(cluster.pk) or adapter_for(cluster)
        except SchedulerError as exc:
            summary.errors.append(f"{cluster.name}: {exc}")
            continue
        for workload in held:
            try:
                summary.released += release_if_overdue(workload, adapter, now)
            except (SchedulerError, ValueError) as exc:
                # ValueError: a node name no scheduler command may carry; the others go on.
                logger.warning("watchdog could not release %s: %s", workload, exc)
                summary.errors.append(f"{workload}: {exc}")
    return summary


def expire_stale_recommendations(now: datetime) -> int:
    expired = 0
    stale = Recommendation.objects.filter(
        status=RecommendationStatus.READY, expires_at__lt=now
    ).values_list("pk", flat=True)
    for recommendation_id in list(stale):
        with transaction.atomic():
            recommendation = Recommendation.objects.select_related("workload__cluster").get(
                pk=recommendation_id
            )
            workload = recommendation.workload
            # An operator approved it and nothing carried it out: that is an abandoned action
            # an operator must hear about, not a quiet expiry.
            abandoned_because = (
                unclaimed_after_approval(recommendation, now) if recommendation.approved_by else ""
            )
            changes = (
                {
                    "disposition": Disposition.ABANDONED,
                    "disposition_reason": abandoned_because[:500],
                }
                if abandoned_because
                else {}
            )
            try:
                recommendation.transition(RecommendationStatus.EXPIRED, **changes)
            except InvalidTransition:
                continue  # claimed or superseded meanwhile
            record_event(
                cluster=workload.cluster,
                workload=workload,
                attempt=recommendation.attempt.number if recommendation.attempt else None,
                kind=AuditKind.EXPIRED,
                actor=Actor.WATCHDOG,
                payload={
                    "recommendation": recommendation.pk,
                    "action": recommendation.action,
                    "expires_at": recommendation.expires_at.isoformat()
                    if recommendation.expires_at
                    else None,
                    "reason": abandoned_because or "ready but not executed before its deadline",
                    "abandoned": bool(abandoned_because),
                },
            )
            expired += 1
    return expired


def unclaimed_after_approval(recommendation: Recommendation, now: datetime) -> str:
    """Why an approved recommendation reached its deadline unclaimed, naming the controllers."""
    cluster = recommendation.workload.cluster
    last_seen = ControllerToken.last_seen_by_cluster([cluster.pk]).get(cluster.pk)
    if last_seen is None:
        controllers = f"no controller of {cluster.name} has ever called in"
    else:
        silent_s = int((now - last_seen).total_seconds())
        controllers = (
            f"the last controller of {cluster.name} called in {silent_s} s ago"
            if silent_s < 120
            else f"no controller of {cluster.name} has called in for {silent_s // 60} min"
        )
    return (
        f"approved by {recommendation.approved_by} but not claimed before its deadline: "
        f"{controllers}; nothing was done to the job"
    )


def decision_timeout(workload: Workload) -> int:
    """The workload's policy timeout; the built-in default when the policy cannot be read."""
    try:
        from recovery.loop.policy import policy_for

        return policy_for(workload).decision_timeout_seconds
    except Exception:  # the watchdog must outlive a broken policy engine
        logger.exception("policy lookup failed for %s; using the default timeout", workload)
        return Policy().decision_timeout_seconds


def held_for_decision_since(workload: Workload) -> datetime | None:
    """When the workload's attempt ended into a hold, or None when its hold is not ours to lift."""
    event = (
        AuditEvent.objects.filter(workload=workload, kind=AuditKind.STATE_CHANGED)
        .order_by("-occurred_at", "-id")
        .first()
    )
    if event is None or event.payload.get("to") != WorkloadState.HELD:
        return None
    if event.payload.get("from", "") in NOT_AN_ENDING:
        return None
    return event.occurred_at


def release_if_overdue(workload: Workload, adapter: SchedulerAdapter, now: datetime) -> bool:
    """Release a job held past its decision timeout, keeping out the nodes it was to avoid.

    A hold that a controller's claimed recommendation owns is left alone until both its lease
    and the decision timeout have passed. When the watchdog does release, the exclusions that the
    workload's open or last restart recommendation carries are set first: releasing a job that
    a crash on a bad node held back onto that same node would undo the recovery.
    """
    since = held_for_decision_since(workload)
    if since is None:
        return False
    timeout = decision_timeout(workload)
    if now - since < timedelta(seconds=timeout):
        return False
    acting = (
        Recommendation.objects.filter(
            workload=workload, status=RecommendationStatus.CLAIMED, lease_expires_at__gte=now
        )
        .exclude(action__in=NODE_ACTIONS)
        .exists()
    )
    if acting:
        return False  # a controller holds a live lease: the hold is part of its work
    job = adapter.get_job(workload.job_id)
    if job is None or job.held is not True:
        return False  # released meanwhile, gone, or its hold cannot be read
    exclusions = exclusions_to_keep(workload)
    commands: list[dict[str, object]] = []
    if exclusions:
        if job.excluded_nodes is None:
            raise SchedulerError(
                f"job {workload.job_id}: its excluded nodes cannot be read "
                f"({job.unreadable.get('excluded_nodes', 'not reported')}); not released "
                "without the exclusions its restart needs"
            )
        if not set(exclusions) <= set(job.excluded_nodes):
            wanted = sorted(set(job.excluded_nodes) | set(exclusions))
            record_dispatch(workload, adapter, Command.SET_EXCLUDED_NODES, wanted, len(commands))
            excluded = adapter.set_excluded_nodes(workload.job_id, wanted)
            commands.append({"argv": list(excluded.argv), "returncode": excluded.returncode})
    record_dispatch(workload, adapter, Command.RELEASE, (), len(commands))
    result = adapter.release(workload.job_id)
    commands.append({"argv": list(result.argv), "returncode": result.returncode})
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=workload.current_attempt or None,
        kind=AuditKind.WATCHDOG_RELEASED,
        actor=Actor.WATCHDOG,
        payload={
            "held_since": since.isoformat(),
            "held_seconds": round((now - since).total_seconds(), 1),
            "decision_timeout_seconds": timeout,
            "hold_reason": job.reason,
            "excluded_nodes": exclusions,
            "command": commands[-1],
            "commands": commands,
        },
    )
    return True


def record_dispatch(
    workload: Workload,
    adapter: SchedulerAdapter,
    command: Command,
    nodes: Sequence[str],
    done: int,
) -> None:
    """Write the command into the trail before it runs, as a controller does: a worker killed
    right after the command still leaves it recorded (the release event comes after it)."""
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=workload.current_attempt or None,
        kind=AuditKind.DISPATCHED,
        actor=Actor.WATCHDOG,
        payload={
            "recommendation": None,
            "action": "watchdog_release",
            "argv": list(adapter.planned_argv(command, workload.job_id, nodes)),
            "sequence": done + 1,
        },
    )


def exclusions_to_keep(workload: Workload) -> list[str]:
    """The nodes the workload's latest restart recommendation keeps out, unless turned down."""
    latest = (
        Recommendation.objects.filter(
            workload=workload, action=RecommendationAction.RESTART_EXCLUDING
        )
        .exclude(status__in=[RecommendationStatus.REJECTED, RecommendationStatus.SUPERSEDED])
        .order_by("-created_at", "-id")
        .values_list("excluded_nodes", flat=True)
        .first()
    )
    return sorted(str(node) for node in latest or [])
