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
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from django.db.models import Max, Q
from django.db.models.fields.json import KT
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
    # Workloads that ended failed, and those recovery gave up on (stopped): not the same loss.
    failed: int = 0
    given_up: int = 0


def workload_goodput(workload: Workload, *, now: datetime | None = None) -> WorkloadGoodput:
    events = list(AuditEvent.objects.filter(workload=workload).order_by("occurred_at", "id"))
    return goodput_from_events(events, finished=_finished(workload), now=now or timezone.now())


def cluster_goodput(cluster: Cluster, *, now: datetime | None = None) -> ClusterGoodput:
    """Figures over every workload of the cluster that has events.

    The trail is read in workload order, a page at a time (``_cluster_trail``), and each
    workload's figures are computed as soon as its events end: memory holds one page of light
    rows, one workload's failures and the four values each failure adds to the distributions,
    however long the trail.
    """
    now = now or timezone.now()
    workloads = 0
    wall = unproductive = 0.0
    # Packed doubles: 8 bytes per failure and figure, where a list of floats takes 32.
    detection = array("d")
    action = array("d")
    productive_again = array("d")
    work_lost = array("d")
    ended: dict[str, int] = {}
    for _, rows in itertools.groupby(_cluster_trail(cluster), key=lambda row: row.workload_id):
        accumulator = _WorkloadAccumulator()
        for row in rows:
            accumulator.add(row)
            state = row.workload_state
        figure = accumulator.figures(finished=state in _FINISHED_STATES, now=now)
        ended[state] = ended.get(state, 0) + 1
        workloads += 1
        wall += figure.wall_s
        unproductive += figure.unproductive_s
        for failure in figure.failures:
            detection.append(failure.detection_latency_s)
            _append_known(action, failure.action_latency_s)
            _append_known(productive_again, failure.time_to_productive_s)
            _append_known(work_lost, failure.work_lost_s)
    return ClusterGoodput(
        workloads=workloads,
        detection_latency_s=Distribution.of(detection),
        action_latency_s=Distribution.of(action),
        time_to_productive_s=Distribution.of(productive_again),
        work_lost_s=Distribution.of(work_lost),
        ettr=None if wall <= 0 else max(0.0, min(1.0, (wall - unproductive) / wall)),
        failed=ended.get(WorkloadState.FAILED, 0),
        given_up=ended.get(WorkloadState.STOPPED, 0),
    )


def _append_known(values: array[float], value: float | None) -> None:
    if value is not None:
        values.append(value)


# Rows of a cluster's trail fetched per query by ``cluster_goodput``.
TRAIL_PAGE_SIZE = 2000


class _TrailRow(NamedTuple):
    """An event as ``cluster_goodput`` reads it: the two payload keys the figures use, never
    the whole payload (a scheduler action's can hold 80 KB of command output)."""

    workload_id: int
    workload_state: str
    occurred_at: datetime
    id: int
    kind: str
    attempt: int | None
    to: str | None
    evidence_at: str | None

    @property
    def payload(self) -> dict[str, str]:
        keys = (("to", self.to), ("evidence_at", self.evidence_at))
        return {key: value for key, value in keys if value is not None}


