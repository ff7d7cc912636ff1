"""Action precision: how many of the loop's actions on the scheduler were later judged unnecessary.

An operator leaves action mode on when few of the loop's actions turn out to have bought
nothing. The actions taken are the recommendations a controller carried out (``scheduler_action``
events: a restart, a restart excluding nodes, a stop, a drain), counted by when they were done.
One is judged unnecessary, with its reason, when

* a restart was followed by the job resuming at or past the step it had reached when it was
  restarted: no work was lost, so nothing was wrong that the restart mended. The step reached is
  recorded with the restart's ``dispatched`` events; a job that resumes from a checkpoint starts
  below it, which is what a restart normally costs, and is not counted. A restart recorded
  without that step is never judged;
* an operator put a node the loop drained back in service ("Return to service", or a resume in
  the scheduler) within ``RESUME_WITHIN`` of the drain.

A recommendation an operator rejected was proposed and never carried out: it is counted apart,
as an unnecessary action avoided, and does not lower the precision.

Every figure comes from a fixed number of queries over the audit trail's kind-and-time index,
bounded by the actions in the range, never by the trail's length, and none per row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, TextChoices
from django.db.models.fields.json import KT

from recovery.choices import AuditKind, RecommendationAction
from recovery.models import AuditEvent, Cluster, Recommendation

# What the loop does on the scheduler: a job's restart or stop, a node's drain. A resume is a
# person's decision (``recovery.loop.drains.request_resume``), never the loop's.
TAKEN_ACTIONS = (
    RecommendationAction.RESTART,
    RecommendationAction.RESTART_EXCLUDING,
    RecommendationAction.STOP,
    RecommendationAction.DRAIN,
)
RESTARTS = frozenset({RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING})
# A drained node an operator puts back in service this soon was not worth draining.
RESUME_WITHIN = timedelta(hours=1)
# A controller records each command before it runs it, within its lease: a restart's
# ``dispatched`` events precede its ``scheduler_action`` by minutes, never by this much.
DISPATCH_LEAD = timedelta(days=1)
# The judged actions listed with their evidence, newest first; the figures count them all.
MAX_LISTED = 100


class Unnecessary(TextChoices):
    RESUMED_IN_PLACE = "resumed_in_place", "Resumed where it was"
    RETURNED_WITHIN_AN_HOUR = "returned_within_an_hour", "Drained node returned within an hour"
    REJECTED = "rejected", "Rejected by an operator"


@dataclass
class JudgedAction:
    """An action judged unnecessary (or a rejected recommendation), with what judged it."""

    cluster_id: int
    recommendation_id: int
    workload_id: int | None
    action: str
    reason: Unnecessary
    # When the action was carried out, or the recommendation rejected.
    at: datetime
    # The operator who rejected it or put its node back in service; "" for a restart, judged
    # by the job's own progress.
    judged_by: str
    judged_at: datetime
    # What the operator wrote when rejecting it.
    note: str = ""
    # A restart's: the step the job had reached, and the step its next attempt resumed at.
    step_reached: int | None = None
    resumed_step: int | None = None
    # Filled for the listed ones only (``action_precision``).
    cluster: Cluster | None = None
    recommendation: Recommendation | None = None

    @property
    def taken(self) -> bool:
        return self.reason != Unnecessary.REJECTED

    @property
    def judged_after_s(self) -> float:
        """From the action (or the rejection) to what judged it, in seconds."""
        return (self.judged_at - self.at).total_seconds()

    @property
    def evidence_line(self) -> str:
        """The line of the anomaly behind the recommendation, or ""."""
        recommendation = self.recommendation
        if recommendation is None or recommendation.anomaly is None:
            return ""
        return recommendation.anomaly.evidence_line


@dataclass
class ClusterPrecision:
    cluster: Cluster
    restarts: int = 0
    stops: int = 0
    drains: int = 0
    resumed_in_place: int = 0
    returned_within_an_hour: int = 0
    rejected: int = 0

    @property
    def taken(self) -> int:
        return self.restarts + self.stops + self.drains

    @property
    def unnecessary(self) -> int:
        """Actions taken and judged unnecessary; rejected ones were never taken."""
        return self.resumed_in_place + self.returned_within_an_hour

    @property
    def precision(self) -> float | None:
        """1 - unnecessary / taken; None when nothing was taken."""
        if not self.taken:
            return None
        return 1 - self.unnecessary / self.taken


@dataclass
class Precision:
    rows: list[ClusterPrecision]
    # Newest first, at most ``MAX_LISTED``; ``judged_total`` counts them all.
    judged: list[JudgedAction] = field(default_factory=list)
    judged_total: int = 0


@dataclass
class _Action:
    kind: str
    cluster_id: int
    workload_id: int | None
    at: datetime
    recommendation_id: int
    action: str
    actor: str
    note: str


def action_precision(
    clusters: Sequence[Cluster],
    *,
    since: datetime,
    until: datetime,
    listed: int = MAX_LISTED,
) -> Precision:
    """The precision of the actions carried out in ``(since, until]`` on each of ``clusters``
    (in their order), and the judged-unnecessary ones, newest first; at most six queries."""
    rows = {cluster.pk: ClusterPrecision(cluster) for cluster in clusters}
    if not rows:
        return Precision([])
    actions = _actions_and_rejections(list(rows), since=since, until=until)
    judged: list[JudgedAction] = []
    restarts: list[_Action] = []
    drains: list[_Action] = []
    for action in actions:
        row = rows[action.cluster_id]
        if action.kind == AuditKind.REJECTED:
            row.rejected += 1
            judged.append(_judged(action, Unnecessary.REJECTED, by=action.actor, at=action.at))
        elif action.action in RESTARTS:
            row.restarts += 1
            restarts.append(action)
        elif action.action == RecommendationAction.DRAIN:
            row.drains += 1
            drains.append(action)
        else:
            row.stops += 1
    for restart, resumed in _resumed_in_place(restarts, since=since, until=until):
        rows[restart.cluster_id].resumed_in_place += 1
        # Judged by the job's own progress, not by a person.
        item = _judged(restart, Unnecessary.RESUMED_IN_PLACE, by="", at=resumed.at)
        item.step_reached, item.resumed_step = resumed.step_reached, resumed.step
        judged.append(item)
    for drain, by, judged_at in _returned_within_an_hour(drains, since=since, until=until):
        rows[drain.cluster_id].returned_within_an_hour += 1
        judged.append(_judged(drain, Unnecessary.RETURNED_WITHIN_AN_HOUR, by=by, at=judged_at))
    judged.sort(key=lambda item: (item.at, item.recommendation_id), reverse=True)
    shown = judged[:listed]
    for item in shown:
        item.cluster = rows[item.cluster_id].cluster
    _attach_recommendations(shown)
    return Precision(list(rows.values()), shown, len(judged))


def _judged(action: _Action, reason: Unnecessary, *, by: str, at: datetime) -> JudgedAction:
    return JudgedAction(
        cluster_id=action.cluster_id,
        recommendation_id=action.recommendation_id,
        workload_id=action.workload_id,
        action=action.action,
        reason=reason,
        at=action.at,
        judged_by=by,
        judged_at=at,
        note=action.note,
    )


def _actions_and_rejections(
    cluster_ids: list[int], *, since: datetime, until: datetime
) -> list[_Action]:
    """Actions carried out and recommendations rejected in the range, once per recommendation,
    oldest first (one query)."""
    events = (
        AuditEvent.objects.filter(
            kind__in=[AuditKind.SCHEDULER_ACTION, AuditKind.REJECTED],
            cluster_id__in=cluster_ids,
            occurred_at__gt=since,
            occurred_at__lte=until,
        )
        .filter(payload__action__in=TAKEN_ACTIONS)
        .order_by("occurred_at", "id")
        .values_list(
            "kind",
            "cluster_id",
            "workload_id",
            "occurred_at",
            KT("payload__recommendation"),
            KT("payload__action"),
            "actor",
            KT("payload__note"),
        )
    )
    seen: set[tuple[str, int]] = set()
    actions = []
    for kind, cluster_id, workload_id, at, recommendation, action, actor, note in events:
        recommendation_id = _as_int(recommendation)
        if recommendation_id is None or (kind, recommendation_id) in seen:
            continue
        seen.add((kind, recommendation_id))
        actions.append(
            _Action(kind, cluster_id, workload_id, at, recommendation_id, action, actor, note or "")
        )
    return actions


@dataclass(frozen=True)
class _Resumed:
    at: datetime
    step: int
    step_reached: int


def _resumed_in_place(
    restarts: list[_Action], *, since: datetime, until: datetime
) -> Iterable[tuple[_Action, _Resumed]]:
    """The restarts after which the job's next attempt resumed at or past the step it had
    reached, with when it resumed (two queries).

    The step reached and the attempt restarted are those its ``dispatched`` events recorded
    before its commands ran; the attempt after it is the first later one that progressed.
    """
    if not restarts:
        return
    cluster_ids = sorted({restart.cluster_id for restart in restarts})
    wanted = {restart.recommendation_id for restart in restarts}
    reached: dict[int, tuple[int, int]] = {}  # recommendation → (attempt, step reached)
    dispatched = (
        AuditEvent.objects.filter(
            kind=AuditKind.DISPATCHED,
            cluster_id__in=cluster_ids,
            occurred_at__gt=since - DISPATCH_LEAD,
            occurred_at__lte=until,
            attempt__isnull=False,
        )
        .filter(payload__step_reached__isnull=False)
        .order_by()
        .values_list(KT("payload__recommendation"), "attempt", KT("payload__step_reached"))
    )
    for recommendation, attempt, step in dispatched:
        recommendation_id, step_reached = _as_int(recommendation), _as_int(step)
        if recommendation_id is None or recommendation_id not in wanted or step_reached is None:
            continue
        before = reached.get(recommendation_id)
        if before is not None:
            attempt, step_reached = min(attempt, before[0]), max(step_reached, before[1])
        reached[recommendation_id] = (attempt, step_reached)
    if not reached:
        return
    workloads = {r.workload_id for r in restarts if r.recommendation_id in reached}
    resumed: dict[int, list[tuple[int, datetime, int]]] = defaultdict(list)
    for workload_id, attempt, at, step in (
        AuditEvent.objects.filter(
            kind=AuditKind.PROGRESS_RESUMED,
            cluster_id__in=cluster_ids,
            occurred_at__gt=since - DISPATCH_LEAD,
            attempt__isnull=False,
        )
        .order_by()
        .values_list("workload_id", "attempt", "occurred_at", KT("payload__step"))
    ):
        first_step = _as_int(step)
        if workload_id in workloads and first_step is not None:
            resumed[workload_id].append((attempt, at, first_step))
    for restart in restarts:
        known = reached.get(restart.recommendation_id)
        if known is None or restart.workload_id is None:
            continue
        attempt, step_reached = known
        later = [entry for entry in resumed.get(restart.workload_id, []) if entry[0] > attempt]
        if not later:
            continue
        _, resumed_at, first_step = min(later)
        if first_step >= step_reached:
            yield restart, _Resumed(resumed_at, first_step, step_reached)


def _returned_within_an_hour(
    drains: list[_Action], *, since: datetime, until: datetime
) -> Iterable[tuple[_Action, str, datetime]]:
    """The drains an operator undid within ``RESUME_WITHIN``: returned the node to service or
    resumed it in the scheduler; with who and when (two queries)."""
    if not drains:
        return
    nodes = dict(
        Recommendation.objects.filter(
            pk__in=[drain.recommendation_id for drain in drains], node__isnull=False
        )
        .order_by()
        .values_list("pk", "node__name")
    )
    if not nodes:
        return
    undone: dict[tuple[int, str], list[tuple[datetime, str]]] = defaultdict(list)
    for cluster_id, node, at, actor in (
        AuditEvent.objects.filter(
            kind__in=[AuditKind.NODE_RETURNED, AuditKind.APPROVED],
            cluster_id__in=sorted({drain.cluster_id for drain in drains}),
            occurred_at__gt=since,
            occurred_at__lte=until + RESUME_WITHIN,
        )
        .filter(Q(kind=AuditKind.NODE_RETURNED) | Q(payload__action=RecommendationAction.RESUME))
        .order_by("occurred_at", "id")
        .values_list("cluster_id", KT("payload__node"), "occurred_at", "actor")
    ):
        if node:
            undone[(cluster_id, node)].append((at, actor))
    for drain in drains:
        node = nodes.get(drain.recommendation_id)
        if node is None:
            continue
        for at, actor in undone.get((drain.cluster_id, node), []):
            if drain.at < at <= drain.at + RESUME_WITHIN:
                yield drain, actor, at
                break


def _attach_recommendations(judged: list[JudgedAction]) -> None:
    """Give each listed action its recommendation, workload, node and anomaly (one query)."""
    if not judged:
        return
    recommendations = Recommendation.objects.select_related("workload", "node", "anomaly").in_bulk(
        [item.recommendation_id for item in judged]
    )
    for item in judged:
        item.recommendation = recommendations.get(item.recommendation_id)


def _as_int(value: Any) -> int | None:
    """A number read out of a payload as text (``KT``), or None when absent or not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
