"""The policy's rules: ``decide`` on an anomaly, and ``choose`` on a decision point's facts.

Pure functions of what they are given: the anomaly, the workload's history or the facts a
decision recorded, and the policies. The live decision (``recovery.loop.policy.recommend``) and
a replay (``recovery.loop.replay``) both decide through them. Apart from ``recovery.loop.policy``,
which chooses the policies, reads the history and records what was decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from recovery.choices import (
    OPEN_RECOMMENDATION_STATUSES,
    AnomalyKind,
    AttemptExitState,
    Attribution,
    DivergenceAction,
    FailureCategory,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
    StragglerAction,
    WorkloadState,
)
from recovery.detection.signatures.jobs import cancelled_by_someone
from recovery.loop.confirmation import AWAITING_CAUSE_ROLES
from recovery.loop.decision_facts import (
    UNCONFIRMED,
    History,
    capabilities_from,
    excludes,
    facts_time,
    history_from,
    over_blast_radius_from,
)
from recovery.models import Anomaly, Policy

# Slurm's word that it ended an attempt for a preemption or for a requeue someone asked for
# ("CANCELLED AT ... DUE TO PREEMPTION", "... DUE TO JOB REQUEUE"), or its PREEMPTED state.
SCHEDULER_REQUEUE_SIGNATURE = "slurm-preempted"
# Categories that say the program itself is wrong: a restart repeats them.
APPLICATION_FAULTS = frozenset(
    {
        FailureCategory.APP_EXCEPTION,
        FailureCategory.CUDA_ERROR_APP,
        FailureCategory.NAN_DIVERGENCE,
    }
)


@dataclass(frozen=True)
class Decision:
    action: str
    excluded_nodes: list[str] = field(default_factory=list)
    reason: str = ""
    stop_reason: str = ""
    # Why each excluded node is excluded: "implicated", "earlier attempt" or a cluster state.
    exclusion_sources: dict[str, str] = field(default_factory=dict)


IMPLICATED = "implicated"
EARLIER_ATTEMPT = "earlier attempt"
# A node kept out for its state on the cluster: "cluster: unhealthy".
CLUSTER_SOURCE = "cluster: "


def _excluding(
    history: History, implicated: Sequence[str]
) -> tuple[list[str], dict[str, str], str]:
    """The nodes a restart keeps out, where each came from, and the words for the reason."""
    sources: dict[str, str] = {node: IMPLICATED for node in implicated}
    for node in history.previously_excluded:
        sources.setdefault(node, EARLIER_ATTEMPT)
    for node, state in history.cluster_nodes.items():
        sources.setdefault(node, CLUSTER_SOURCE + state)
    cluster = sorted(n for n, source in sources.items() if source.startswith(CLUSTER_SOURCE))
    own = sorted(set(sources) - set(cluster))
    words = []
    if own:
        words.append(f"excluding {', '.join(own)}")
    if cluster:
        shown = ", ".join(f"{n} ({history.cluster_nodes[n]})" for n in cluster[:10])
        more = f" and {len(cluster) - 10} more" if len(cluster) > 10 else ""
        words.append(f"keeping out the cluster's {shown}{more}")
    return sorted(sources), sources, "; ".join(words)


def excluding_nodes(policy: Policy) -> Q:
    """``excludes_nodes`` as a database filter."""
    return (
        (
            Q(attribution__in=list(policy.exclude_on_attributions or []))
            | Q(category__in=list(policy.exclude_on_categories or []))
        )
        & ~Q(kind=AnomalyKind.STRAGGLER)
        & ~Q(confirmation__in=list(UNCONFIRMED))
    )


def excludes_nodes(anomaly: Anomaly, policy: Policy) -> bool:
    """Whether the policy keeps the nodes ``anomaly`` implicates out of later attempts."""
    return excludes(
        anomaly.kind, anomaly.confirmation, anomaly.attribution, anomaly.category, policy
    )


def decide(anomaly: Anomaly, policy: Policy, history: History) -> Decision:
    if anomaly.kind == AnomalyKind.SLOWDOWN:
        return Decision(RecommendationAction.NONE, reason="slowdown recorded")
    if anomaly.kind == AnomalyKind.DIVERGENCE:
        return _decide_divergence(anomaly, policy, history)
    implicated = list(anomaly.implicated_nodes)
    excludes = excludes_nodes(anomaly, policy)
    if anomaly.kind == AnomalyKind.STRAGGLER:
        if policy.straggler_action == StragglerAction.RECORD or not implicated:
            return Decision(RecommendationAction.NONE, reason="straggler recorded")
        excluded, sources, words = _excluding(history, implicated)
        return Decision(
            RecommendationAction.RESTART_EXCLUDING,
            excluded,
            f"straggler on {', '.join(implicated)}; {words}",
            exclusion_sources=sources,
        )
    what = f"{anomaly.get_kind_display().lower()} ({anomaly.category or 'no log category'})"
    if _requeued_by_the_scheduler(anomaly):
        return Decision(
            RecommendationAction.NONE, reason=f"{what}: the scheduler requeued the job itself"
        )
    if (
        policy.stop_on_application_fault
        and anomaly.category in APPLICATION_FAULTS
        and anomaly.attribution == Attribution.APPLICATION
    ):
        return Decision(
            RecommendationAction.STOP,
            reason=f"{what}: an application fault",
            stop_reason=StopReason.APPLICATION_FAULT,
        )
    if history.attempts >= policy.max_attempts:
        return Decision(
            RecommendationAction.STOP,
            reason=f"{what} after {history.attempts} attempts{history.counted_over}",
            stop_reason=StopReason.RETRY_BUDGET,
        )
    if history.attempts_without_checkpoint >= policy.max_attempts_without_checkpoint:
        return Decision(
            RecommendationAction.STOP,
            reason=(
                f"{what}: {history.attempts_without_checkpoint} attempts in a row"
                f"{history.counted_over} saved no checkpoint; retries no longer pay off"
            ),
            stop_reason=StopReason.NO_CHECKPOINT,
        )
    if policy.crash_action == RecommendationAction.STOP:
        return Decision(
            RecommendationAction.STOP,
            reason=f"{what}: the policy says stop",
            stop_reason=StopReason.POLICY,
        )
    if policy.crash_action == RecommendationAction.NONE:
        return Decision(RecommendationAction.NONE, reason=f"{what}: the policy says none")
    excluded, sources, words = _excluding(history, implicated if excludes else [])
    if excluded:
        return Decision(
            RecommendationAction.RESTART_EXCLUDING,
            excluded,
            f"{what}; {words}",
            exclusion_sources=sources,
        )
    return Decision(
        RecommendationAction.RESTART, reason=f"{what}; restart from the last checkpoint"
    )


def _requeued_by_the_scheduler(anomaly: Anomaly) -> bool:
    """Slurm ended the attempt for a preemption or an administrator's requeue and put the job
    back in its queue itself: it restarts without the loop, and nothing failed that a restart,
    an exclusion or a stop would mend."""
    attempt = anomaly.attempt
    if anomaly.signature != SCHEDULER_REQUEUE_SIGNATURE or attempt is None:
        return False
    return (
        attempt.exit_state == AttemptExitState.REQUEUED
        or anomaly.workload.current_attempt > attempt.number
    )


# What ``choose`` makes of a decision point: nothing to decide (``SKIPPED``), the attempt's
# earlier recommendation stands (``KEPT``), the policy says no action (``NO_ACTION``), the open
# recommendation already says the same (``SAME``) or is being carried out (``UNDER_WAY``), or a
# new recommendation (``NEW``, superseding the open one if any).
SKIPPED, KEPT, NO_ACTION, SAME, UNDER_WAY, NEW = (
    "skipped",
    "kept",
    "no action",
    "same",
    "under way",
    "new",
)


@dataclass(frozen=True)
class Choice:
    """What the policy makes of one decision point's facts."""

    outcome: str
    decision: Decision | None = None
    # Whether a new recommendation waits for a person (monitor mode, outside the canary, a
    # divergence, over the blast radius) or is ready on the policy's word.
    needs_person: bool = True
    why: str = ""


