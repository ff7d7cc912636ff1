"""Drains: a node that a site fact blames on hardware is taken out of service, once.

A drain is a recommendation like a restart, carried out by the Advisor Controller on the same
claim, write-ahead dispatch, verify and report path (``scontrol update NodeName=...
State=DRAIN Reason="workload-recovery: <verdict>"``). It differs in three ways:

* Only evidence the job's user does not control leads to one: the node's kernel log, DCGM,
  the scheduler's own node state. What a job printed may restart that job; it never takes a
  node away from every other user.
* It waits for an operator's approval by default, even in action mode; a cluster's
  ``drain_automatically`` lets it run on its own where the cluster acts automatically.
* Recovery never has more of a cluster drained than the policy's blast radius: a drain over
  it is withheld (``drain_withheld``) and an approval over it is refused.

Recovery drains only a node it may own: one whose state was read and is in service
(``Node.drain_refusal``). A node an administrator or Slurm took out of service (DOWN, DRAIN,
FAIL, MAINTENANCE, a reboot or power state, with their reason) is theirs: a drain would
replace their reason with recovery's, and a resume of it would then put the node back in
service. Such a drain is not recommended (``drain_refused``), and the controller checks
again on the node's state read just before its command.

Resuming is a person's decision: the Nodes page's button records a resume, approved by the
person who pressed it, that the controller carries out only on recovery's own drains, where
nothing else has since taken the node out of service.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import (
    OPEN_RECOMMENDATION_STATUSES,
    AnomalyKind,
    Attribution,
    AuditKind,
    EvidenceTrust,
    RecommendationAction,
    RecommendationStatus,
    Severity,
)
from recovery.loop.decision_facts import (
    FACTS_VERSION,
    LONGEST_EXCLUSION,
    capabilities_facts,
    capabilities_from,
    policy_facts,
)
from recovery.loop.policy import site_policy_for
from recovery.models import Anomaly, AuditEvent, Cluster, Node, Policy, Recommendation
from recovery.schedulers.base import drain_reason

# A drain reported done shows in the scheduler's node state from the next poll on; until then
# the recommendation itself says the node is drained.
SYNC_LAG = timedelta(minutes=10)
# One anomaly names at most this many nodes to drain: a finding implicating more is not about
# one bad node, and is left to a person.
MAX_DRAINS_PER_ANOMALY = 8
DONE = (RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED)


def drain_worthy(anomaly: Anomaly) -> bool:
    """A crash that a site fact attributes to the node's hardware."""
    return (
        anomaly.evidence_trust == EvidenceTrust.SITE
        and anomaly.attribution == Attribution.HARDWARE
        and anomaly.kind == AnomalyKind.CRASH
        and anomaly.severity != Severity.WARNING
        and anomaly.provider_due_at is None
        and bool(anomaly.implicated_nodes)
    )


def propose_drains(anomaly: Anomaly, now: datetime | None = None) -> list[Recommendation]:
    """Recommend draining the nodes ``anomaly`` blames, where nothing has done it already.

    What each node's drain was decided on, and what was decided, is kept on the anomaly
    (``drain_facts``) for a replay under another policy (``recovery.loop.replay``).
    """
    if not drain_worthy(anomaly):
        return []
    nodes = sorted({str(name) for name in anomaly.implicated_nodes})
    if len(nodes) > MAX_DRAINS_PER_ANOMALY:
        return []
    now = now or timezone.now()
    policy = site_policy_for(anomaly.workload)
    cluster = anomaly.workload.cluster
    facts = drain_facts(cluster, nodes, now)
    facts["site_policy"] = policy_facts(policy)
    made: list[Recommendation] = []
    for name in nodes:
        # A drain made ready here counts against the radius for the anomaly's next node.
        ready = {r.node.name for r in made if r.node and r.status == RecommendationStatus.READY}
        outcome, why = drain_choice(facts, name, policy, ready)
        facts["result"][name] = outcome
        if outcome == DRAIN_REFUSED:
            node_facts = facts["nodes"][name]
            refusal = {"node": name, "reason": why, "node_state": node_facts["node_state"]}
            _record_once(anomaly, AuditKind.DRAIN_REFUSED, refusal, ("node", "reason"), policy, now)
        elif outcome == DRAIN_WITHHELD:
            withheld = {"node": name, "reason": why}
            _record_once(anomaly, AuditKind.DRAIN_WITHHELD, withheld, ("node",), policy, now)
        elif outcome == DRAIN_PROPOSED:
            recommendation = _propose_drain(anomaly, name, policy, now)
            if recommendation is not None:
                made.append(recommendation)
    if anomaly.pk is not None:
        Anomaly.objects.filter(pk=anomaly.pk).update(drain_facts=facts)
    anomaly.drain_facts = facts
    return made


