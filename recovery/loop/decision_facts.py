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
``kept_out_from``, ``over_blast_radius_from`` and ``recovery.loop.policy.choose``): the live
decision goes through them too, so replaying the policy that was in force reproduces it.
The facts are stored as JSON on the anomaly (``Anomaly.decision_facts``) with what was decided.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import Length

from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    ClusterNodeState,
    Confirmation,
    NodeHealth,
    RecommendationAction,
)
from recovery.models import Anomaly, Attempt, Node, Policy, Recommendation, Workload

# 2: other jobs' exclusions counted by the minute, named only for the nodes the facts name
# elsewhere (version 1 named every node, tens of kilobytes per decision on a busy cluster).
FACTS_VERSION = 2
READABLE_FACTS_VERSIONS = frozenset({1, 2})
# The furthest any policy looks back: its longest exclusion time, its longest blast window.
LONGEST_EXCLUSION = timedelta(hours=24 * 90)
LONGEST_BLAST_WINDOW = timedelta(minutes=24 * 60)
# Bounds on what one decision keeps: a workflow's implicating anomalies, the cluster's nodes
# in a keep-out state, other jobs' exclusions within a day.
MAX_IMPLICATING = 500
MAX_CLUSTER_NODES = 5000
MAX_RECENT_EXCLUSIONS = 5000
# How long before the newest restart a worker read another worker's may have been recorded and
# committed only after it: longer than a decision's transaction.
LATE_COMMIT_SLACK = timedelta(minutes=5)
# Crashes nothing may act on: not yet seen to end the process, or seen not to.
UNCONFIRMED = frozenset({Confirmation.SUSPECTED, Confirmation.SURVIVED, Confirmation.STALLED})
RESTARTS = (RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING)


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
    newest = _recent_exclusions(workload.cluster_id, now).of_others(workload.pk)
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


@dataclass(frozen=True)
class _Exclusion:
    pk: int
    workload_id: int
    at: datetime
    nodes: list[str]
    length: int  # of the stored JSON, as the database counts it


_ExclusionsSignature = tuple[int, int | None, int | None, datetime | None, datetime | None, int]


@dataclass
class _ExclusionsRead:
    """The restarts of a cluster within the longest window that excluded any node."""

    signature: _ExclusionsSignature
    rows: list[_Exclusion]  # newest first
    # Each node's newest exclusion, by which workload, and the newest by any other workload:
    # all a decision needs, whichever workload decides. Made on first use.
    _newest: dict[str, tuple[datetime, int, datetime | None]] | None = None
    _workloads: frozenset[int] = frozenset()
    _of_anyone: dict[str, datetime] | None = None

    def of_others(self, workload_id: int) -> dict[str, datetime]:
        """Each node other workloads' restarts excluded, at its newest exclusion: all a window
        of any length needs to count it, as long as the nodes excluded, not as the restarts
        that excluded them."""
        if len(self.rows) > MAX_RECENT_EXCLUSIONS:
            return dict(_newest_walking(self.rows, workload_id))
        if self._newest is None:
            self._newest, self._workloads = _newest_by_node(self.rows)
        if workload_id not in self._workloads:
            if self._of_anyone is None:
                self._of_anyone = {node: newest for node, (newest, _, _) in self._newest.items()}
            return self._of_anyone
        found = {
            node: newest if by != workload_id else other
            for node, (newest, by, other) in self._newest.items()
        }
        return {node: at for node, at in found.items() if at is not None}

    def extended(self, newer: list[_Exclusion]) -> _ExclusionsRead:
        """This read with ``newer`` restarts (newest first, each newer than every row here)
        before its rows: the index of each node's newest exclusions is carried over and
        updated with theirs, not made again from every row."""
        rows = newer + self.rows
        extended = _ExclusionsRead(_signature_of(rows), rows)
        if self._newest is not None and len(rows) <= MAX_RECENT_EXCLUSIONS:
            ahead, workloads = _newest_by_node(newer)
            extended._newest = _newest_over(ahead, self._newest)
            extended._workloads = workloads | self._workloads
        return extended


def _newest_over(
    ahead: dict[str, tuple[datetime, int, datetime | None]],
    behind: dict[str, tuple[datetime, int, datetime | None]],
) -> dict[str, tuple[datetime, int, datetime | None]]:
    """The index of rows ``ahead`` followed by rows ``behind``, from the index of each."""
    merged = dict(behind)
    for node, (newest, by, other) in ahead.items():
        older = behind.get(node)
        if other is None and older is not None:
            # The newest exclusion behind by another workload than ``by``: its newest, unless
            # ``by`` made that, when it is the newest behind by anyone but ``by``.
            other = older[0] if older[1] != by else older[2]
        merged[node] = (newest, by, other)
    return merged


def _newest_walking(rows: list[_Exclusion], workload_id: int) -> Iterator[tuple[str, datetime]]:
    """As ``_newest_by_node`` finds them, with the ``MAX_RECENT_EXCLUSIONS`` newest restarts of
    other workloads only."""
    seen: set[str] = set()
    others = (row for row in rows if row.workload_id != workload_id)
    for row in itertools.islice(others, MAX_RECENT_EXCLUSIONS):
        for node in row.nodes:
            if node not in seen:
                seen.add(node)
                yield node, row.at


