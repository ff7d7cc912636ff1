"""The policy engine: what an anomaly leads to.

``decide`` is a pure function of the anomaly, the workload's history and the policy. It is
conservative about stopping: a missed stop is bounded by the retry budget, a wrong stop leaves
a healthy run down until someone notices. ``recommend`` records its decision as a
recommendation (one per failed attempt: a later anomaly of the same attempt updates or
supersedes it), ready to act on in an acknowledged action-mode cluster, awaiting approval
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit import record_event
from recovery.choices import (
    OPEN_RECOMMENDATION_STATUSES,
    AnomalyKind,
    AuditKind,
    RecommendationAction,
    RecommendationStatus,
    StragglerAction,
)
from recovery.models import Anomaly, Attempt, Node, Policy, Recommendation, Workload

POLICY_ACTOR = "policy"
# Categories that say the program itself is wrong: a restart repeats them.
APPLICATION_FAULTS = frozenset({"app_exception", "cuda_error_app", "nan_divergence"})


@dataclass(frozen=True)
class History:
    attempts: int
    attempts_without_checkpoint: int
    previously_excluded: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Decision:
    action: str
    excluded_nodes: list[str] = field(default_factory=list)
    reason: str = ""


def policy_for(workload: Workload) -> Policy:
    """The enabled policy matching the most of cluster, environment and partition."""
    candidates = Policy.objects.filter(enabled=True).filter(
        Q(cluster__isnull=True) | Q(cluster=workload.cluster_id),
        Q(environment="") | Q(environment=workload.environment),
        Q(partition="") | Q(partition=workload.partition),
    )
    best = max(candidates, key=lambda p: (p.specificity, bool(p.cluster_id), p.pk), default=None)
    return best or Policy(name="built-in defaults")


def history_of(workload: Workload) -> History:
    attempts = list(Attempt.objects.filter(workload=workload).order_by("number"))
    without = 0
    for attempt in reversed(attempts):
        if attempt.produced_checkpoint:
            break
        without += 1
    excluded = {node for attempt in attempts for node in attempt.excluded_nodes}
    return History(len(attempts), without, frozenset(excluded))


def decide(anomaly: Anomaly, policy: Policy, history: History) -> Decision:
    implicated = list(anomaly.implicated_nodes)
    excludes = anomaly.attribution in (policy.exclude_on_attributions or []) or (
        anomaly.category in (policy.exclude_on_categories or [])
    )
    if anomaly.kind == AnomalyKind.STRAGGLER:
        if policy.straggler_action == StragglerAction.RECORD or not implicated:
            return Decision(RecommendationAction.NONE, reason="straggler recorded")
        nodes = sorted(history.previously_excluded | set(implicated))
        return Decision(
            RecommendationAction.RESTART_EXCLUDING, nodes, f"straggler on {', '.join(implicated)}"
        )
    what = f"{anomaly.get_kind_display().lower()} ({anomaly.category or 'no log category'})"
    if (
        policy.stop_on_application_fault
        and anomaly.category in APPLICATION_FAULTS
        and anomaly.attribution == "application"
    ):
        return Decision(RecommendationAction.STOP, reason=f"{what}: an application fault")
    if history.attempts >= policy.max_attempts:
        return Decision(
            RecommendationAction.STOP, reason=f"{what} after {history.attempts} attempts"
        )
    if history.attempts_without_checkpoint >= policy.max_attempts_without_checkpoint:
        return Decision(
            RecommendationAction.STOP,
            reason=(
                f"{what}: {history.attempts_without_checkpoint} attempts in a row saved no "
                "checkpoint; retries no longer pay off"
            ),
        )
    if policy.crash_action in (RecommendationAction.NONE, RecommendationAction.STOP):
        return Decision(
            policy.crash_action, reason=f"{what}: the policy says {policy.crash_action}"
        )
    nodes = set(history.previously_excluded)
    if excludes:
        nodes |= set(implicated)
    if nodes:
        return Decision(
            RecommendationAction.RESTART_EXCLUDING,
            sorted(nodes),
            f"{what}; excluding {', '.join(sorted(nodes))}",
        )
    return Decision(
        RecommendationAction.RESTART, reason=f"{what}; restart from the last checkpoint"
    )


def recommend(anomaly: Anomaly) -> Recommendation | None:
    """Record the policy's decision for ``anomaly``; one recommendation per failed attempt."""
    workload = anomaly.workload
    cluster = workload.cluster
    policy = policy_for(workload)
    decision = decide(anomaly, policy, history_of(workload))
    if decision.action == RecommendationAction.NONE:
        return None
    attempt_number = anomaly.attempt.number if anomaly.attempt else workload.current_attempt
    key = f"policy:{cluster.pk}:{workload.pk}:{attempt_number}:"
    needs_person = not cluster.acts_automatically or _over_blast_radius(workload, decision, policy)
    status = RecommendationStatus.AWAITING_APPROVAL if needs_person else RecommendationStatus.READY
    now = timezone.now()
    with transaction.atomic():
        current = (
            Recommendation.objects.select_for_update()
            .filter(workload=workload, status__in=OPEN_RECOMMENDATION_STATUSES)
            .filter(idempotency_key__startswith=key)
            .first()
        )
        if current is not None:
            if (
                current.action == decision.action
                and current.excluded_nodes == decision.excluded_nodes
            ):
                return current  # the same failure seen again: one action for it
            if current.status == RecommendationStatus.CLAIMED:
                return current  # a controller is acting on it; the next attempt will be judged
        version = Recommendation.objects.filter(idempotency_key__startswith=key).count()
        recommendation = Recommendation.objects.create(
            workload=workload,
            attempt=anomaly.attempt,
            anomaly=anomaly,
            action=decision.action,
            excluded_nodes=decision.excluded_nodes,
            reason=decision.reason,
            status=status,
            decided_by=POLICY_ACTOR,
            idempotency_key=f"{key}{version + 1}",
            expires_at=now + timedelta(minutes=policy.recommendation_ttl_minutes),
        )
        if current is not None:
            current.transition(RecommendationStatus.SUPERSEDED, superseded_by=recommendation)
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=attempt_number,
                kind=AuditKind.SUPERSEDED,
                actor=POLICY_ACTOR,
                payload={"recommendation": current.pk, "by": recommendation.pk},
            )
        record_event(
            cluster=cluster,
            workload=workload,
            attempt=attempt_number,
            kind=AuditKind.RECOMMENDED,
            actor=POLICY_ACTOR,
            payload={
                "recommendation": recommendation.pk,
                "anomaly": anomaly.pk,
                "action": decision.action,
                "excluded_nodes": decision.excluded_nodes,
                "reason": decision.reason,
                "policy": policy.name,
                "mode": cluster.mode,
                "would_have_done": needs_person,
            },
        )
    return recommendation


def _over_blast_radius(workload: Workload, decision: Decision, policy: Policy) -> bool:
    """More of the cluster excluded or restarted in the window than the policy allows."""
    total = Node.objects.filter(cluster=workload.cluster).count()
    if not total:
        return False
    since = timezone.now() - timedelta(minutes=policy.blast_radius_window_minutes)
    recent = Recommendation.objects.filter(
        workload__cluster=workload.cluster,
        created_at__gte=since,
        action__in=[RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING],
    ).exclude(workload=workload)
    nodes = set(decision.excluded_nodes)
    for excluded in recent.values_list("excluded_nodes", flat=True):
        nodes.update(excluded or [])
    return len(nodes) * 100 > policy.blast_radius_percent * total
