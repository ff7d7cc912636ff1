"""Is a cluster ready to leave monitor mode? Its history of recommendations, and a checklist.

The report covers the policy's restarts, stops and drains recommended on one cluster in a
window (the last ``DEFAULT_DAYS`` days unless told): how each was decided, how long approvals
took and what the wait cost in node-hours, how often operators agreed with the policy per action
and per failure category, and, where the cluster has a canary, the canary and the rest of the
cluster side by side. The checklist follows docs/deploy.md section 11 ("Before switching a
cluster from monitor to action mode"); each item is ``ok`` or ``attention`` from facts stored
in the database, or ``unknown`` with what to check by hand. Nothing is ``ok`` by default.

Restarts, stops and drains are only ever made by the policy (a resume is a person's, and
``Recommendation.decided_by`` is overwritten by the person who approves or rejects), so the
report selects them by action. A superseded recommendation was replaced by a sharper one for
the same failure, which is counted instead.

Every figure comes from a fixed number of queries (about a dozen) whatever the number of
recommendations: light rows of the recommendations in the window, the window's ``recommended``
and controllers' ``dispatched`` events grouped in the database, and one query per checklist
fact. None runs per row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from django.db.models import F, Min
from django.db.models.fields.json import KT
from django.utils import timezone

from recovery.audit.actors import CONTROLLER_PREFIX, Actor
from recovery.choices import (
    AuditKind,
    Disposition,
    FailureCategory,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.models import Attempt, AuditEvent, Cluster, Recommendation
from recovery.read.goodput import Distribution
from recovery.read.readiness_checklist import (
    CARRIED_OUT,
    CheckItem,
    CheckState,
    PolicySettings,
    build_checklist,
    cluster_policy,
)
from recovery.sources.provider_status import AttributionStatus, attribution_status

DEFAULT_DAYS = 30
MIN_DAYS = 1
MAX_DAYS = 365
# A ``recommended`` event is written in the transaction that creates its recommendation; a
# little slack at the window's edges finds the events of rows created right at them.
_EVENT_SLACK = timedelta(minutes=1)

# What the policy recommends for a job or a node: the actions this report is about.
POLICY_ACTIONS = (
    RecommendationAction.RESTART,
    RecommendationAction.RESTART_EXCLUDING,
    RecommendationAction.STOP,
    RecommendationAction.DRAIN,
)
# The job's actions, whose wait for an approval holds the job's nodes.
JOB_ACTIONS = frozenset(
    {
        RecommendationAction.RESTART,
        RecommendationAction.RESTART_EXCLUDING,
        RecommendationAction.STOP,
    }
)
_UNDECIDED = frozenset({RecommendationStatus.PROPOSED, RecommendationStatus.AWAITING_APPROVAL})
# Statuses a recommendation reaches only once it was ready (approved or made ready).
_WAS_READY = frozenset(
    {
        RecommendationStatus.READY,
        RecommendationStatus.CLAIMED,
        RecommendationStatus.EXECUTED,
        RecommendationStatus.SKIPPED,
        RecommendationStatus.FAILED,
    }
)

SIZE_UNIT = "node-hours"
SIZE_COUNTED_AS = (
    "Job size is the number of nodes of the attempt the recommendation was for (Attempt.nodes): "
    "GPU counts per job are not recorded, so the cost is in node-hours; multiply by the GPUs "
    "per node for GPU-hours. A recommendation whose attempt lists no nodes is not counted."
)
UNCATEGORISED = "uncategorised"


class DaysError(ValueError):
    """A ``days`` parameter that is not a whole number of days within MIN_DAYS..MAX_DAYS."""


def parse_days(value: str | None) -> int:
    """The number of days a request asks for (DEFAULT_DAYS when absent), or DaysError."""
    if value is None or value == "":
        return DEFAULT_DAYS
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 4):
        raise DaysError(f"days must be a whole number from {MIN_DAYS} to {MAX_DAYS}.")
    days = int(text)
    if not MIN_DAYS <= days <= MAX_DAYS:
        raise DaysError(f"days must be from {MIN_DAYS} to {MAX_DAYS}, not {days}.")
    return days


@dataclass(frozen=True)
class DecisionCounts:
    """Each recommendation counted once, by how it was decided."""

    recommended: int = 0
    # Approved by an operator (whatever became of it after).
    approved: int = 0
    rejected: int = 0
    # Expired before anyone decided.
    expired: int = 0
    # Proposed or awaiting approval now.
    awaiting: int = 0
    # Made ready by the policy itself: the cluster acted automatically on it.
    ready_without_approval: int = 0
    # Of the approved and the made-ready: expired before a controller carried them out.
    expired_unclaimed: int = 0

    @property
    def decided(self) -> int:
        return self.approved + self.rejected


@dataclass(frozen=True)
class ApprovalCost:
    """What waiting for approvals held: job size times time to approval, summed."""

    unit: str
    size_counted_as: str
    total: float
    # Approved restarts and stops whose size is known, and those whose is not.
    counted: int
    size_unknown: int


@dataclass(frozen=True)
class Agreement:
    """How often operators agreed with the policy on one action or failure category."""

    key: str
    label: str
    approved: int
    rejected: int

    @property
    def decided(self) -> int:
        return self.approved + self.rejected

    @property
    def rate(self) -> float | None:
        """approved / (approved + rejected), or None when nothing was decided."""
        return self.approved / self.decided if self.decided else None


class Half(StrEnum):
    CANARY = "canary"
    MONITOR = "monitor"


@dataclass(frozen=True)
class HalfFigures:
    """The canary (the part of the cluster action mode reaches) or the rest, over the window."""

    half: Half
    label: str
    recommended: int
    approved: int
    rejected: int
    carried_out_without_approval: int
    # Recommendation → a controller's first ``dispatched`` event for it.
    to_dispatch: Distribution
    converged: int
    abandoned: int


@dataclass(frozen=True)
class Readiness:
    """The readiness report of one cluster over ``since``..``until``, as of ``now``."""

    cluster_id: int
    cluster_name: str
    since: datetime
    until: datetime
    now: datetime
    mode: str
    acknowledge_scheduler_actions: bool
    drain_automatically: bool
    acts_automatically: bool
    action_scope: str
    has_canary: bool
    counts: DecisionCounts
    time_to_approval: Distribution
    approval_cost: ApprovalCost
    agreement_by_action: tuple[Agreement, ...]
    agreement_by_category: tuple[Agreement, ...]
    # Empty when the cluster has no canary and no event shows a job outside one.
    halves: tuple[HalfFigures, ...]
    policy: PolicySettings
    checklist: tuple[CheckItem, ...] = field(default_factory=tuple)

    @property
    def days(self) -> float:
        return (self.until - self.since).total_seconds() / 86400

    @property
    def attention(self) -> int:
        return sum(item.state == CheckState.ATTENTION for item in self.checklist)

    @property
    def unknown(self) -> int:
        return sum(item.state == CheckState.UNKNOWN for item in self.checklist)


@dataclass(frozen=True)
class _Row:
    pk: int
    action: str
    status: str
    approved_by: str
    created_at: datetime
    decided_at: datetime | None
    disposition: str
    category: str
    partition: str
    canary_bucket: int


def readiness_of(
    cluster: Cluster,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
    attribution: AttributionStatus | None = None,
) -> Readiness:
    """The readiness report of ``cluster``: recommendations created in ``since``..``until``
    (default: the DEFAULT_DAYS days up to ``now``) and the checklist as of ``now``.

    ``attribution``: the provider's status when the caller has it (read once otherwise).
    """
    now = now or timezone.now()
    until = until or now
    since = since or until - timedelta(days=DEFAULT_DAYS)
    rows = _rows(cluster, since, until)
    events = _recommended_events(cluster, since, until)
    made_ready = {
        row.pk: _made_ready_by_policy(row, events.get(row.pk, {}).get("would_have_done"))
        for row in rows
    }
    approval_at = _approval_times(cluster, rows, since)
    delays = {
        row.pk: (approval_at[row.pk] - row.created_at).total_seconds()
        for row in rows
        if row.approved_by and row.pk in approval_at
    }
    counts = _counts(rows, made_ready)
    # A job recorded outside the part action mode reaches: the cluster had a canary then.
    had_canary = any(e.get("in_action_scope") is False for e in events.values())
    halves: tuple[HalfFigures, ...] = ()
    if cluster.has_canary or had_canary:
        halves = _halves(cluster, rows, events, made_ready, since)
    policy = cluster_policy(cluster)
    report = Readiness(
        cluster_id=cluster.pk,
        cluster_name=cluster.name,
        since=since,
        until=until,
        now=now,
        mode=str(cluster.mode),
        acknowledge_scheduler_actions=bool(cluster.acknowledge_scheduler_actions),
        drain_automatically=bool(cluster.drain_automatically),
        acts_automatically=cluster.acts_automatically,
        action_scope=cluster.action_scope_words(),
        has_canary=cluster.has_canary,
        counts=counts,
        time_to_approval=Distribution.of(delays.values()),
        approval_cost=_approval_cost(rows, delays),
        agreement_by_action=_agreement(rows, lambda r: r.action, _action_label),
        agreement_by_category=_agreement(rows, lambda r: r.category, _category_label),
        halves=halves,
        policy=policy,
    )
    checklist = build_checklist(
        cluster, report, rows, now, attribution or attribution_status(), since, until
    )
    return replace(report, checklist=tuple(checklist))


def readiness_over_days(cluster: Cluster, days: int, *, now: datetime | None = None) -> Readiness:
    """``readiness_of`` over the ``days`` days up to ``now``."""
    now = now or timezone.now()
    return readiness_of(cluster, since=now - timedelta(days=days), until=now, now=now)


# --- the recommendations and their events ---------------------------------------------------


def _rows(cluster: Cluster, since: datetime, until: datetime) -> list[_Row]:
    values = (
        Recommendation.objects.filter(
            workload__cluster_id=cluster.pk,
            created_at__gte=since,
            created_at__lt=until,
            action__in=POLICY_ACTIONS,
        )
        .exclude(status=RecommendationStatus.SUPERSEDED)
        .order_by()
        .values_list(
            "pk",
            "action",
            "status",
            "approved_by",
            "created_at",
            "decided_at",
            "disposition",
            "anomaly__category",  # null without an anomaly
            "workload__partition",
            "workload__canary_bucket",
        )
    )
    return [_Row(*row[:7], row[7] or "", *row[8:]) for row in values]


def _recommended_events(
    cluster: Cluster, since: datetime, until: datetime
) -> dict[int, dict[str, bool | None]]:
    """Recommendation id → what its ``recommended`` event said: ``in_action_scope`` (absent
    from events written before the canary existed) and ``would_have_done``."""
    found: dict[int, dict[str, bool | None]] = {}
    events = (
        AuditEvent.objects.filter(
            cluster_id=cluster.pk,
            kind=AuditKind.RECOMMENDED,
            actor=Actor.POLICY,
            occurred_at__gte=since - _EVENT_SLACK,
            occurred_at__lt=until + _EVENT_SLACK,
        )
        .order_by()
        .values_list(
            KT("payload__recommendation"),
            KT("payload__in_action_scope"),
            KT("payload__would_have_done"),
        )
    )
    for recommendation, in_scope, would_have_done in events:
        pk = _as_int(recommendation)
        if pk is not None:
            found[pk] = {
                "in_action_scope": _as_bool(in_scope),
                "would_have_done": _as_bool(would_have_done),
            }
    return found


def _made_ready_by_policy(row: _Row, would_have_done: bool | None) -> bool:
    """Whether the policy made ``row`` ready without a person: its event said it would not
    wait (``would_have_done`` false), or, without the event, it went ahead unapproved."""
    if row.approved_by:
        return False
    if would_have_done is not None:
        return not would_have_done
    return row.status in _WAS_READY


def _approval_times(cluster: Cluster, rows: Sequence[_Row], since: datetime) -> dict[int, datetime]:
    """Recommendation id → when an operator approved it: ``decided_at``, or the ``approved``
    event's time for a row without one (one grouped query, only when such a row exists)."""
    times = {row.pk: row.decided_at for row in rows if row.approved_by and row.decided_at}
    missing = {row.pk for row in rows if row.approved_by and not row.decided_at}
    if missing:
        for recommendation, at in _first_events(cluster, AuditKind.APPROVED, since):
            if recommendation in missing:
                times[recommendation] = at
    return times


