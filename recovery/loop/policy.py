"""The policy engine: what an anomaly leads to.

``decide`` is a pure function of the anomaly, the workload's history and the policy (it and
``choose`` are the policy's rules, in ``recovery.loop.policy_rules``). It is conservative about
stopping: a missed stop is bounded by the retry budget, a wrong stop leaves a healthy run down
until someone notices. ``recommend`` records its decision as a recommendation (one per failed
attempt: a later anomaly of the same attempt updates or supersedes it), ready to act on in an
acknowledged action-mode cluster, awaiting approval otherwise.

A workload's policy is chosen twice. ``policy_for`` takes the environment the job named in its
comment and governs the job's own recovery; ``site_policy_for`` takes the cluster's
environment, or the job's only where an operator bound it to the job's partition or account,
and governs what reaches beyond the job: the blast radius, the cluster's nodes kept out of
every restart, nodes excluded on the cluster, suspects and drains (``Policy.FOR_THE_SITE``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import (
    OPEN_RECOMMENDATION_STATUSES,
    AnomalyKind,
    AuditKind,
    Confirmation,
    RecommendationStatus,
)
from recovery.loop.confirmation import AWAITING_CAUSE_ROLES, attempt_ending
from recovery.loop.decision_facts import (
    UNCONFIRMED,
    History,
    cluster_node_facts,
    gather,
    history_facts,
    history_from,
    kept_out_from,
)
from recovery.loop.policy_rules import (
    KEPT,
    NO_ACTION,
    SAME,
    SKIPPED,
    UNDER_WAY,
    Choice,
    choose,
)
from recovery.models import (
    Anomaly,
    Cluster,
    EnvironmentBinding,
    Policy,
    Recommendation,
    Workload,
)

logger = logging.getLogger(__name__)

# A policy engine failure is retried on later polls this many times, then left to the watchdog.
MAX_POLICY_TRIES = 5
POLICY_RETRY_SECONDS = 30
# Anomalies older than this are never decided late: the state they describe is gone.
DECISION_HORIZON = timedelta(hours=6)


def policy_for(workload: Workload) -> Policy:
    """The policy of the job's own recovery: the enabled policy matching the most of cluster,
    the environment the job named, and partition.

    The environment is the job's to choose, so only the settings in ``Policy.FOR_THE_JOB`` are
    read from this policy; what reaches beyond the job follows ``site_policy_for``.
    """
    return _best_policy(workload.cluster_id, workload.environment, workload.partition)


@dataclass(frozen=True)
class SitePolicy:
    """The policy for a workload's effects beyond its own job, and how it was chosen."""

    policy: Policy
    # The environment it was chosen with: the cluster's, or the job's where that is bound.
    environment: str
    # The operator's binding that let the job's environment choose it; None otherwise.
    binding: EnvironmentBinding | None = None
    # Why the environment the job named was not taken; "" when it was, when it named none, or
    # when it would have chosen the same policy.
    refused: str = ""


def site_policy(workload: Workload, own: Policy | None = None) -> SitePolicy:
    """The policy for what ``workload``'s failures do to nodes and to other jobs.

    The cluster's policy: chosen by cluster and partition, with the cluster's environment.
    The environment the job named in its comment counts only where an operator bound it to
    the job's partition or account (``EnvironmentBinding``). Only the settings in
    ``Policy.FOR_THE_SITE`` are read from it. ``own``: ``policy_for(workload)`` when the
    caller has it already, so that it is not chosen again.
    """
    cluster_environment = workload.cluster.environment
    chosen = workload.environment
    policy = _best_policy(workload.cluster_id, cluster_environment, workload.partition)
    if not chosen or chosen == cluster_environment:
        return SitePolicy(policy, cluster_environment)
    wanted = own if own is not None else policy_for(workload)
    binding = _binding_for(workload)
    if binding is not None:
        return SitePolicy(wanted, chosen, binding)
    if wanted.pk == policy.pk:
        return SitePolicy(policy, cluster_environment)  # it would choose the same: none refused
    jobs = [f"partition {workload.partition!r}"] if workload.partition else []
    jobs += [f"account {workload.account!r}"] if workload.account else []
    refused = (
        f"environment {chosen!r} is not bound to {' or '.join(jobs) or 'this job'} on this "
        "cluster: the cluster's policy applies to nodes and other jobs"
    )
    return SitePolicy(policy, cluster_environment, None, refused)


def site_policy_for(workload: Workload) -> Policy:
    """``site_policy``'s policy: read it for effects on nodes and other jobs."""
    return site_policy(workload).policy