# What ``drain_choice`` decides for a node: no drain (the policy drains no nodes, the node is
# unknown, or already handled), refused (not recovery's to drain), withheld (blast radius), or
# proposed (a drain recommendation).
DRAIN_OFF, DRAIN_UNKNOWN_NODE, DRAIN_HANDLED = "drains off", "unknown node", "handled"
DRAIN_REFUSED, DRAIN_WITHHELD, DRAIN_PROPOSED = "refused", "withheld", "proposed"


def drain_facts(cluster: Cluster, names: list[str], now: datetime) -> dict[str, Any]:
    """What the drains of ``names`` are decided on, for any policy, as JSON."""
    drained = sorted(drained_by_recovery(cluster, now))
    found = {node.name: node for node in Node.objects.filter(cluster=cluster, name__in=names)}
    nodes: dict[str, Any] = {}
    for name in names:
        node = found.get(name)
        if node is None:
            nodes[name] = {"exists": False}
            continue
        drains = Recommendation.objects.filter(node=node, action=RecommendationAction.DRAIN)
        nodes[name] = {
            "exists": True,
            "drained_by_recovery": node.drained_by_recovery,
            "open_or_recent": drains.filter(
                Q(status__in=OPEN_RECOMMENDATION_STATUSES)
                | Q(status__in=DONE, updated_at__gte=now - SYNC_LAG)
            ).exists(),
            "rejected_at": [
                at.isoformat()
                for at in drains.filter(
                    status=RecommendationStatus.REJECTED,
                    updated_at__gte=now - LONGEST_EXCLUSION,
                ).values_list("updated_at", flat=True)[:100]
            ],
            "refusal": node.drain_refusal,
            "node_state": node.as_read().facts(),
        }
    return {
        "v": FACTS_VERSION,
        "at": now.isoformat(),
        "cluster_size": Node.objects.filter(cluster=cluster).count(),
        "drained": drained,
        "automatic": cluster.drains_without_approval,
        "capabilities": capabilities_facts(cluster.connection),
        "nodes": nodes,
        "result": {},
    }


def drain_choice(
    facts: Mapping[str, Any], name: str, policy: Policy, also_drained: set[str]
) -> tuple[str, str]:
    """What ``policy`` decides for draining ``name`` on recorded ``drain_facts``, and why.
    ``also_drained``: nodes of the same anomaly whose drains were made ready just before."""
    if not policy.drain_nodes:
        return DRAIN_OFF, "the policy drains no nodes"
    if not capabilities_from(facts).drain:
        return DRAIN_OFF, "this cluster's scheduler cannot drain nodes"
    node = facts["nodes"].get(name) or {"exists": False}
    if not node["exists"]:
        return DRAIN_UNKNOWN_NODE, f"{name} is not a node of the cluster"
    now = datetime.fromisoformat(facts["at"])
    rejected_since = now - timedelta(hours=policy.exclusion_hours)
    rejected = any(datetime.fromisoformat(at) >= rejected_since for at in node["rejected_at"])
    if node["drained_by_recovery"] or node["open_or_recent"] or rejected:
        return DRAIN_HANDLED, "drained by recovery, about to be, or refused by an operator lately"
    if node["refusal"]:
        return DRAIN_REFUSED, str(node["refusal"])
    drained = set(facts["drained"]) | also_drained
    over = _over_radius(drained, int(facts["cluster_size"]), name, policy)
    if over:
        return DRAIN_WITHHELD, over
    return DRAIN_PROPOSED, ""


