"""Goodput figures, computed from the audit trail alone.

Per workload and per cluster: detection latency (evidence → anomaly recorded), action latency
(anomaly → scheduler action done), time to productive training (failure → first new checkpoint
after the restart), work lost (failure minus last checkpoint before it) and ETTR (productive time
over wall time). Each failure is taken from the first anomaly detected in an attempt.

ETTR here counts as unproductive, for every failure, the work lost since the last checkpoint
(it must be computed again) plus the time from the failure until training progressed again.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.db.models import Max
from django.utils import timezone

from recovery.choices import AuditKind, WorkloadState
from recovery.detection.normalize import parse_timestamp
from recovery.models import AuditEvent, Cluster, Workload

# The only kinds of event the figures read. A reader that streams a long trail fetches just
# these (plus the time of the workload's last event, see ``goodput_from_events``).
GOODPUT_KINDS = (
    AuditKind.STATE_CHANGED,
    AuditKind.CHECKPOINT_SAVED,
    AuditKind.DETECTED,
    AuditKind.SCHEDULER_ACTION,
    AuditKind.PROGRESS_RESUMED,
)


class GoodputEvent(Protocol):
    """What the figures read of an audit event: a model instance or a lighter row will do."""

    @property
    def occurred_at(self) -> datetime: ...

    @property
    def kind(self) -> str: ...

    @property
    def attempt(self) -> int | None: ...

    @property
    def payload(self) -> Mapping[str, Any]: ...


@dataclass
class Failure:
    at: datetime
    attempt: int | None
    detected_at: datetime
    action_at: datetime | None = None
    resumed_at: datetime | None = None
    new_checkpoint_at: datetime | None = None
    last_checkpoint_at: datetime | None = None

    @property
    def detection_latency_s(self) -> float:
        return max((self.detected_at - self.at).total_seconds(), 0.0)

    @property
    def action_latency_s(self) -> float | None:
        return (
            None if self.action_at is None else (self.action_at - self.detected_at).total_seconds()
        )

    @property
    def time_to_productive_s(self) -> float | None:
        if self.new_checkpoint_at is None:
            return None
        return (self.new_checkpoint_at - self.at).total_seconds()

    @property
    def work_lost_s(self) -> float | None:
        if self.last_checkpoint_at is None:
            return None
        return max((self.at - self.last_checkpoint_at).total_seconds(), 0.0)

    def unproductive_spans(self, back_at: datetime) -> list[tuple[datetime, datetime]]:
        """When this failure cost training time: the work lost since the last checkpoint, then
        the time until training progressed again (``back_at``). Empty spans are left out."""
        spans = []
        if self.last_checkpoint_at is not None and self.at > self.last_checkpoint_at:
            spans.append((self.last_checkpoint_at, self.at))
        if back_at > self.at:
            spans.append((self.at, back_at))
        return spans


@dataclass
class WorkloadGoodput:
    failures: list[Failure] = field(default_factory=list)
    wall_s: float = 0.0
    unproductive_s: float = 0.0
    # When the workload first ran and when its wall time ends (its last event, or now while it
    # is not finished); None if it never ran. They let a reader clip the figures to a window.
    started_at: datetime | None = None
    ended_at: datetime | None = None

    def unproductive_spans(self) -> list[tuple[datetime, datetime]]:
        """Every span of time its failures cost, as summed in ``unproductive_s``."""
        if self.ended_at is None:
            return []
        return [
            span
            for failure in self.failures
            for span in failure.unproductive_spans(failure.resumed_at or self.ended_at)
        ]

    @property
    def ettr(self) -> float | None:
        if self.wall_s <= 0:
            return None
        return max(0.0, min(1.0, (self.wall_s - self.unproductive_s) / self.wall_s))


@dataclass(frozen=True)
class Distribution:
    count: int
    median: float | None
    p95: float | None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Distribution:
        known = sorted(v for v in values if v is not None)
        if not known:
            return cls(0, None, None)
        p95 = known[min(len(known) - 1, round(0.95 * (len(known) - 1)))]
        return cls(len(known), statistics.median(known), p95)


@dataclass(frozen=True)
class ClusterGoodput:
    workloads: int
    detection_latency_s: Distribution
    action_latency_s: Distribution
    time_to_productive_s: Distribution
    work_lost_s: Distribution
    ettr: float | None


def workload_goodput(workload: Workload, *, now: datetime | None = None) -> WorkloadGoodput:
    events = list(AuditEvent.objects.filter(workload=workload).order_by("occurred_at", "id"))
    return goodput_from_events(events, finished=_finished(workload), now=now or timezone.now())


def cluster_goodput(cluster: Cluster, *, now: datetime | None = None) -> ClusterGoodput:
    """Figures over every workload of the cluster (one query for all their events)."""
    now = now or timezone.now()
    by_workload: dict[int, list[AuditEvent]] = {}
    events = AuditEvent.objects.filter(cluster=cluster, workload__isnull=False)
    for event in events.order_by("occurred_at", "id"):
        by_workload.setdefault(event.workload_id, []).append(event)  # type: ignore[arg-type]
    states = dict(Workload.objects.filter(pk__in=by_workload).values_list("pk", "state"))
    figures = [
        goodput_from_events(evs, finished=states.get(pk) in _FINISHED_STATES, now=now)
        for pk, evs in by_workload.items()
    ]
    failures = [f for figure in figures for f in figure.failures]
    wall = sum(f.wall_s for f in figures)
    unproductive = sum(f.unproductive_s for f in figures)
    return ClusterGoodput(
        workloads=len(figures),
        detection_latency_s=Distribution.of(f.detection_latency_s for f in failures),
        action_latency_s=Distribution.of(f.action_latency_s for f in failures),
        time_to_productive_s=Distribution.of(f.time_to_productive_s for f in failures),
        work_lost_s=Distribution.of(f.work_lost_s for f in failures),
        ettr=None if wall <= 0 else max(0.0, min(1.0, (wall - unproductive) / wall)),
    )


_FINISHED_STATES = {
    WorkloadState.COMPLETED,
    WorkloadState.FAILED,
    WorkloadState.CANCELLED,
    WorkloadState.STOPPED,
}


def _finished(workload: Workload) -> bool:
    return workload.state in _FINISHED_STATES


# Workloads whose events are read per round of queries, and rows fetched per round trip.
WORKLOADS_PER_BATCH = 200
EVENTS_PER_FETCH = 2000


def goodput_of_workloads(
    workload_ids: Sequence[int], *, now: datetime
) -> Iterator[tuple[int, WorkloadGoodput]]:
    """Each workload's figures up to ``now``, reading only the events the figures need, a batch
    of workloads per query and streamed; a workload without a goodput event is left out."""
    for offset in range(0, len(workload_ids), WORKLOADS_PER_BATCH):
        batch = workload_ids[offset : offset + WORKLOADS_PER_BATCH]
        finished = set(
            Workload.objects.filter(pk__in=batch, state__in=_FINISHED_STATES).values_list(
                "pk", flat=True
            )
        )
        # A finished workload's wall time ends at its last event, whatever its kind.
        last_event_at: dict[int, datetime] = dict(
            AuditEvent.objects.filter(workload_id__in=finished, occurred_at__lte=now)
            .order_by()
            .values("workload_id")
            .annotate(last=Max("occurred_at"))
            .values_list("workload_id", "last")
        )
        rows = (
            AuditEvent.objects.filter(
                workload_id__in=batch, kind__in=GOODPUT_KINDS, occurred_at__lte=now
            )
            .order_by("workload_id", "occurred_at", "id")
            .values_list("workload_id", "occurred_at", "kind", "attempt", "payload", named=True)
            .iterator(chunk_size=EVENTS_PER_FETCH)
        )
        for workload_id, events in itertools.groupby(rows, key=lambda row: row.workload_id):
            yield (
                workload_id,
                goodput_from_events(
                    list(events),
                    finished=workload_id in finished,
                    now=now,
                    last_event_at=last_event_at.get(workload_id),
                ),
            )


def goodput_from_events(
    events: Sequence[GoodputEvent],
    *,
    finished: bool,
    now: datetime,
    last_event_at: datetime | None = None,
) -> WorkloadGoodput:
    """The figures of one workload from its events, oldest first.

    ``last_event_at`` is for a caller that passes only the ``GOODPUT_KINDS``: the time of the
    workload's last event of any kind, where a finished workload's wall time ends.
    """
    figure = WorkloadGoodput()
    started = next(
        (
            e.occurred_at
            for e in events
            if e.kind == AuditKind.STATE_CHANGED and e.payload.get("to") == WorkloadState.RUNNING
        ),
        None,
    )
    if started is None:
        return figure
    if finished:
        ended = last_event_at if last_event_at is not None else events[-1].occurred_at
    else:
        ended = now
    figure.started_at, figure.ended_at = started, ended
    figure.wall_s = max((ended - started).total_seconds(), 0.0)
    last_checkpoint: datetime | None = None
    open_failure: Failure | None = None
    seen_attempts: set[int | None] = set()
    for event in events:
        if event.kind == AuditKind.CHECKPOINT_SAVED:
            if (
                open_failure is not None
                and open_failure.new_checkpoint_at is None
                and open_failure.resumed_at is not None  # a checkpoint of the new attempt
            ):
                open_failure.new_checkpoint_at = event.occurred_at
            last_checkpoint = event.occurred_at
        elif event.kind == AuditKind.DETECTED and event.attempt not in seen_attempts:
            seen_attempts.add(event.attempt)
            evidence_at = (
                parse_timestamp(str(event.payload.get("evidence_at", ""))) or event.occurred_at
            )
            open_failure = Failure(
                at=min(evidence_at, event.occurred_at),
                attempt=event.attempt,
                detected_at=event.occurred_at,
                last_checkpoint_at=last_checkpoint,
            )
            figure.failures.append(open_failure)
        elif event.kind == AuditKind.SCHEDULER_ACTION and open_failure is not None:
            open_failure.action_at = open_failure.action_at or event.occurred_at
        elif event.kind == AuditKind.PROGRESS_RESUMED and open_failure is not None:
            open_failure.resumed_at = open_failure.resumed_at or event.occurred_at
    for failure in figure.failures:
        back_at = failure.resumed_at or ended
        figure.unproductive_s += sum(
            (end - start).total_seconds() for start, end in failure.unproductive_spans(back_at)
        )
    return figure