def _newest_by_node(
    rows: list[_Exclusion],
) -> tuple[dict[str, tuple[datetime, int, datetime | None]], frozenset[int]]:
    newest: dict[str, tuple[datetime, int, datetime | None]] = {}
    for row in rows:
        for node in row.nodes:
            found = newest.get(node)
            if found is None:
                newest[node] = (row.at, row.workload_id, None)
            elif found[2] is None and row.workload_id != found[1]:
                newest[node] = (found[0], found[1], row.at)
    return newest, frozenset(row.workload_id for row in rows)


# Each process's last read of a cluster's recent exclusions. A busy cluster's restarts
# excluded hundreds of nodes within the day, and decoding them for every decision was a tenth
# of a worker's time: a decision reads only the restarts recorded since.
_exclusions_read: dict[int, _ExclusionsRead] = {}
_exclusions_lock = threading.Lock()


def _recent_exclusions(cluster_id: int, now: datetime) -> _ExclusionsRead:
    """Every restart of the cluster within the longest window that excluded any node.

    A recommendation's workload, action, time and exclusions never change once it is
    recorded, so the rows this process read before, less those the window left, plus those
    with a higher id, are the rows, unless one committed late under a lower id or was
    deleted: the database's count, ids, times and exclusions' length of the window say so,
    and then every row is read again. What is kept carries the signature of the rows it holds,
    not of the summary before them: a row committed between the two makes the next summary
    differ, and the rows are checked again.
    """
    since = now - LONGEST_BLAST_WINDOW
    window = (
        Recommendation.objects.filter(
            workload__cluster_id=cluster_id, created_at__gte=since, action__in=RESTARTS
        )
        # Most restarts exclude nothing: no row to read for them.
        .exclude(excluded_nodes=[])
    )
    summary = window.aggregate(
        count=Count("id"),
        top=Max("id"),
        ids=Sum("id"),
        newest=Max("created_at"),
        oldest=Min("created_at"),
        length=Sum(Length("excluded_nodes")),
    )
    signature: _ExclusionsSignature = (
        summary["count"],
        summary["top"],
        summary["ids"],
        summary["newest"],
        summary["oldest"],
        summary["length"] or 0,
    )
    if signature[0] > 2 * MAX_RECENT_EXCLUSIONS:
        # More than a decision keeps: the newest of them, read each time, kept by nobody.
        return _ExclusionsRead(signature, _exclusion_rows(window, limit=2 * MAX_RECENT_EXCLUSIONS))
    with _exclusions_lock:
        kept = _exclusions_read.get(cluster_id)
    rows: list[_Exclusion] | None = None
    if kept is not None and kept.signature == signature:
        rows = kept.rows
    elif kept is not None:
        newer = _exclusion_rows(window.filter(id__gt=max((row.pk for row in kept.rows), default=0)))
        still = [row for row in kept.rows if row.at >= since]
        # The usual case: restarts recorded since, none of the kept left the window.
        extended = (
            kept.extended(newer)
            if len(still) == len(kept.rows) and _all_ahead(newer, kept.rows)
            else None
        )
        if extended is not None and extended.signature == signature:
            kept, rows = extended, extended.rows
        else:
            merged = sorted(still + newer, key=lambda row: (row.at, row.pk), reverse=True)
            rows = merged if _signature_of(merged) == signature else None
            if rows is None and merged:
                # A restart of another worker's, committed after a higher id was read: recorded
                # about when the newest kept ones were. Those minutes are read again, not the day.
                known = {row.pk for row in merged}
                late = [
                    row
                    for row in _exclusion_rows(
                        window.filter(created_at__gte=merged[0].at - LATE_COMMIT_SLACK)
                    )
                    if row.pk not in known
                ]
                merged = sorted(merged + late, key=lambda row: (row.at, row.pk), reverse=True)
                rows = merged if late and _signature_of(merged) == signature else None
    if rows is None:
        rows = _exclusion_rows(window)
    if kept is None or rows is not kept.rows:
        kept = _ExclusionsRead(_signature_of(rows), rows)
    with _exclusions_lock:
        _exclusions_read[cluster_id] = kept
    return kept


def _all_ahead(newer: list[_Exclusion], rows: list[_Exclusion]) -> bool:
    """Whether every row of ``newer`` sorts before every row of ``rows`` (newest first)."""
    if not newer or not rows:
        return True
    return min((row.at, row.pk) for row in newer) > (rows[0].at, rows[0].pk)


def _exclusion_rows(
    restarts: QuerySet[Recommendation], limit: int | None = None
) -> list[_Exclusion]:
    newest_first = (
        restarts.annotate(length=Length("excluded_nodes"))
        .order_by("-created_at", "-id")
        .values_list("id", "workload_id", "created_at", "excluded_nodes", "length")
    )
    return [
        _Exclusion(pk, workload_id, at, [str(node) for node in nodes or []], length or 0)
        for pk, workload_id, at, nodes, length in newest_first[:limit]
    ]


def _signature_of(rows: list[_Exclusion]) -> _ExclusionsSignature:
    if not rows:
        return (0, None, None, None, None, 0)
    return (
        len(rows),
        max(row.pk for row in rows),
        sum(row.pk for row in rows),
        max(row.at for row in rows),
        min(row.at for row in rows),
        sum(row.length for row in rows),
    )


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
    """Everything ``recovery.loop.policy.choose`` reads, as JSON.

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
    }
    return facts | blast_facts(workload, now, named_nodes(facts))


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
    """An unsaved anomaly as the policy saw it, for ``recovery.loop.policy.decide``."""
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
