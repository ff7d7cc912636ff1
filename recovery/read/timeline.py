"""The workload timeline's read model: attempts, anomalies, decisions and training progress.

Gathers, as plain data, what the Console's timeline figure (``console/timeline.py``) draws on one
time axis: the workload's newest attempts with their anomalies, its recommendations, the audit
events of decisions and scheduler actions, and the training step over time with checkpoints and
the failures of the goodput figures.

Every query is bounded and reads only the workload's own rows through indexed filters, so the
figure stays small (a few thousand points at most) however long the workload's history is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import F, Max, Window
from django.db.models.functions import DenseRank, Mod, RowNumber
from django.utils import timezone

from recovery.choices import (
    AuditKind,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    ProgressSample,
    Recommendation,
    Workload,
)
from recovery.read.goodput import Failure, workload_goodput

# Bounds: the figure must stay small however long the workload has been running.
MAX_ATTEMPT_ROWS = 40
MAX_ANOMALIES = 500
MAX_RECOMMENDATIONS = 200
MAX_DECISION_EVENTS = 500
MAX_PROGRESS_EVENTS = 2000
MAX_PROGRESS_POINTS = 2000

# What operators, controllers and the watchdog did, drawn on the decisions row.
DECISION_EVENT_KINDS = (
    AuditKind.APPROVED,
    AuditKind.REJECTED,
    AuditKind.SCHEDULER_ACTION,
    AuditKind.ACTION_SKIPPED,
    AuditKind.ACTION_FAILED,
    AuditKind.ACTION_RETRY,
    AuditKind.REPORT_REFUSED,
    AuditKind.WATCHDOG_RELEASED,
    AuditKind.STOPPED,
)
PROGRESS_EVENT_KINDS = (
    AuditKind.CHECKPOINT_SAVED,
    AuditKind.PROGRESS_RESUMED,
    AuditKind.TRAINING_COMPLETED,
)

FINISHED_STATES = {
    WorkloadState.COMPLETED,
    WorkloadState.FAILED,
    WorkloadState.CANCELLED,
    WorkloadState.STOPPED,
}


@dataclass(frozen=True)
class ProgressPoint:
    """The step training had reached at a time, from a progress sample or an audit event."""

    at: datetime
    attempt: int | None
    step: int
    source: str


@dataclass
class TimelineData:
    """Everything the figure shows, read with bounded queries."""

    workload: Workload
    now: datetime
    attempts: list[Attempt]
    older_attempts_hidden: bool
    anomalies: list[Anomaly]
    recommendations: list[Recommendation]
    decision_events: list[AuditEvent]
    progress_events: list[AuditEvent]
    samples: list[ProgressPoint]
    samples_downsampled: bool
    failures: list[Failure] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.workload.state in FINISHED_STATES

    @property
    def chart_end(self) -> datetime:
        """Where the time axis ends: now while the workload runs, else its last attempt's end."""
        if not self.finished:
            return self.now
        ends = [a.ended_at for a in self.attempts if a.ended_at is not None]
        return max(ends, default=self.now)

    @property
    def checkpoint_steps(self) -> dict[datetime, int]:
        """The step each checkpoint saved, by the time it was saved (when the event says)."""
        return {
            e.occurred_at: step
            for e in self.progress_events
            if e.kind == AuditKind.CHECKPOINT_SAVED and (step := event_step(e)) is not None
        }