def _best_policy(cluster_id: int, environment: str, partition: str) -> Policy:
    """The enabled policy matching the most of cluster, environment and partition."""
    cached: list[Policy] | None = getattr(_policies, "enabled", None)
    if cached is None:
        candidates: Iterable[Policy] = Policy.objects.filter(enabled=True).filter(
            Q(cluster__isnull=True) | Q(cluster=cluster_id),
            Q(environment="") | Q(environment=environment),
            Q(partition="") | Q(partition=partition),
        )
    else:
        candidates = [
            p
            for p in cached
            if p.cluster_id in (None, cluster_id)
            and p.environment in ("", environment)
            and p.partition in ("", partition)
        ]
    best = max(candidates, key=lambda p: (p.specificity, bool(p.cluster_id), p.pk), default=None)
    return best or Policy(name="built-in defaults")


def _binding_for(workload: Workload) -> EnvironmentBinding | None:
    """The operator's binding that lets ``workload`` choose its environment, if any."""
    cached: list[EnvironmentBinding] | None = getattr(_policies, "bindings", None)
    if cached is None:
        candidates: Iterable[EnvironmentBinding] = EnvironmentBinding.objects.filter(
            cluster_id=workload.cluster_id, environment=workload.environment
        ).order_by("pk")
    else:
        candidates = [
            b
            for b in cached
            if b.cluster_id == workload.cluster_id and b.environment == workload.environment
        ]
    return next((b for b in candidates if b.covers(workload.partition, workload.account)), None)


_policies = threading.local()


@contextlib.contextmanager
def policies_read_once() -> Iterator[None]:
    """Inside the block ``policy_for`` and ``site_policy`` choose among the enabled policies
    and the environment bindings as read on entry.

    For a batch of workloads processed in a few seconds (``recovery.loop.workloads``): two
    queries for all of them instead of some per anomaly and check. A policy or binding edited
    meanwhile applies from the next batch. An inner block uses the outer one's reading.
    """
    if getattr(_policies, "enabled", None) is not None:
        yield
        return
    with policies_chosen_from(list(Policy.objects.filter(enabled=True))):
        yield


@contextlib.contextmanager
def policies_chosen_from(candidates: list[Policy]) -> Iterator[None]:
    """Inside the block ``policy_for`` and ``site_policy`` choose among ``candidates`` (with
    the environment bindings as read on entry): a replay's draft among the saved policies."""
    saved = getattr(_policies, "enabled", None), getattr(_policies, "bindings", None)
    _policies.enabled = candidates
    _policies.bindings = list(EnvironmentBinding.objects.order_by("pk"))
    try:
        yield
    finally:
        _policies.enabled, _policies.bindings = saved


def history_of(
    workload: Workload, policy: Policy | None = None, site: Policy | None = None
) -> History:
    """Attempts so far, the run of them without a new checkpoint, and the nodes to keep out.

    A workload in a workflow counts the attempts of the workflow's earlier jobs too, in the
    order they were submitted (from after the last one that ended as planned): the budget and
    the run without a checkpoint carry from one job of the workflow to the next, and so do its
    excluded nodes. Nodes stay excluded when an earlier attempt excluded them, or when an
    anomaly of this workload (or of its workflow's earlier jobs) implicated them with evidence
    the policy excludes on, within its exclusion time.
    ``policy`` is the job's own (``policy_for``); the cluster's nodes kept out of every job
    follow ``site`` (``site_policy_for`` unless given). Read through the facts a decision
    records (``recovery.loop.decision_facts``), so that a replay counts the same way.
    """
    now = timezone.now()
    facts: dict[str, object] = {**history_facts(workload, now), "cluster_nodes": []}
    if policy is not None:
        if site is None:
            site = site_policy_for(workload)
        if site.keep_out_cluster_nodes:
            facts["cluster_nodes"] = cluster_node_facts(workload.cluster_id, now)
    return history_from(facts, policy, site, now)


def kept_out_of_every_job(cluster_id: int, policy: Policy) -> dict[str, str]:
    """The cluster's nodes in a state the policy keeps out of every restart, and that state.

    ``policy`` is the cluster's (``site_policy_for``): which states and how long are the
    operator's to say, never a job's.

    Excluded and unhealthy are set only from site facts (a node's kernel log, DCGM, the
    scheduler's node state): what one user's job printed never keeps a node from other users.
    Both last the policy's exclusion time; a suspect lasts until an operator clears it.
    """
    if not policy.keep_out_cluster_nodes:
        return {}
    now = timezone.now()
    return kept_out_from(cluster_node_facts(cluster_id, now), policy, now)