def _cluster_trail(cluster: Cluster) -> Iterator[_TrailRow]:
    """The cluster's workload events ordered by workload, time and id, one page per query.

    Each page starts after the last row of the one before (keyset pagination on the
    cluster-workload-time index). A single query read with ``.iterator()`` would not bound
    memory here: mysqlclient's default cursor turns the whole result into Python rows when the
    query runs, and Django offers no streaming cursor on MySQL.
    """
    events = (
        AuditEvent.objects.filter(cluster=cluster, workload__isnull=False)
        .order_by("workload_id", "occurred_at", "id")
        .values_list(
            "workload_id",
            "workload__state",
            "occurred_at",
            "id",
            "kind",
            "attempt",
            KT("payload__to"),
            KT("payload__evidence_at"),
        )
    )
    after = Q()
    while True:
        read = 0
        # Not cached in the queryset: the page before is freed before the next one is read.
        for values in events.filter(after)[:TRAIL_PAGE_SIZE].iterator():
            last = _TrailRow._make(values)
            read += 1
            yield last
        if read < TRAIL_PAGE_SIZE:
            return
        after = (
            Q(workload_id__gt=last.workload_id)
            | Q(workload_id=last.workload_id, occurred_at__gt=last.occurred_at)
            | Q(workload_id=last.workload_id, occurred_at=last.occurred_at, id__gt=last.id)
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
    events: Iterable[GoodputEvent],
    *,
    finished: bool,
    now: datetime,
    last_event_at: datetime | None = None,
) -> WorkloadGoodput:
    """The figures of one workload from its events, oldest first.

    ``last_event_at`` is for a caller that passes only the ``GOODPUT_KINDS``: the time of the
    workload's last event of any kind, where a finished workload's wall time ends.
    """
    accumulator = _WorkloadAccumulator()
    for event in events:
        accumulator.add(event)
    return accumulator.figures(finished=finished, now=now, last_event_at=last_event_at)


class _WorkloadAccumulator:
    """One workload's figures, fed its events oldest first: it keeps its failures and the
    latest checkpoint, never the events themselves."""

    def __init__(self) -> None:
        self.started_at: datetime | None = None
        self.last_event_at: datetime | None = None
        self.failures: list[Failure] = []
        self._last_checkpoint: datetime | None = None
        self._open_failure: Failure | None = None
        self._seen_attempts: set[int | None] = set()

    def add(self, event: GoodputEvent) -> None:
        self.last_event_at = event.occurred_at
        if event.kind == AuditKind.STATE_CHANGED:
            if self.started_at is None and event.payload.get("to") == WorkloadState.RUNNING:
                self.started_at = event.occurred_at
        elif event.kind == AuditKind.CHECKPOINT_SAVED:
            failure = self._open_failure
            if (
                failure is not None
                and failure.new_checkpoint_at is None
                and failure.resumed_at is not None  # a checkpoint of the new attempt
            ):
                failure.new_checkpoint_at = event.occurred_at
            self._last_checkpoint = event.occurred_at
        elif event.kind == AuditKind.DETECTED and event.attempt not in self._seen_attempts:
            self._seen_attempts.add(event.attempt)
            evidence_at = (
                parse_timestamp(str(event.payload.get("evidence_at", ""))) or event.occurred_at
            )
            self._open_failure = Failure(
                at=min(evidence_at, event.occurred_at),
                attempt=event.attempt,
                detected_at=event.occurred_at,
                last_checkpoint_at=self._last_checkpoint,
            )
            self.failures.append(self._open_failure)
        elif event.kind == AuditKind.SCHEDULER_ACTION and self._open_failure is not None:
            self._open_failure.action_at = self._open_failure.action_at or event.occurred_at
        elif event.kind == AuditKind.PROGRESS_RESUMED and self._open_failure is not None:
            self._open_failure.resumed_at = self._open_failure.resumed_at or event.occurred_at

    def figures(
        self, *, finished: bool, now: datetime, last_event_at: datetime | None = None
    ) -> WorkloadGoodput:
        figure = WorkloadGoodput()
        if self.started_at is None or self.last_event_at is None:
            return figure
        if finished:
            ended = last_event_at if last_event_at is not None else self.last_event_at
        else:
            ended = now
        figure.failures = self.failures
        figure.started_at, figure.ended_at = self.started_at, ended
        figure.wall_s = max((ended - self.started_at).total_seconds(), 0.0)
        for failure in self.failures:
            back_at = failure.resumed_at or ended
            figure.unproductive_s += sum(
                (end - start).total_seconds() for start, end in failure.unproductive_spans(back_at)
            )
        return figure
