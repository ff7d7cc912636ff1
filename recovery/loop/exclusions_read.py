"""Each worker's read of a cluster's recent exclusions: the restarts of the day that kept nodes
out, indexed by node, for the blast facts of every decision (``decision_facts.blast_facts``).

A busy cluster's restarts excluded hundreds of nodes within the day, and decoding them for every
decision was a tenth of a worker's time: a worker keeps what it read and, for each decision,
reads only the restarts recorded since, checking by a signature of the window that nothing it
kept is stale.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Max, Min, QuerySet, Sum
from django.db.models.functions import Length

from recovery.choices import RecommendationAction
from recovery.models import Recommendation

# The longest blast window a policy may count.
LONGEST_BLAST_WINDOW = timedelta(minutes=24 * 60)
# Other jobs' restarts a decision counts, at most.
MAX_RECENT_EXCLUSIONS = 5000
# How long before the newest restart a worker read another worker's may have been recorded and
# committed only after it: longer than a decision's transaction.
LATE_COMMIT_SLACK = timedelta(minutes=5)
RESTARTS = (RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING)


@dataclass(frozen=True)
class Exclusion:
    pk: int
    workload_id: int
    at: datetime
    nodes: list[str]
    length: int  # of the stored JSON, as the database counts it


Signature = tuple[int, int | None, int | None, datetime | None, datetime | None, int]


@dataclass
class ExclusionsRead:
    """The restarts of a cluster within the longest window that excluded any node."""

    signature: Signature
    rows: list[Exclusion]  # newest first
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
        return {
            node: at
            for node, (newest, by, other) in self._newest.items()
            if (at := newest if by != workload_id else other) is not None
        }

    def extended(self, newer: list[Exclusion]) -> ExclusionsRead:
        """This read with ``newer`` restarts (newest first, each newer than every row here)
        before its rows: the index of each node's newest exclusions is carried over and
        updated with theirs, not made again from every row."""
        rows = newer + self.rows
        extended = ExclusionsRead(_signature_of(rows), rows)
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


def _newest_walking(rows: list[Exclusion], workload_id: int) -> Iterator[tuple[str, datetime]]:
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
    rows: list[Exclusion],
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


# This process's last read of each cluster's recent exclusions.
_exclusions_read: dict[int, ExclusionsRead] = {}
_exclusions_lock = threading.Lock()


def recent_exclusions(cluster_id: int, now: datetime) -> ExclusionsRead:
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
    signature: Signature = (
        summary["count"],
        summary["top"],
        summary["ids"],
        summary["newest"],
        summary["oldest"],
        summary["length"] or 0,
    )
    if signature[0] > 2 * MAX_RECENT_EXCLUSIONS:
        # More than a decision keeps: the newest of them, read each time, kept by nobody.
        return ExclusionsRead(signature, _exclusion_rows(window, limit=2 * MAX_RECENT_EXCLUSIONS))
    with _exclusions_lock:
        kept = _exclusions_read.get(cluster_id)
    rows: list[Exclusion] | None = None
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
        kept = ExclusionsRead(_signature_of(rows), rows)
    with _exclusions_lock:
        _exclusions_read[cluster_id] = kept
    return kept


def _all_ahead(newer: list[Exclusion], rows: list[Exclusion]) -> bool:
    """Whether every row of ``newer`` sorts before every row of ``rows`` (newest first)."""
    if not newer or not rows:
        return True
    return min((row.at, row.pk) for row in newer) > (rows[0].at, rows[0].pk)


def _exclusion_rows(
    restarts: QuerySet[Recommendation], limit: int | None = None
) -> list[Exclusion]:
    newest_first = (
        restarts.annotate(length=Length("excluded_nodes"))
        .order_by("-created_at", "-id")
        .values_list("id", "workload_id", "created_at", "excluded_nodes", "length")
    )
    return [
        Exclusion(pk, workload_id, at, [str(node) for node in nodes or []], length or 0)
        for pk, workload_id, at, nodes, length in newest_first[:limit]
    ]


def _signature_of(rows: list[Exclusion]) -> Signature:
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