def recommend(
    anomaly: Anomaly, now: datetime | None = None, *, mark_decided: bool = False
) -> Recommendation | None:
    """Record the policy's decision for ``anomaly``; one recommendation per failed attempt.

    A later anomaly of the same attempt may sharpen an open recommendation (more nodes to
    exclude, a stop); it never adds a second action for an attempt that was already acted on,
    and evidence that only shows a consequence never changes a decision made on a cause.
    The facts decided on and the choice are kept on the anomaly (``decision_facts``), with
    ``mark_decided`` in the same statement as its ``decided_at``.
    """
    now = now or timezone.now()
    workload = anomaly.workload
    cluster = workload.cluster
    attempt_number = anomaly.attempt.number if anomaly.attempt else workload.current_attempt
    key = f"policy:{cluster.pk}:{workload.pk}:{attempt_number}:"
    policy = policy_for(workload)
    site = site_policy(workload, policy)
    # No savepoint of its own: inside ``decide_when_ready``'s, a failure rolls back to that one.
    with transaction.atomic(savepoint=False):
        earlier = (
            Recommendation.objects.filter(idempotency_key__startswith=key)
            .exclude(status=RecommendationStatus.SUPERSEDED)
            .order_by("-created_at", "-id")
            .first()
        )
        current = (
            Recommendation.objects.select_for_update()
            .filter(workload=workload, status__in=OPEN_RECOMMENDATION_STATUSES)
            .filter(idempotency_key__startswith=key)
            .first()
        )
        facts = gather(
            anomaly,
            attempt_number=attempt_number,
            earlier=earlier,
            open_one=current,
            policy=policy,
            site_policy=site.policy,
            now=now,
        )
        choice = choose(facts, anomaly, policy, site.policy)
        recommendation = _carry_out_choice(
            choice, anomaly, attempt_number, key, earlier, current, policy, site, now
        )
        facts["result"] = {
            "outcome": choice.outcome,
            "action": choice.decision.action if choice.decision else None,
            "excluded_nodes": choice.decision.excluded_nodes if choice.decision else [],
            "needs_person": choice.needs_person,
            "recommendation": recommendation.pk if recommendation is not None else None,
            # Why nothing new was recommended (a decision to record only, a recommendation
            # that stands), for the anomaly's page and a replay's reader.
            "why": choice.why,
        }
        facts["exclusion_hours"] = policy.exclusion_hours
        written: dict[str, Any] = {"decision_facts": facts}
        if mark_decided:
            written["decided_at"] = now
        if anomaly.pk is not None:
            Anomaly.objects.filter(pk=anomaly.pk).update(**written)
        for name, value in written.items():
            setattr(anomaly, name, value)
    return recommendation


def _carry_out_choice(
    choice: Choice,
    anomaly: Anomaly,
    attempt_number: int,
    key: str,
    earlier: Recommendation | None,
    current: Recommendation | None,
    policy: Policy,
    site: SitePolicy,
    now: datetime,
) -> Recommendation | None:
    """Write what ``choose`` chose: a new recommendation and its events, or nothing."""
    if choice.outcome == SKIPPED or choice.outcome == NO_ACTION:
        return None
    if choice.outcome == KEPT:
        return earlier
    if choice.outcome in (SAME, UNDER_WAY):
        return current
    decision = choice.decision
    assert decision is not None
    workload = anomaly.workload
    cluster = workload.cluster
    status = (
        RecommendationStatus.AWAITING_APPROVAL
        if choice.needs_person
        else RecommendationStatus.READY
    )
    version = Recommendation.objects.filter(idempotency_key__startswith=key).count()
    recommendation = Recommendation.objects.create(
        workload=workload,
        attempt=anomaly.attempt,
        anomaly=anomaly,
        action=decision.action,
        excluded_nodes=decision.excluded_nodes,
        exclusion_sources=decision.exclusion_sources,
        reason=decision.reason,
        stop_reason=decision.stop_reason,
        status=status,
        decided_by=Actor.POLICY,
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
            actor=Actor.POLICY,
            payload={"recommendation": current.pk, "by": recommendation.pk},
        )
    record_event(
        cluster=cluster,
        workload=workload,
        attempt=attempt_number,
        kind=AuditKind.RECOMMENDED,
        actor=Actor.POLICY,
        payload={
            "recommendation": recommendation.pk,
            "anomaly": anomaly.pk,
            "action": decision.action,
            "excluded_nodes": decision.excluded_nodes,
            "reason": decision.reason,
            "policy": policy.name,
            "site_policy": site.policy.name,
            **({"environment_refused": site.refused} if site.refused else {}),
            "exclusion_sources": decision.exclusion_sources,
            "mode": cluster.mode,
            "job_mode": workload.opt_in_mode,
            "in_action_scope": workload.in_action_scope,
            "would_have_done": choice.needs_person,
        },
    )
    return recommendation