def _first_events(cluster: Cluster, kind: str, since: datetime) -> list[tuple[int, datetime]]:
    """(recommendation id, its first event of ``kind`` since ``since``), grouped in the
    database."""
    events = AuditEvent.objects.filter(
        cluster_id=cluster.pk, kind=kind, occurred_at__gte=since - _EVENT_SLACK
    )
    if kind == AuditKind.DISPATCHED:
        # The watchdog's releases are dispatched too, for no recommendation.
        events = events.filter(actor__startswith=CONTROLLER_PREFIX)
    grouped = (
        events.order_by()
        .annotate(recommendation=KT("payload__recommendation"))
        .values("recommendation")
        .annotate(first=Min("occurred_at"))
        .values_list("recommendation", "first")
    )
    return [
        (pk, first)
        for recommendation, first in grouped
        if (pk := _as_int(recommendation)) is not None
    ]


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _as_bool(value: object) -> bool | None:
    """A JSON boolean as the database hands it back: "true"/"false" (MySQL's JSON_UNQUOTE),
    1/0 (SQLite) or a bool; None when absent or anything else."""
    if value in (True, 1, "true", "1"):
        return True
    if value in (False, 0, "false", "0"):
        return False
    return None


# --- figures ----------------------------------------------------------------------------------


def _counts(rows: Sequence[_Row], made_ready: Mapping[int, bool]) -> DecisionCounts:
    tally: Counter[str] = Counter()
    for row in rows:
        if row.approved_by:
            tally["approved"] += 1
        elif row.status == RecommendationStatus.REJECTED:
            tally["rejected"] += 1
        elif made_ready[row.pk]:
            tally["ready_without_approval"] += 1
        elif row.status in _UNDECIDED:
            tally["awaiting"] += 1
        elif row.status == RecommendationStatus.EXPIRED:
            tally["expired"] += 1
        else:
            # Ready without approval or the policy's word (an old row): made ready all the same.
            tally["ready_without_approval"] += 1
        if row.status == RecommendationStatus.EXPIRED and (row.approved_by or made_ready[row.pk]):
            tally["expired_unclaimed"] += 1
    return DecisionCounts(recommended=len(rows), **tally)