def load_timeline(
    workload: Workload,
    *,
    now: datetime | None = None,
    failures: Sequence[Failure] | None = None,
) -> TimelineData:
    """What the timeline shows of ``workload``, read with bounded queries.

    ``failures`` are the goodput figures' failures when the caller has them already; they are
    computed otherwise.
    """
    now = now or timezone.now()
    if failures is None:
        failures = workload_goodput(workload, now=now).failures
    attempts = list(workload.attempts.order_by("-number")[: MAX_ATTEMPT_ROWS + 1])
    older_attempts_hidden = len(attempts) > MAX_ATTEMPT_ROWS
    attempts = sorted(attempts[:MAX_ATTEMPT_ROWS], key=lambda a: a.number)
    anomalies = list(
        Anomaly.objects.filter(workload=workload)
        .select_related("attempt")
        .only(
            "kind",
            "category",
            "attribution",
            "severity",
            "signature",
            "evidence_line",
            "implicated_nodes",
            "occurrences",
            "folded_findings",
            "evidence_source",
            "evidence_trust",
            "evidence_at",
            "detected_at",
            "confirmation",
            "confirmation_at",
            "confirmation_reason",
            "attempt__number",
        )
        .order_by("-detected_at", "-id")[:MAX_ANOMALIES]
    )
    recommendations = list(
        Recommendation.objects.filter(workload=workload)
        .only(
            "action",
            "status",
            "excluded_nodes",
            "reason",
            "decided_by",
            "created_at",
            "anomaly_id",
        )
        .order_by("-created_at", "-id")[:MAX_RECOMMENDATIONS]
    )
    decision_events = _newest_events(workload, DECISION_EVENT_KINDS, MAX_DECISION_EVENTS)
    progress_events = _newest_events(workload, PROGRESS_EVENT_KINDS, MAX_PROGRESS_EVENTS)
    samples, downsampled = progress_samples(workload)
    return TimelineData(
        workload=workload,
        now=now,
        attempts=attempts,
        older_attempts_hidden=older_attempts_hidden,
        anomalies=anomalies,
        recommendations=recommendations,
        decision_events=decision_events,
        progress_events=progress_events,
        samples=samples,
        samples_downsampled=downsampled,
        failures=list(failures)[-MAX_ATTEMPT_ROWS:],
    )


def anomaly_attempt_number(anomaly: Anomaly, attempts: Sequence[Attempt]) -> int | None:
    """The attempt an anomaly belongs to, among ``attempts`` (oldest first) when not recorded."""
    if anomaly.attempt is not None:
        return anomaly.attempt.number
    # No attempt recorded: the attempt that was running when it was detected.
    for attempt in reversed(attempts):
        if attempt.started_at is not None and attempt.started_at <= anomaly.detected_at:
            return attempt.number
    return None


def _newest_events(workload: Workload, kinds: Iterable[str], limit: int) -> list[AuditEvent]:
    events = AuditEvent.objects.filter(workload=workload, kind__in=list(kinds)).order_by(
        "-occurred_at", "-id"
    )[:limit]
    return sorted(events, key=lambda e: (e.occurred_at, e.pk))


# ---------- progress ----------