def choose(facts: Mapping[str, Any], anomaly: Anomaly, policy: Policy, site: Policy) -> Choice:
    """The policy's choice on recorded facts (``recovery.loop.decision_facts.gather``).

    A pure function of the facts, the anomaly as the policy saw it and the two policies: the
    live decision (``recommend``) and a replay (``recovery.loop.replay``) both go through it.
    """
    seen, workload = facts["anomaly"], facts["workload"]
    if seen["confirmation"] in UNCONFIRMED:
        # survived: training went on; stalled: decided as the hang it recorded
        return Choice(SKIPPED, why=f"crash {seen['confirmation']}")
    if cancelled_by_someone(seen["signature"], seen["evidence_line"]):
        # An scancel by the job's owner, an administrator or a stop: never a failure to restart,
        # however long the poll takes to show the job CANCELLED.
        return Choice(SKIPPED, why="the job was cancelled (slurmstepd's notice)")
    if facts["attempt_number"] == workload["current_attempt"] and workload["state"] in (
        WorkloadState.COMPLETED,
        WorkloadState.CANCELLED,
        WorkloadState.STOPPED,
    ):
        # finished, cancelled by its owner or stopped already: nothing to restart
        return Choice(SKIPPED, why=f"the job was {workload['state']}")
    earlier = facts["earlier"]
    if earlier is not None and (
        earlier["status"] not in OPEN_RECOMMENDATION_STATUSES
        or seen["role"] in AWAITING_CAUSE_ROLES
    ):
        return Choice(KEPT, why=f"recommendation {earlier['id']} ({earlier['status']}) stands")
    now = facts_time(facts)
    decision = decide(anomaly, policy, history_from(facts, policy, site, now))
    if decision.action == RecommendationAction.NONE:
        return Choice(NO_ACTION, decision, why=decision.reason)
    missing = capabilities_from(facts).missing_for(
        decision.action, excluding=bool(decision.excluded_nodes)
    )
    if missing:
        # Not even for a person to approve: nothing could carry it out on this scheduler.
        recorded = Decision(
            RecommendationAction.NONE,
            reason=f"{decision.reason}; not recommended: this cluster's scheduler cannot {missing}",
        )
        return Choice(NO_ACTION, recorded, why=recorded.reason)
    # The job's comment can only make the loop more careful than its cluster, never less. A
    # divergence is acted on while the job still trains: a person always decides.
    needs_person = (
        not workload["acts_automatically"]
        or seen["kind"] == AnomalyKind.DIVERGENCE
        or over_blast_radius_from(facts, decision.excluded_nodes, site, now)
    )
    current = facts["open"]
    if current is not None:
        if (
            current["action"] == decision.action
            and current["excluded_nodes"] == decision.excluded_nodes
        ):
            return Choice(SAME, decision, needs_person, "the same failure seen again")
        if current["status"] == RecommendationStatus.CLAIMED:
            return Choice(UNDER_WAY, decision, needs_person, "a controller is acting on it")
    return Choice(NEW, decision, needs_person)


