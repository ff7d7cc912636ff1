"""The facts a policy decision reads, gathered once and kept with the anomaly.

The policy decides on an anomaly from what the database holds at that moment: the workload's
attempts and their exclusions, the anomalies that implicated nodes, the cluster's nodes kept
out of restarts, other jobs' recent exclusions (the blast radius), the recommendation already
open for the attempt, and the cluster's mode. Most of it changes afterwards (a node's health,
a recommendation's status), so a decision could not be explained, or replayed under another
policy, from what the database holds later.

``gather`` reads all of it, for every policy: nothing here depends on a policy's settings, so
that a draft with a longer exclusion time or a wider blast-radius window reads the same facts.
The policy's own choices are pure functions of these facts (``history_from``,
``kept_out_from``, ``over_blast_radius_from`` and ``recovery.loop.policy_rules.choose``): the live
decision goes through them too, so replaying the policy that was in force reproduces it.
The facts are stored as JSON on the anomaly (``Anomaly.decision_facts``) with what was decided.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    ClusterNodeState,
    Confirmation,
    NodeHealth,
)
from recovery.loop.exclusions_read import recent_exclusions
from recovery.models import Anomaly, Attempt, Node, Policy, Recommendation, Workload
from recovery.schedulers.capabilities import Capabilities
from recovery.schedulers.registry import capabilities_of
from recovery.schedulers.slurm import SLURM_CAPABILITIES

# 2: other jobs' exclusions counted by the minute, named only for the nodes the facts name
# elsewhere (version 1 named every node, tens of kilobytes per decision on a busy cluster).
FACTS_VERSION = 2
READABLE_FACTS_VERSIONS = frozenset({1, 2})
# The furthest any policy looks back for its exclusions (its blast window: ``exclusions_read``).
LONGEST_EXCLUSION = timedelta(hours=24 * 90)
# Bounds on what one decision keeps: a workflow's implicating anomalies, the cluster's nodes
# in a keep-out state.
MAX_IMPLICATING = 500
MAX_CLUSTER_NODES = 5000
# Crashes nothing may act on: not yet seen to end the process, or seen not to.
UNCONFIRMED = frozenset({Confirmation.SUSPECTED, Confirmation.SURVIVED, Confirmation.STALLED})


@dataclass(frozen=True)
class History:
    attempts: int
    attempts_without_checkpoint: int
    previously_excluded: frozenset[str] = frozenset()
    # Nodes of the cluster kept out of every job's restart, with the state that keeps each out.
    cluster_nodes: Mapping[str, str] = field(default_factory=dict)
    # The jobs whose attempts are counted: more than one where a workflow's earlier jobs count.
    jobs: int = 1

    @property
    def counted_over(self) -> str:
        """Where the attempts were counted, for a decision's reason ("" for one job)."""
        return f" over {self.jobs} jobs of its workflow" if self.jobs > 1 else ""


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _when(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def sharing_budget(workload: Workload) -> Q:
    """The rows (attempts, anomalies) of ``workload`` and of its workflow's earlier jobs.

    A workflow is one user's on one cluster (``recovery.loop.workflows``): what another
    user's jobs did never counts here.
    """
    own = Q(workload=workload)
    if workload.workflow_id is None:
        return own
    return own | Q(
        workload__workflow_id=workload.workflow_id,
        workload__submit_time__lte=workload.submit_time,
    )


# ------------------------------------------------------------------------- reading the facts


def history_facts(workload: Workload, now: datetime) -> dict[str, Any]:
    """The workload's (and its workflow's earlier jobs') attempts and implicating anomalies."""
    attempts = [
        [bool(checkpoint), list(nodes or []), job, str(exit_state)]
        for checkpoint, nodes, job, exit_state in Attempt.objects.filter(sharing_budget(workload))
        .order_by("workload__submit_time", "workload_id", "number")
        .values_list("produced_checkpoint", "excluded_nodes", "workload_id", "exit_state")
    ]
    implicating = [
        [_iso(at), attribution, category, kind, confirmation, list(nodes)]
        for at, attribution, category, kind, confirmation, nodes in Anomaly.objects.filter(
            sharing_budget(workload), detected_at__gte=now - LONGEST_EXCLUSION
        )
        .order_by("-detected_at", "-id")
        .values_list(
            "detected_at", "attribution", "category", "kind", "confirmation", "implicated_nodes"
        )[: MAX_IMPLICATING * 4]
        if nodes
    ][:MAX_IMPLICATING]
    return {"workload_id": workload.pk, "attempts": attempts, "implicating": implicating}


def cluster_node_facts(cluster_id: int, now: datetime) -> list[list[Any]]:
    """The cluster's nodes in any state some policy keeps out of restarts, with that state."""
    # Three reads, each by an index of its own: one with the three conditions or-ed together
    # walked every node of the cluster for each decision (8,000 row lookups at 8,000 nodes).
    wanted = (
        Node.excluded_at(now),
        Q(health=NodeHealth.UNHEALTHY, last_implicated_at__gte=now - LONGEST_EXCLUSION),
        Q(suspect_since__isnull=False),
    )
    found: dict[str, list[Any]] = {}
    for condition in wanted:
        for name, until, health, implicated_at, suspect_since in (
            Node.objects.filter(condition, cluster_id=cluster_id)
            .order_by("name")
            .values_list("name", "excluded_until", "health", "last_implicated_at", "suspect_since")[
                :MAX_CLUSTER_NODES
            ]
        ):
            found[name] = [name, _iso(until), health, _iso(implicated_at), _iso(suspect_since)]
    return [found[name] for name in sorted(found)[:MAX_CLUSTER_NODES]]


_shared = threading.local()


@contextlib.contextmanager
def blast_facts_shared() -> Iterator[None]:
    """Within the block, decisions on the same workload at the same moment share their blast
    facts: the decisions on one read's anomalies.

    Nothing those decisions write changes them (they leave out the workload's own restarts,
    and add no node), and another worker's exclusion committed between two of them would have
    been as invisible to the first: it is the same read, at the same ``now``.
    """
    if getattr(_shared, "facts", None) is not None:
        yield
        return
    _shared.facts = {}
    try:
        yield
    finally:
        _shared.facts = None


def blast_facts(workload: Workload, now: datetime, named: Iterable[str]) -> dict[str, Any]:
    """The cluster's size and the nodes other jobs' restarts excluded within the longest
    window a policy may count: how many by the minute of their newest exclusion, and when
    those of ``named`` were excluded.

    A blast radius counts the nodes excluded within its window with the decision's own added:
    the count by the minute gives the first for any window in whole minutes, and the nodes a
    decision can exclude are among those its facts name (``named_nodes``), so the overlap is
    known for each without naming the others (thousands of nodes, written with every decision).
    """
    shared: dict[tuple[int, datetime], _OthersExclusions] | None = getattr(_shared, "facts", None)
    key = (workload.pk, now)
    if shared is None:
        others = _others_exclusions(workload, now)
    elif key in shared:
        others = shared[key]
    else:
        others = shared[key] = _others_exclusions(workload, now)
    return {
        "cluster_size": others.cluster_size,
        "excluded_by_minute": [list(entry) for entry in others.by_minute],
        "excluded_at": {
            node: _iso(others.newest[node]) for node in sorted(set(named)) if node in others.newest
        },
    }


@dataclass(frozen=True)
class _OthersExclusions:
    cluster_size: int
    # Each node other workloads' restarts excluded, at its newest exclusion.
    newest: Mapping[str, datetime]
    # (whole minutes before the decision, rounded up, nodes) for each minute with any.
    by_minute: list[tuple[int, int]]


def _others_exclusions(workload: Workload, now: datetime) -> _OthersExclusions:
    newest = recent_exclusions(workload.cluster_id, now).of_others(workload.pk)
    return _OthersExclusions(
        cluster_size=Node.objects.filter(cluster_id=workload.cluster_id).count(),
        newest=newest,
        by_minute=_counted_by_minute(newest.values(), now),
    )


def _counted_by_minute(times: Iterable[datetime], now: datetime) -> list[tuple[int, int]]:
    counts = Counter(minutes_before(now, at) for at in times)
    return sorted(counts.items())


def minutes_before(now: datetime, at: datetime) -> int:
    """Whole minutes from ``at`` to ``now``, rounded up (0 for ``at`` at or after ``now``):
    ``at`` is within a window of ``w`` whole minutes before ``now`` exactly when this is at
    most ``w``."""
    return max(0, -((at - now) // _MINUTE))


_MINUTE = timedelta(minutes=1)


def named_nodes(facts: Mapping[str, Any]) -> set[str]:
    """Every node the facts name outside the blast facts: all a policy's decision on them can
    exclude (the anomaly's, earlier attempts', implicating anomalies', the cluster's kept out,
    the recommendations')."""
    named = set(facts["anomaly"]["implicated_nodes"])
    for row in facts["attempts"]:
        named.update(row[1] or [])
    for row in facts["implicating"]:
        named.update(row[5] or [])
    named.update(row[0] for row in facts["cluster_nodes"])
    for recommendation in (facts["earlier"], facts["open"]):
        if recommendation is not None:
            named.update(recommendation["excluded_nodes"])
    return named


def _recommendation_facts(recommendation: Recommendation | None) -> dict[str, Any] | None:
    if recommendation is None:
        return None
    return {
        "id": recommendation.pk,
        "status": recommendation.status,
        "action": recommendation.action,
        "excluded_nodes": list(recommendation.excluded_nodes or []),
    }


def policy_facts(policy: Policy) -> dict[str, Any]:
    return {"id": policy.pk, "name": policy.name, "updated_at": _iso(policy.updated_at)}


def gather(
    anomaly: Anomaly,
    *,
    attempt_number: int,
    earlier: Recommendation | None,
    open_one: Recommendation | None,
    policy: Policy,
    site_policy: Policy,
    now: datetime,
) -> dict[str, Any]:
    """Everything ``recovery.loop.policy_rules.choose`` reads, as JSON.

    ``earlier`` is the attempt's latest recommendation that was not superseded, ``open_one``
    its open one as locked by the caller. ``policy`` and ``site_policy`` are named, not kept:
    the replay chooses the policies again, and says so when the choice differs.
    """
    workload = anomaly.workload
    attempt = anomaly.attempt
    details = anomaly.details or {}
    since_step = details.get("since_step")
    facts = {
        "v": FACTS_VERSION,
        "at": now.isoformat(),
        "anomaly": {
            "kind": anomaly.kind,
            "category": anomaly.category,
            "attribution": anomaly.attribution,
            "confirmation": anomaly.confirmation,
            "implicated_nodes": list(anomaly.implicated_nodes or []),
            "signature": anomaly.signature,
            "evidence_line": anomaly.evidence_line[:500],
            "role": details.get("role"),
            "since_step": since_step if isinstance(since_step, int) else None,
            "attempt": attempt.number if attempt is not None else None,
            "attempt_exit_state": attempt.exit_state if attempt is not None else None,
        },
        "attempt_number": attempt_number,
        "workload": {
            "state": workload.state,
            "current_attempt": workload.current_attempt,
            "last_checkpoint_step": workload.last_checkpoint_step,
            "acts_automatically": workload.acts_automatically,
            "in_action_scope": workload.in_action_scope,
            "mode": workload.cluster.mode,
            "job_mode": workload.opt_in_mode,
        },
        "policy": policy_facts(policy),
        "site_policy": policy_facts(site_policy),
        "earlier": _recommendation_facts(earlier),
        "open": _recommendation_facts(open_one),
        **history_facts(workload, now),
        "cluster_nodes": cluster_node_facts(workload.cluster_id, now),
        "capabilities": capabilities_facts(workload.cluster.connection),
    }
    return facts | blast_facts(workload, now, named_nodes(facts))


def capabilities_facts(connection: str) -> dict[str, bool] | None:
    """What the scheduler of a cluster connected by ``connection`` can have done, as JSON; None
    when no adapter is registered for it (then nothing can be)."""
    capabilities = capabilities_of(connection)
    return capabilities.as_facts() if capabilities is not None else None


def capabilities_from(facts: Mapping[str, Any]) -> Capabilities:
    """The capabilities a decision's facts recorded. Facts recorded before capabilities were
    are all of Slurm's clusters (or the simulated Slurm's), which can do all of it; facts that
    name none can have nothing done."""
    if "capabilities" not in facts:
        return SLURM_CAPABILITIES
    recorded = facts["capabilities"]
    if not isinstance(recorded, Mapping):
        return Capabilities()
    return Capabilities.from_facts(recorded)


# ------------------------------------------------------------- what a policy makes of them


def excludes(kind: str, confirmation: str, attribution: str, category: str, policy: Policy) -> bool:
    """Whether the policy keeps the nodes an anomaly of these fields implicates out of later
    attempts."""
    if kind == AnomalyKind.STRAGGLER:
        return False  # a straggler is excluded only by the straggler action, when it persists
    if confirmation in UNCONFIRMED:
        return False  # a crash the process did not die of implicates no node
    return attribution in (policy.exclude_on_attributions or []) or (
        category in (policy.exclude_on_categories or [])
    )


# An earlier job of a workflow that ended at its time limit, or completed, was continued by the
# next job on purpose: that is how long runs are chained, not a retry.
_PLANNED_ENDS = frozenset({AttemptExitState.TIMEOUT, AttemptExitState.COMPLETED})


def since_the_workflow_went_on(rows: Sequence[Sequence[Any]], workload_id: int) -> list[Any]:
    """The attempts that count against the retry budget: those after the last planned end of
    an earlier job of the workflow (all of them when there was none).

    Without this, a chain of day-long jobs that each end at their time limit would spend the
    budget with no failure at all, and its first crash would be answered with a stop.
    """
    for index in range(len(rows) - 1, -1, -1):
        job, exit_state = rows[index][2], rows[index][3]
        if job != workload_id and exit_state in _PLANNED_ENDS:
            return list(rows[index + 1 :])
    return list(rows)


def history_from(
    facts: Mapping[str, Any], policy: Policy | None, site: Policy | None, now: datetime
) -> History:
    """``recovery.loop.policy.history_of`` on recorded facts.

    Nodes stay excluded when an earlier attempt excluded them, or when an anomaly of the
    workload (or of its workflow's earlier jobs) implicated them with evidence ``policy``
    excludes on, within its exclusion time; the cluster's nodes kept out follow ``site``.
    """
    rows = facts["attempts"]
    excluded = {node for row in rows for node in row[1] or []}
    attempts = since_the_workflow_went_on(rows, facts["workload_id"])
    without = 0
    for row in reversed(attempts):
        if row[0]:
            break
        without += 1
    cluster_nodes: Mapping[str, str] = {}
    if policy is not None:
        since = now - timedelta(hours=policy.exclusion_hours)
        for at, attribution, category, kind, confirmation, nodes in facts["implicating"]:
            detected = _when(at)
            recent = detected is not None and detected >= since
            if recent and excludes(kind, confirmation, attribution, category, policy):
                excluded.update(nodes or [])
        if site is not None:
            cluster_nodes = kept_out_from(facts["cluster_nodes"], site, now)
    jobs = len({row[2] for row in attempts}) or 1
    return History(len(attempts), without, frozenset(excluded), cluster_nodes, jobs)


def kept_out_from(rows: Sequence[Sequence[Any]], policy: Policy, now: datetime) -> dict[str, str]:
    """The nodes of ``rows`` (``cluster_node_facts``) in a state ``policy`` keeps out of every
    restart, and that state; the most telling state names the node."""
    states = set(policy.keep_out_cluster_nodes or [])
    if not states:
        return {}
    unhealthy_since = now - timedelta(hours=policy.exclusion_hours)
    found: dict[str, str] = {}
    for name, until, health, implicated, suspect_since in rows:
        excluded_until, implicated_at = _when(until), _when(implicated)
        if (
            ClusterNodeState.UNHEALTHY in states
            and health == NodeHealth.UNHEALTHY
            and implicated_at is not None
            and implicated_at >= unhealthy_since
        ):
            found[name] = ClusterNodeState.UNHEALTHY
        elif (
            ClusterNodeState.EXCLUDED in states
            and excluded_until is not None
            and excluded_until > now
        ):
            found[name] = ClusterNodeState.EXCLUDED
        elif ClusterNodeState.SUSPECT in states and suspect_since is not None:
            found[name] = ClusterNodeState.SUSPECT
    return found


def over_blast_radius_from(
    facts: Mapping[str, Any], excluded_nodes: Sequence[str], policy: Policy, now: datetime
) -> bool:
    """More of the cluster excluded or restarted in the window than the cluster's policy
    allows, with ``excluded_nodes`` added."""
    total = int(facts["cluster_size"])
    if not total:
        return False
    window = policy.blast_radius_window_minutes
    since = now - timedelta(minutes=window)
    if "recent_exclusions" in facts:  # version 1: every node named
        nodes = set(excluded_nodes)
        for at, excluded in facts["recent_exclusions"]:
            created = _when(at)
            if created is not None and created >= since:
                nodes.update(excluded or [])
        return len(nodes) * 100 > policy.blast_radius_percent * total
    excluded_at = facts["excluded_at"]
    counted = sum(
        int(count) for minutes, count in facts["excluded_by_minute"] if int(minutes) <= window
    )
    for node in set(excluded_nodes):
        at = _when(excluded_at.get(node))
        if at is None or at < since:
            counted += 1  # not among the nodes counted already
    return counted * 100 > policy.blast_radius_percent * total


def facts_time(facts: Mapping[str, Any]) -> datetime:
    at = _when(facts.get("at"))
    if at is None:
        raise ValueError("decision facts without their time")
    return at


def recorded_anomaly(facts: Mapping[str, Any], workload: Workload) -> Anomaly:
    """An unsaved anomaly as the policy saw it, for ``recovery.loop.policy_rules.decide``."""
    seen = facts["anomaly"]
    state = facts["workload"]
    attempt = None
    if seen["attempt"] is not None:
        attempt = Attempt(number=seen["attempt"], exit_state=seen["attempt_exit_state"] or "")
    as_then = Workload(
        pk=workload.pk,
        cluster_id=workload.cluster_id,
        job_id=workload.job_id,
        state=state["state"],
        current_attempt=state["current_attempt"],
        last_checkpoint_step=state["last_checkpoint_step"],
    )
    details: dict[str, Any] = {}
    if seen["role"] is not None:
        details["role"] = seen["role"]
    if seen["since_step"] is not None:
        details["since_step"] = seen["since_step"]
    anomaly = Anomaly(
        workload=as_then,
        kind=seen["kind"],
        category=seen["category"],
        attribution=seen["attribution"],
        confirmation=seen["confirmation"],
        implicated_nodes=list(seen["implicated_nodes"]),
        signature=seen["signature"],
        evidence_line=seen["evidence_line"],
        details=details,
    )
    anomaly.attempt = attempt
    return anomaly