def progress_samples(
    workload: Workload, *, limit: int = MAX_PROGRESS_POINTS
) -> tuple[list[ProgressPoint], bool]:
    """The furthest step any rank had reached at each sample time, per attempt, oldest first.

    At most ``limit`` points: when there are more sample times, every n-th is kept (evenly over
    the workload's sample times), and the database does the thinning. Returns the points and
    whether they were thinned.
    """
    samples = ProgressSample.objects.filter(workload=workload)
    total = samples.values("attempt", "at").distinct().count()
    if total == 0:
        return [], False
    stride = max(-(-total // max(limit, 1)), 1)
    # Window functions rather than GROUP BY: the database cannot thin grouped rows by their
    # position in one query. Each sample time keeps its first row, carrying the furthest step.
    same_time = [F("attempt"), F("at")]
    per_time = samples.annotate(
        top_step=Window(Max("step"), partition_by=same_time),
        nth_at_time=Window(RowNumber(), partition_by=same_time, order_by=F("id").asc()),
        time_index=Window(DenseRank(), order_by=[F("at").asc(), F("attempt").asc()]),
    ).filter(nth_at_time=1)
    if stride > 1:
        per_time = per_time.annotate(thinning=Mod(F("time_index") - 1, stride)).filter(thinning=0)
    rows = per_time.order_by("at", "attempt").values_list("at", "attempt", "top_step")[:limit]
    points = [
        ProgressPoint(at=moment, attempt=attempt, step=step, source="sample")
        for moment, attempt, step in rows
    ]
    return points, stride > 1


def event_step(event: AuditEvent) -> int | None:
    """The step a checkpoint, restart or completion event recorded, if it has one."""
    payload = event.payload if isinstance(event.payload, dict) else {}
    for key in ("step", "final_step"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def progress_points(data: TimelineData) -> list[ProgressPoint]:
    """Samples and the steps the audit trail gives, oldest first: the samples are kept for a
    short window only, the checkpoints and restarts for the workload's whole life."""
    points = list(data.samples)
    for event in data.progress_events:
        step = event_step(event)
        if step is not None:
            points.append(ProgressPoint(event.occurred_at, event.attempt, step, event.kind))
    workload = data.workload
    if workload.last_progress_step is not None and workload.last_progress_at is not None:
        points.append(
            ProgressPoint(
                workload.last_progress_at,
                workload.current_attempt or None,
                workload.last_progress_step,
                "latest",
            )
        )
    return sorted(points, key=lambda p: (p.at, p.step))


def step_before(points: Sequence[ProgressPoint], moment: datetime, attempt: int | None) -> int:
    """The furthest step seen up to ``moment`` (of ``attempt`` when it has points)."""
    steps = [p.step for p in points if p.at <= moment and (attempt is None or p.attempt == attempt)]
    if not steps and attempt is not None:
        return step_before(points, moment, None)
    return max(steps, default=0)


# ---------- the workload's story: its latest action, and its anomalies in causal order ----------

# Kinds of event that tell what became of an action: the controller's report, and the states
# the workload went through afterwards.
STORY_EVENT_KINDS = (AuditKind.SCHEDULER_ACTION, AuditKind.STATE_CHANGED)
MAX_STORY_EVENTS = 500

# Statuses of a recommendation whose action reached the scheduler: it had an effect that later
# facts can undo. A skipped one found the job already as the action would leave it.
ACTED_STATUSES = frozenset({RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED})
# What each action leaves the workload as; a later state outside these undoes it.
_STOPPED_STATES = frozenset(
    {
        WorkloadState.STOPPED,
        WorkloadState.CANCELLED,
        WorkloadState.FAILED,
        WorkloadState.COMPLETED,
    }
)
_ENDED_BY_OTHERS = frozenset({WorkloadState.CANCELLED, WorkloadState.STOPPED})
_STATE_LABELS = dict(WorkloadState.choices)


@dataclass(frozen=True)
class LaterFact:
    """A fact recorded after an action that undid its effect: ``what`` happened ``at``."""

    what: str
    at: datetime


@dataclass(frozen=True)
class ActionStanding:
    """A recommendation as its facts tell it: when it was carried out, and what overtook it."""

    recommendation: Recommendation
    acted_at: datetime | None
    overtaken_by: LaterFact | None

    @property
    def overtaken(self) -> bool:
        return self.overtaken_by is not None


def story_events(workload: Workload, *, limit: int = MAX_STORY_EVENTS) -> list[AuditEvent]:
    """The workload's newest controller reports and state changes, oldest first; one query."""
    return _newest_events(workload, STORY_EVENT_KINDS, limit)


def action_standings(
    recommendations: Sequence[Recommendation],
    attempts: Sequence[Attempt],
    events: Sequence[AuditEvent],
) -> dict[int, ActionStanding]:
    """Each recommendation's standing, by its id, from the order of the recorded facts.

    A stop that was carried out is overtaken when an attempt started after it, or the
    workload ran, waited or was requeued again; a restart when the job was then stopped or
    cancelled before any new attempt started. ``events`` are ``story_events``, oldest first.
    """
    acted_at: dict[int, datetime] = {}
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else {}
        pk = payload.get("recommendation")
        if event.kind == AuditKind.SCHEDULER_ACTION and isinstance(pk, int):
            acted_at.setdefault(pk, event.occurred_at)
    standings = {}
    for recommendation in recommendations:
        at = acted_at.get(recommendation.pk)
        if at is None and recommendation.status in ACTED_STATUSES:
            at = recommendation.updated_at  # the report's event is older than the events read
        later = None
        if at is not None and recommendation.status in ACTED_STATUSES:
            later = _overtaking_fact(recommendation, at, attempts, events)
        standings[recommendation.pk] = ActionStanding(recommendation, at, later)
    return standings


def _overtaking_fact(
    recommendation: Recommendation,
    acted_at: datetime,
    attempts: Sequence[Attempt],
    events: Sequence[AuditEvent],
) -> LaterFact | None:
    started_after = [a for a in attempts if a.started_at is not None and a.started_at > acted_at]
    first_started = min(started_after, key=lambda a: a.started_at or acted_at, default=None)
    later_states = [
        (event.occurred_at, str(event.payload.get("to", "")))
        for event in events
        if event.kind == AuditKind.STATE_CHANGED
        and event.occurred_at > acted_at
        and isinstance(event.payload, dict)
    ]
    if recommendation.action == RecommendationAction.STOP:
        if first_started is not None and first_started.started_at is not None:
            return LaterFact(f"attempt {first_started.number} started", first_started.started_at)
        for moment, state in later_states:
            if state and state not in _STOPPED_STATES:
                return LaterFact(f"the job became {_state_label(state)}", moment)
    elif recommendation.action in (
        RecommendationAction.RESTART,
        RecommendationAction.RESTART_EXCLUDING,
    ):
        restarted_at = first_started.started_at if first_started is not None else None
        for moment, state in later_states:
            if restarted_at is not None and moment >= restarted_at:
                break  # the restart took effect before anything else happened
            if state in _ENDED_BY_OTHERS:
                return LaterFact(f"the job was {_state_label(state).lower()}", moment)
    return None


def _state_label(state: str) -> str:
    return str(_STATE_LABELS.get(state, state))


def latest_action(
    recommendations: Sequence[Recommendation], standings: dict[int, ActionStanding]
) -> ActionStanding | None:
    """The workload's newest recommendation that was not replaced by another, as it stands."""
    current = [r for r in recommendations if r.status != RecommendationStatus.SUPERSEDED]
    if not current:
        return None
    newest = max(current, key=lambda r: (r.created_at, r.pk))
    return standings.get(newest.pk)


ROOT_CAUSE = "root"
CASCADE = "cascade"
WITNESS = "witness"
# Roles a detector gives a finding that only shows the consequence of another.
_CONSEQUENCE_ROLES = frozenset({"symptom", "wrapper"})


@dataclass(frozen=True)
class AnomalyEntry:
    """An anomaly in the workload page's list: its place in its attempt's failure.

    ``role`` is ``ROOT_CAUSE`` for the anomaly a recommendation was made on, ``CASCADE`` for
    what only shows its consequence (a collective timeout on the surviving ranks, a launcher
    reporting a child's death), ``WITNESS`` for other evidence of the same failure (the
    scheduler's node failure), and "" in an attempt no recommendation named a cause of.
    """

    anomaly: Anomaly
    attempt: int | None
    role: str
    root_id: int | None


def anomalies_in_causal_order(
    anomalies: Iterable[Anomaly],
    recommendations: Iterable[Recommendation],
    attempts: Sequence[Attempt],
) -> list[AnomalyEntry]:
    """The anomalies per attempt, newest attempt first; in each, the root cause a
    recommendation named first, then the others by time (cascades and witnesses).

    ``attempts`` are oldest first, to place an anomaly recorded without one.
    """
    named = [
        r.anomaly_id
        for r in sorted(recommendations, key=lambda r: (r.created_at, r.pk))
        if r.anomaly_id is not None and r.status != RecommendationStatus.SUPERSEDED
    ]
    by_attempt: dict[int | None, list[Anomaly]] = {}
    for anomaly in anomalies:
        by_attempt.setdefault(anomaly_attempt_number(anomaly, attempts), []).append(anomaly)
    entries: list[AnomalyEntry] = []
    for number in sorted(by_attempt, key=lambda n: -1 if n is None else n, reverse=True):
        found = sorted(by_attempt[number], key=lambda a: (a.detected_at, a.pk))
        roots = [a for a in found if a.pk in named]
        root_id = roots[0].pk if roots else None
        for anomaly in roots:
            entries.append(AnomalyEntry(anomaly, number, ROOT_CAUSE, anomaly.pk))
        for anomaly in found:
            if anomaly in roots:
                continue
            role = ""
            if root_id is not None:
                consequence = anomaly.details.get("role") in _CONSEQUENCE_ROLES
                role = CASCADE if consequence else WITNESS
            entries.append(AnomalyEntry(anomaly, number, role, root_id))
    return entries