def _decide_divergence(anomaly: Anomaly, policy: Policy, history: History) -> Decision:
    """Training that goes on but diverged: record it, stop the job, or restart it from a
    checkpoint saved before the divergence began (the application resumes from its last one, so
    only when that one predates it; otherwise a restart would resume the divergence)."""
    what = f"training diverged ({anomaly.evidence_line[:160]})"
    if policy.divergence_action == DivergenceAction.RECORD:
        return Decision(RecommendationAction.NONE, reason=f"{what}: recorded")
    if policy.divergence_action == DivergenceAction.STOP:
        return Decision(
            RecommendationAction.STOP,
            reason=f"{what}: the policy says stop",
            stop_reason=StopReason.DIVERGED,
        )
    since = anomaly.details.get("since_step")
    checkpoint = anomaly.workload.last_checkpoint_step
    if not isinstance(since, int) or checkpoint is None or checkpoint >= since:
        began = f"step {since}" if isinstance(since, int) else "an unknown step"
        saved = f"step {checkpoint}" if checkpoint is not None else "none known"
        return Decision(
            RecommendationAction.NONE,
            reason=f"{what}: no checkpoint saved before it began at {began} (last: {saved}); "
            "a restart would resume the divergence",
        )
    if history.attempts >= policy.max_attempts:
        return Decision(
            RecommendationAction.STOP,
            reason=f"{what} after {history.attempts} attempts{history.counted_over}",
            stop_reason=StopReason.RETRY_BUDGET,
        )
    return Decision(
        RecommendationAction.RESTART,
        reason=f"{what}; restart from the checkpoint of step {checkpoint}, saved before it "
        f"began at step {since}",
    )