def _propose_drain(
    anomaly: Anomaly, name: str, policy: Policy, now: datetime
) -> Recommendation | None:
    workload = anomaly.workload
    cluster = workload.cluster
    node = Node.objects.get(cluster=cluster, name=name)
    automatic = cluster.drains_without_approval
    source = anomaly.get_evidence_source_display() or "a site fact"
    what = anomaly.signature or anomaly.category or "hardware fault"
    verdict = f"hardware: {anomaly.category or 'unknown'} ({what}) on {name}, from {source}"
    try:
        with transaction.atomic():
            recommendation = Recommendation.objects.create(
                workload=workload,
                anomaly=anomaly,
                node=node,
                action=RecommendationAction.DRAIN,
                reason=drain_reason(verdict),
                status=(
                    RecommendationStatus.READY
                    if automatic
                    else RecommendationStatus.AWAITING_APPROVAL
                ),
                decided_by=Actor.POLICY,
                idempotency_key=f"drain:{cluster.pk}:{node.pk}:{anomaly.pk}",
                expires_at=now + timedelta(minutes=policy.recommendation_ttl_minutes),
            )
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=anomaly.attempt.number if anomaly.attempt else None,
                kind=AuditKind.RECOMMENDED,
                actor=Actor.POLICY,
                payload={
                    "recommendation": recommendation.pk,
                    "anomaly": anomaly.pk,
                    "action": RecommendationAction.DRAIN,
                    "excluded_nodes": [],
                    "exclusion_sources": {},
                    "node": node.name,
                    "reason": recommendation.reason,
                    "evidence_source": anomaly.evidence_source,
                    "policy": policy.name,
                    "mode": cluster.mode,
                    "job_mode": workload.opt_in_mode,
                    "drain_automatically": cluster.drain_automatically,
                    "in_action_scope": workload.in_action_scope,
                    "would_have_done": not automatic,
                },
            )
    except IntegrityError:
        return None  # the same anomaly's drain, recorded by another worker meanwhile
    return recommendation


def drained_by_recovery(cluster: Cluster, now: datetime) -> set[str]:
    """The cluster's nodes recovery has drained or is about to: its own drain reason in the
    scheduler's node state, or a drain approved, claimed, or done too recently to show."""
    names = set(
        Node.objects.filter(Node.drained_by_recovery_condition(), cluster=cluster).values_list(
            "name", flat=True
        )
    )
    names.update(
        Recommendation.objects.filter(
            workload__cluster=cluster, action=RecommendationAction.DRAIN, node__isnull=False
        )
        .filter(
            Q(status__in=[RecommendationStatus.READY, RecommendationStatus.CLAIMED])
            | Q(status__in=DONE, updated_at__gte=now - SYNC_LAG)
        )
        .values_list("node__name", flat=True)
    )
    return names


def over_drain_radius(cluster: Cluster, adding: str, policy: Policy, now: datetime) -> str:
    """Why draining ``adding`` too would take more of the cluster than the policy allows, or ""."""
    total = Node.objects.filter(cluster=cluster).count()
    return _over_radius(drained_by_recovery(cluster, now), total, adding, policy)


def _over_radius(drained: set[str], total: int, adding: str, policy: Policy) -> str:
    drained = drained | {adding}
    if not total or len(drained) * 100 <= policy.blast_radius_percent * total:
        return ""
    return (
        f"draining {adding} would leave {len(drained)} of {total} nodes drained by recovery, "
        f"over the policy's blast radius of {policy.blast_radius_percent} %"
    )


