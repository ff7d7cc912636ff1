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

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Count, F, Max, Min, Q
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
from recovery.models import Attempt, AuditEvent, Cluster, Policy, Recommendation
from recovery.read.controllers import CONTROLLER_SEEN_WITHIN, ago, controllers_of
from recovery.read.goodput import Distribution
from recovery.read.health import AttributionStatus, attribution_status

DEFAULT_DAYS = 30
MIN_DAYS = 1
MAX_DAYS = 365
# Decided recommendations (approved or rejected) a monitor-mode trial needs before its
# agreement says anything about the policy.
MONITOR_TRIAL_DECISIONS = 20
# Polls run every POLL_SECONDS; three missed rounds is more than a slow poll or a busy worker
# (as the Clusters page counts it).
STALE_AFTER_POLLS = 3
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
_CARRIED_OUT = frozenset({RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED})
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


class CheckState(StrEnum):
    OK = "ok"
    ATTENTION = "attention"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CheckItem:
    """One item of docs/deploy.md section 11, as the stored facts show it."""

    key: str
    title: str
    state: CheckState
    detail: str


@dataclass(frozen=True)
class PolicySettings:
    """The cluster's policy (no partition, the cluster's environment), as read for the report."""

    name: str
    # No enabled policy matches: the built-in defaults apply.
    built_in: bool
    blast_radius_percent: int
    blast_radius_window_minutes: int
    drain_nodes: bool
    max_attempts: int
    max_attempts_without_checkpoint: int
    stop_on_application_fault: bool
    exclusion_hours: int
    decision_timeout_seconds: int
    recommendation_ttl_minutes: int
    divergence_action: str
    straggler_action: str


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
    policy = _cluster_policy(cluster)
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
    checklist = _checklist(
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
                made_ready[r.pk] and r.status in _CARRIED_OUT for r in members
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


def _cluster_policy(cluster: Cluster) -> PolicySettings:
    """The enabled policy for the whole cluster: its own or every cluster's, for no partition
    and no environment or the cluster's, the most specific; the built-in defaults otherwise."""
    candidates = Policy.objects.filter(
        Q(cluster__isnull=True) | Q(cluster_id=cluster.pk),
        Q(environment="") | Q(environment=cluster.environment),
        enabled=True,
        partition="",
    )
    best = max(candidates, key=lambda p: (p.specificity, bool(p.cluster_id), p.pk), default=None)
    policy = best or Policy(name="built-in defaults")
    return PolicySettings(
        name=policy.name,
        built_in=best is None,
        blast_radius_percent=policy.blast_radius_percent,
        blast_radius_window_minutes=policy.blast_radius_window_minutes,
        drain_nodes=policy.drain_nodes,
        max_attempts=policy.max_attempts,
        max_attempts_without_checkpoint=policy.max_attempts_without_checkpoint,
        stop_on_application_fault=policy.stop_on_application_fault,
        exclusion_hours=policy.exclusion_hours,
        decision_timeout_seconds=policy.decision_timeout_seconds,
        recommendation_ttl_minutes=policy.recommendation_ttl_minutes,
        divergence_action=str(policy.divergence_action),
        straggler_action=str(policy.straggler_action),
    )


# --- the checklist ----------------------------------------------------------------------------


def _checklist(
    cluster: Cluster,
    report: Readiness,
    rows: Sequence[_Row],
    now: datetime,
    attribution: AttributionStatus,
    since: datetime,
    until: datetime,
) -> list[CheckItem]:
    days = _days_words(since, until)
    ok, attention, unknown = CheckState.OK, CheckState.ATTENTION, CheckState.UNKNOWN
    items = [
        CheckItem(
            "settings",
            "Settings load",
            unknown,
            "Check by hand: `manage.py check --deploy` passes with the production settings and "
            "/api/v1/health/ answers 200.",
        ),
        _scheduler_item(cluster, now),
    ]
    items += _controller_items(cluster, now)
    if cluster.has_canary:
        items.append(
            CheckItem(
                "canary",
                "Partitions allowlist (canary)",
                ok,
                f"Action mode reaches {cluster.action_scope_words()}; the rest of the cluster "
                "stays in monitor mode. The controller's --partitions is not stored: check it "
                "by hand.",
            )
        )
    else:
        items.append(
            CheckItem(
                "canary",
                "Partitions allowlist (canary)",
                attention,
                "No canary: action mode would reach every job. Set canary partitions or a "
                "share of jobs below 100 % to start with part of the cluster.",
            )
        )
    counts = report.counts
    decided = f"{counts.decided} decided ({counts.approved} approved, {counts.rejected} rejected)"
    items.append(
        CheckItem(
            "trial",
            "A monitor-mode trial",
            ok if counts.decided >= MONITOR_TRIAL_DECISIONS else attention,
            f"{decided} in the last {days}; the trial needs at least {MONITOR_TRIAL_DECISIONS}.",
        )
    )
    items.append(_carried_out_item(rows, days))
    items += _policy_items(report.policy)
    items.append(_drain_item(cluster, report.policy))
    items.append(
        CheckItem(
            "slurm_rights",
            "Slurm rights of the controller and the watchdog",
            unknown,
            "Check by hand: the controller's account has AdminLevel Operator (or is root or "
            "SlurmUser), and the control plane's connection account can `scontrol release` and "
            "set ExcNodeList on other users' jobs (section 8).",
        )
    )
    items.append(_hooks_item(cluster, since, until, now, days))
    items.append(_triggers_item())
    items.append(
        CheckItem(
            "backups",
            "Backups tested",
            unknown,
            "Check by hand: a dump restored into a scratch database, with its triggers present.",
        )
    )
    items.append(
        CheckItem(
            "alerting",
            "Alerting on /metrics",
            unknown,
            "Check by hand: alerts on wr_poll_error, wr_controller_seen_seconds, "
            "wr_action_failures_total and the others section 11 lists.",
        )
    )
    items.append(_attribution_item(cluster, attribution, since, until, now))
    items.append(
        CheckItem(
            "on_call",
            "Someone is on call",
            unknown,
            "Check by hand: blast-radius refusals, divergences, drains and jobs opted in with "
            "observe still wait for a person in action mode.",
        )
    )
    items.append(
        CheckItem(
            "way_back",
            "The way back is known",
            unknown,
            "Setting the mode back to monitor, or clearing the acknowledgement, makes new "
            "recommendations wait and stops those the policy made ready; stopping the "
            "controller stops everything. Make sure the people on call know.",
        )
    )
    return items


def _days_words(since: datetime, until: datetime) -> str:
    days = round((until - since).total_seconds() / 86400, 1)
    shown = int(days) if days == int(days) else days
    return f"{shown} day{'' if shown == 1 else 's'}"


def _scheduler_item(cluster: Cluster, now: datetime) -> CheckItem:
    title = "The scheduler reads cleanly"
    by_hand = (
        " Run `manage.py scheduler_check --cluster " + cluster.name + "` for unreadable fields."
    )
    polled_at, failed_at = cluster.last_polled_at, cluster.last_poll_error_at
    if cluster.last_poll_error and (
        polled_at is None or failed_at is None or failed_at > polled_at
    ):
        return CheckItem(
            "scheduler",
            title,
            CheckState.ATTENTION,
            f"The last poll failed: {cluster.last_poll_error[:200]}.",
        )
    if polled_at is None:
        return CheckItem(
            "scheduler", title, CheckState.ATTENTION, "Never polled: is the poller running?"
        )
    stale_after = timedelta(seconds=STALE_AFTER_POLLS * settings.POLL_SECONDS)
    if polled_at < now - stale_after:
        return CheckItem(
            "scheduler",
            title,
            CheckState.ATTENTION,
            f"Polling is late: last poll {ago(polled_at, now)}." + by_hand,
        )
    return CheckItem(
        "scheduler",
        title,
        CheckState.OK,
        f"Last polled {ago(polled_at, now)} without error." + by_hand,
    )


def _controller_items(cluster: Cluster, now: datetime) -> list[CheckItem]:
    seen = controllers_of([cluster], now)[cluster.pk]
    minutes = int(CONTROLLER_SEEN_WITHIN.total_seconds() // 60)
    names = ", ".join(c.name for c in seen.controllers[:5])
    if seen.controllers:
        tokens = CheckItem(
            "controller_tokens",
            "Controller tokens scoped to this cluster",
            CheckState.OK,
            f"{len(seen.controllers)} unrevoked token{'s' if len(seen.controllers) > 1 else ''} "
            f"({names}), each valid for {cluster.name} only. Check the controller's identity "
            "line in its output by hand.",
        )
    else:
        tokens = CheckItem(
            "controller_tokens",
            "Controller tokens scoped to this cluster",
            CheckState.ATTENTION,
            f"No unrevoked controller token is issued for {cluster.name}.",
        )
    if seen.recent:
        last = seen.last_seen
        when = ago(last, now) if last else ""
        calling = CheckItem(
            "controller_seen",
            f"A controller called in within {minutes} minutes",
            CheckState.OK,
            f"Last call {when}.",
        )
    else:
        calling = CheckItem(
            "controller_seen",
            f"A controller called in within {minutes} minutes",
            CheckState.ATTENTION,
            seen.wait_warning,
        )
    return [tokens, calling]


def _carried_out_item(rows: Sequence[_Row], days: str) -> CheckItem:
    title = "Approved recommendations carried out"
    approved = [r for r in rows if r.approved_by]
    carried = sum(r.status in _CARRIED_OUT for r in approved)
    failed = sum(r.status == RecommendationStatus.FAILED for r in approved)
    abandoned = sum(r.disposition == Disposition.ABANDONED for r in approved)
    converged = sum(r.disposition == Disposition.CONVERGED for r in approved)
    figures = (
        f"Of {len(approved)} approved in the last {days}: {carried} carried out, "
        f"{converged} converged, {failed} failed, {abandoned} abandoned."
    )
    if failed or abandoned:
        return CheckItem("carried_out", title, CheckState.ATTENTION, figures)
    if not carried:
        return CheckItem(
            "carried_out",
            title,
            CheckState.ATTENTION,
            figures + " Nothing approved was carried out yet: the controller's Slurm rights "
            "are unproven.",
        )
    return CheckItem("carried_out", title, CheckState.OK, figures)


def _policy_items(policy: PolicySettings) -> list[CheckItem]:
    source = (
        "No enabled policy matches the whole cluster: the built-in defaults apply"
        if policy.built_in
        else f"Policy {policy.name}"
    )
    radius = (
        f"{policy.blast_radius_percent} % of the cluster over "
        f"{policy.blast_radius_window_minutes} minutes"
    )
    if policy.built_in:
        blast = CheckItem(
            "blast_radius",
            "Blast radius",
            CheckState.ATTENTION,
            f"{source} ({radius}): write the cluster's policy and agree its values.",
        )
    elif policy.blast_radius_percent >= 100:
        blast = CheckItem(
            "blast_radius",
            "Blast radius",
            CheckState.ATTENTION,
            f"{source}: {radius}, which guards nothing.",
        )
    else:
        blast = CheckItem(
            "blast_radius",
            "Blast radius",
            CheckState.OK,
            f"{source}: at most {radius} is excluded, restarted or drained before a person "
            "decides.",
        )
    rules = CheckItem(
        "stop_rules",
        "Retry budgets and stop rules",
        CheckState.UNKNOWN,
        f"{source}: max_attempts {policy.max_attempts}, without a checkpoint "
        f"{policy.max_attempts_without_checkpoint}, stop on application fault "
        f"{'on' if policy.stop_on_application_fault else 'off'}, exclusion "
        f"{policy.exclusion_hours} h, decision timeout {policy.decision_timeout_seconds} s, "
        f"TTL {policy.recommendation_ttl_minutes} min, divergence {policy.divergence_action}, "
        f"straggler {policy.straggler_action}. Read and agree them by hand.",
    )
    return [blast, rules]


def _drain_item(cluster: Cluster, policy: PolicySettings) -> CheckItem:
    title = "Drains"
    by_hand = Recommendation.objects.filter(
        workload__cluster_id=cluster.pk, action=RecommendationAction.DRAIN
    ).exclude(approved_by="")
    approved = by_hand.count()
    recommends = (
        "the policy recommends drains"
        if policy.drain_nodes
        else "the policy recommends no drains (drain_nodes off)"
    )
    if not cluster.drain_automatically:
        return CheckItem(
            "drains",
            title,
            CheckState.OK,
            f"drain_automatically is off: every drain waits for an operator; {recommends}; "
            f"{approved} drain{'s' if approved != 1 else ''} approved by hand so far.",
        )
    if not approved:
        return CheckItem(
            "drains",
            title,
            CheckState.ATTENTION,
            "drain_automatically is on, but no drain has been approved by hand yet: turn it "
            f"off until drains have been approved for a while; {recommends}.",
        )
    return CheckItem(
        "drains",
        title,
        CheckState.OK,
        f"drain_automatically is on after {approved} drain{'s' if approved != 1 else ''} "
        f"approved by hand; {recommends}.",
    )


def _hooks_item(
    cluster: Cluster, since: datetime, until: datetime, now: datetime, days: str
) -> CheckItem:
    title = "Scheduler hooks installed"
    hooks = AuditEvent.objects.filter(
        cluster_id=cluster.pk,
        kind=AuditKind.SCHEDULER_HOOK,
        occurred_at__gte=since,
        occurred_at__lt=until,
    ).aggregate(n=Count("id"), last=Max("occurred_at"))
    if hooks["n"]:
        return CheckItem(
            "hooks",
            title,
            CheckState.OK,
            f"{hooks['n']} scheduler_hook event{'s' if hooks['n'] != 1 else ''} in the last "
            f"{days}, the latest {ago(hooks['last'], now)}.",
        )
    return CheckItem(
        "hooks",
        title,
        CheckState.ATTENTION,
        f"No scheduler_hook event in the last {days}: check `strigger --get --node --down` "
        "lists node-down.sh and EpilogSlurmctld is set.",
    )


# The append-only triggers migration 0002 creates on MySQL and MariaDB.
_TRIGGER_OPERATIONS = frozenset({"UPDATE", "DELETE"})


def _triggers_item() -> CheckItem:
    title = "Audit trail triggers present"
    grants = " Check by hand that the runtime account has no DROP (SHOW GRANTS)."
    if connection.vendor != "mysql":
        return CheckItem(
            "audit_triggers",
            title,
            CheckState.UNKNOWN,
            f"The database is {connection.vendor}: the triggers exist on MySQL and MariaDB only."
            + grants,
        )
    table = AuditEvent._meta.db_table
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EVENT_MANIPULATION FROM information_schema.TRIGGERS "
                "WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = %s",
                [table],
            )
            found = {str(row[0]).upper() for row in cursor.fetchall()}
    except DatabaseError as exc:
        return CheckItem(
            "audit_triggers", title, CheckState.UNKNOWN, f"Could not read them: {exc}." + grants
        )
    missing = sorted(_TRIGGER_OPERATIONS - found)
    if missing:
        return CheckItem(
            "audit_triggers",
            title,
            CheckState.ATTENTION,
            f"No trigger refuses {' or '.join(missing)} on {table}." + grants,
        )
    return CheckItem(
        "audit_triggers",
        title,
        CheckState.OK,
        f"UPDATE and DELETE on {table} are refused by triggers." + grants,
    )


def _attribution_item(
    cluster: Cluster,
    status: AttributionStatus,
    since: datetime,
    until: datetime,
    now: datetime,
) -> CheckItem:
    title = "Attribution"
    degraded = (
        AuditEvent.objects.filter(
            cluster_id=cluster.pk,
            kind=AuditKind.ATTRIBUTION_DEGRADED,
            occurred_at__gte=since,
            occurred_at__lt=until,
        )
        .order_by("-occurred_at")
        .values_list("occurred_at", flat=True)
        .first()
    )
    if status.degraded:
        if not status.configured:
            detail = (
                "No external attribution provider: failures are attributed by built-in rules "
                "only. Configure WR_ATTRIBUTION_URL, or record that built-in rules are accepted."
            )
        else:
            detail = (
                f"Provider {status.provider} is failing ({status.reason}): built-in rules only."
            )
        return CheckItem("attribution", title, CheckState.ATTENTION, detail)
    if degraded is not None:
        return CheckItem(
            "attribution",
            title,
            CheckState.ATTENTION,
            f"Provider {status.provider} answers now, but was unavailable {ago(degraded, now)}.",
        )
    return CheckItem(
        "attribution",
        title,
        CheckState.OK,
        f"Provider {status.provider}: {status.reason}; not degraded in the window.",
    )