def _approval_cost(rows: Sequence[_Row], delays: Mapping[int, float]) -> ApprovalCost:
    """Node-hours: per approved restart or stop, its attempt's nodes times its time to approval.

    The node lists are read for those recommendations only (two queries at most): the one
    they name, or the workload's current attempt for one recorded without an attempt."""
    wanted = [row.pk for row in rows if row.action in JOB_ACTIONS and row.pk in delays]
    sizes: dict[int, int] = {}
    without_attempt: dict[int, int] = {}  # recommendation → workload
    for pk, nodes, workload_id, has_attempt in (
        Recommendation.objects.filter(pk__in=wanted)
        .order_by()
        .values_list("pk", "attempt__nodes", "workload_id", "attempt_id")
    ):
        if has_attempt is None:
            without_attempt[pk] = workload_id
        elif isinstance(nodes, list) and nodes:
            sizes[pk] = len(nodes)
    if without_attempt:
        current = dict(
            Attempt.objects.filter(
                workload_id__in=set(without_attempt.values()),
                number=F("workload__current_attempt"),
            )
            .order_by()
            .values_list("workload_id", "nodes")
        )
        for pk, workload_id in without_attempt.items():
            nodes = current.get(workload_id)
            if isinstance(nodes, list) and nodes:
                sizes[pk] = len(nodes)
    total = sum(sizes[pk] * delays[pk] / 3600 for pk in sizes)
    return ApprovalCost(
        unit=SIZE_UNIT,
        size_counted_as=SIZE_COUNTED_AS,
        total=round(total, 2),
        counted=len(sizes),
        size_unknown=len(wanted) - len(sizes),
    )