def ready_to_decide(anomaly: Anomaly, policy: Policy, now: datetime) -> bool:
    """Whether the policy may decide on ``anomaly`` now.

    An anomaly whose provider verdict is awaited waits for it. A suspected crash waits for its
    confirmation (``recovery.loop.confirmation``). A confirmed cause
    is decided at once. Evidence that only shows a consequence waits for its cause, but no
    longer than the attempt lasts or the policy's grace period: a rank that lost its peer
    because a node died must lead to a restart without that node, and Slurm says the node is
    down only some seconds after the surviving ranks said so.
    """
    if anomaly.provider_due_at is not None:
        return False  # the provider's verdict is awaited (``recovery.loop.attribution``)
    if anomaly.kind == AnomalyKind.HANG:
        if anomaly.details.get("role") not in AWAITING_CAUSE_ROLES:
            return True  # the silence after a lost peer waits for its cause as the loss would
    elif anomaly.kind != AnomalyKind.CRASH:
        return True
    if anomaly.confirmation == Confirmation.SUSPECTED:
        return False
    if anomaly.confirmation in UNCONFIRMED:
        return True  # decided as nothing to do: see ``recommend``
    if anomaly.details.get("role") not in AWAITING_CAUSE_ROLES:
        return True
    if _attempt_has_ended(anomaly):
        return True
    if Recommendation.objects.filter(workload=anomaly.workload, attempt=anomaly.attempt).exists():
        return True  # the attempt was decided on a cause already
    return now >= anomaly.detected_at + timedelta(seconds=policy.decision_grace_seconds)


def _attempt_has_ended(anomaly: Anomaly) -> bool:
    return anomaly.attempt is None or bool(attempt_ending(anomaly.attempt))


def decide_when_ready(anomaly: Anomaly, now: datetime | None = None) -> Recommendation | None:
    """Decide on ``anomaly`` if it is ready; a failing policy engine never loses the anomaly.

    The decision and the anomaly's ``decided_at`` are written together. When the engine raises,
    the failure is recorded once (``policy_failed``) and retried on later polls a few times;
    meanwhile the watchdog keeps held jobs moving.
    """
    now = now or timezone.now()
    try:
        with transaction.atomic():
            if not ready_to_decide(anomaly, policy_for(anomaly.workload), now):
                return None
            return recommend(anomaly, now, mark_decided=True)
    except Exception as exc:  # the engine is broken: record it, never lose the anomaly
        logger.exception("policy engine failed on anomaly %s", anomaly.pk)
        _record_policy_failure(anomaly, exc, now)
        return None


def _record_policy_failure(anomaly: Anomaly, exc: Exception, now: datetime) -> None:
    tries = int(anomaly.details.get("policy_tries", 0)) + 1
    error = f"{type(exc).__name__}: {exc}"[:500]
    details = {**anomaly.details, "policy_tries": tries, "policy_error": error}
    details["policy_failed_at"] = now.isoformat()
    changes: dict[str, object] = {"details": details}
    if tries >= MAX_POLICY_TRIES:
        changes["decided_at"] = now  # given up: the trail says so, the watchdog takes over
    with transaction.atomic():
        Anomaly.objects.filter(pk=anomaly.pk).update(**changes)
        if tries == 1 or tries >= MAX_POLICY_TRIES:
            workload = anomaly.workload
            record_event(
                cluster=workload.cluster,
                workload=workload,
                attempt=anomaly.attempt.number if anomaly.attempt else None,
                kind=AuditKind.POLICY_FAILED,
                actor=Actor.POLICY,
                payload={
                    "anomaly": anomaly.pk,
                    "error": error,
                    "tries": tries,
                    "given_up": tries >= MAX_POLICY_TRIES,
                },
            )
    anomaly.details = details


def decide_pending(cluster: Cluster, now: datetime | None = None) -> int:
    """Decide the cluster's anomalies that were waiting; returns how many were decided."""
    now = now or timezone.now()
    waiting = (
        Anomaly.objects.filter(
            workload__cluster=cluster,
            decided_at__isnull=True,
            detected_at__gte=now - DECISION_HORIZON,
            provider_due_at__isnull=True,
        )
        .select_related("workload__cluster", "attempt")
        .order_by("detected_at", "id")
    )
    decided = 0
    # Causes first: a symptom whose wait ended with its attempt (the job ended NODE_FAIL) is
    # then decided as the recommendation its cause made, not as a restart of its own.
    for anomaly in sorted(waiting, key=lambda a: a.details.get("role") in AWAITING_CAUSE_ROLES):
        failed_at = anomaly.details.get("policy_failed_at")
        if failed_at and datetime.fromisoformat(failed_at) > now - timedelta(
            seconds=POLICY_RETRY_SECONDS
        ):
            continue
        decide_when_ready(anomaly, now)
        decided += anomaly.decided_at is not None
    return decided