def _record_once(
    anomaly: Anomaly,
    kind: str,
    facts: dict[str, Any],
    once_per: tuple[str, ...],
    policy: Policy,
    now: datetime,
) -> None:
    """The trail says a drain was due and not asked, and why (``drain_withheld``,
    ``drain_refused``): once per blast-radius window for the same ``once_per`` facts."""
    cluster = anomaly.workload.cluster
    since = now - timedelta(minutes=policy.blast_radius_window_minutes)
    recorded = AuditEvent.objects.filter(cluster=cluster, kind=kind, occurred_at__gte=since)
    if recorded.filter(**{f"payload__{key}": facts[key] for key in once_per}).exists():
        return
    record_event(
        cluster=cluster,
        workload=anomaly.workload,
        attempt=anomaly.attempt.number if anomaly.attempt else None,
        kind=kind,
        actor=Actor.POLICY,
        payload={"anomaly": anomaly.pk, **facts},
    )


def approval_problem(recommendation: Recommendation) -> str:
    """Why an operator may not approve this drain now, or "": the node is not recovery's to
    drain as last read (an administrator took it out meanwhile), or the blast radius."""
    if recommendation.action != RecommendationAction.DRAIN or recommendation.node is None:
        return ""
    node = recommendation.node
    refusal = "" if node.drained_by_recovery else node.drain_refusal
    if refusal:
        return refusal
    policy = site_policy_for(recommendation.workload)
    return over_drain_radius(recommendation.workload.cluster, node.name, policy, timezone.now())


@dataclass(frozen=True)
class ResumeRequest:
    recommendation: Recommendation | None
    changed: bool
    message: str


def request_resume(node_id: int, *, operator: str, note: str = "") -> ResumeRequest:
    """An operator asks the controller to resume a node recovery drained; approved as asked.

    Only a node whose synced state shows recovery's own drain and nothing else keeping it out
    of service (``Node.resume_refusal``: not one an administrator then set DOWN, put in
    maintenance or gave their own reason, nor one whose state is unknown); asking again while a
    resume is under way changes nothing. The controller checks the node again, as it reads it
    then, before it runs the resume.
    """
    note = note.strip()[:2000]
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().select_related("cluster").get(pk=node_id)
        refusal = node.resume_refusal
        if refusal:
            return ResumeRequest(None, False, f"Not resumed: {refusal}.")
        under_way = Recommendation.objects.filter(
            node=node, action=RecommendationAction.RESUME, status__in=OPEN_RECOMMENDATION_STATUSES
        ).first()
        if under_way is not None:
            return ResumeRequest(under_way, False, f"A resume of {node.name} is already under way.")
        drain = (
            Recommendation.objects.filter(node=node, action=RecommendationAction.DRAIN)
            .select_related("workload__cluster")
            .order_by("-created_at", "-id")
            .first()
        )
        if drain is None:
            return ResumeRequest(
                None,
                False,
                f"Recovery has no record of draining {node.name}: resume it in the scheduler.",
            )
        policy = site_policy_for(drain.workload)
        version = Recommendation.objects.filter(
            node=node, action=RecommendationAction.RESUME
        ).count()
        reason = f"{operator} resumes {node.name}" + (f": {note}" if note else "")
        recommendation = Recommendation.objects.create(
            workload=drain.workload,
            node=node,
            action=RecommendationAction.RESUME,
            reason=reason[:2000],
            status=RecommendationStatus.READY,
            decided_by=operator,
            approved_by=operator,
            decided_at=now,
            decision_note=note,
            idempotency_key=f"resume:{node.cluster_id}:{node.pk}:{version + 1}",
            expires_at=now + timedelta(minutes=policy.recommendation_ttl_minutes),
        )
        record_event(
            cluster=node.cluster,
            workload=drain.workload,
            kind=AuditKind.APPROVED,
            actor=operator,
            payload={
                "recommendation": recommendation.pk,
                "action": RecommendationAction.RESUME,
                "excluded_nodes": [],
                "node": node.name,
                "drained_with": node.state_reason,
                "note": note,
            },
        )
    return ResumeRequest(
        recommendation, True, f"Resume of {node.name} sent to the cluster's controller."
    )