def _agreement(
    rows: Sequence[_Row], key_of: Callable[[_Row], str], label_of: Callable[[str], str]
) -> tuple[Agreement, ...]:
    approved: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    for row in rows:
        key = key_of(row) or UNCATEGORISED
        if row.approved_by:
            approved[key] += 1
        elif row.status == RecommendationStatus.REJECTED:
            rejected[key] += 1
    keys = sorted(set(approved) | set(rejected), key=lambda k: (-(approved[k] + rejected[k]), k))
    return tuple(Agreement(k, label_of(k), approved[k], rejected[k]) for k in keys)


def _action_label(value: str) -> str:
    return str(dict(RecommendationAction.choices).get(value, value))


def _category_label(value: str) -> str:
    if value == UNCATEGORISED:
        return "No category"
    return str(dict(FailureCategory.choices).get(value, value))


def _halves(
    cluster: Cluster,
    rows: Sequence[_Row],
    events: Mapping[int, Mapping[str, bool | None]],
    made_ready: Mapping[int, bool],
    since: datetime,
) -> tuple[HalfFigures, ...]:
    """The canary and the rest: each recommendation in the half its event recorded, or, for
    events written before that was recorded, the half the current setting puts its job in."""
    dispatched = dict(_first_events(cluster, AuditKind.DISPATCHED, since))
    grouped: dict[Half, list[_Row]] = {Half.CANARY: [], Half.MONITOR: []}
    for row in rows:
        in_scope = events.get(row.pk, {}).get("in_action_scope")
        if in_scope is None:
            in_scope = cluster.in_action_scope(row.partition, row.canary_bucket)
        grouped[Half.CANARY if in_scope else Half.MONITOR].append(row)
    labels = {
        Half.CANARY: (
            f"Canary ({cluster.action_scope_words()})"
            if cluster.has_canary
            else "In the canary when recommended (none now)"
        ),
        Half.MONITOR: "The rest of the cluster (monitor mode)",
    }
    return tuple(
        HalfFigures(
            half=half,
            label=labels[half],
            recommended=len(members),
            approved=sum(bool(r.approved_by) for r in members),
            rejected=sum(
                not r.approved_by and r.status == RecommendationStatus.REJECTED for r in members
            ),
            carried_out_without_approval=sum(
                made_ready[r.pk] and r.status in CARRIED_OUT for r in members
            ),
            to_dispatch=Distribution.of(
                (dispatched[r.pk] - r.created_at).total_seconds() if r.pk in dispatched else None
                for r in members
            ),
            converged=sum(r.disposition == Disposition.CONVERGED for r in members),
            abandoned=sum(r.disposition == Disposition.ABANDONED for r in members),
        )
        for half, members in grouped.items()
    )
