"""Goodput figures come from the audit trail alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recovery.audit.record import record_event
from recovery.choices import AuditKind, WorkloadState
from recovery.models import AuditEvent, Cluster, Workload
from recovery.read import goodput
from recovery.read.goodput import (
    ClusterGoodput,
    Distribution,
    cluster_goodput,
    goodput_from_events,
    workload_goodput,
)
from tests.factories import ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def trail(workload: Workload, events: list[tuple[float, str, int | None, dict[str, Any]]]) -> None:
    for seconds, kind, attempt, payload in events:
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=attempt,
            kind=kind,
            actor="test",
            payload=payload,
            occurred_at=at(seconds),
        )


def failed_once_and_recovered(cluster: Cluster) -> Workload:
    """
    Running at 0, checkpoints at 100 and 200, a failure at 250 detected at 252, requeued at
    255, allocated at 262, progress again at 270, a new checkpoint at 330, completed at 1000.
    """
    workload = WorkloadFactory(cluster=cluster, state=WorkloadState.COMPLETED)
    trail(
        workload,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (100, AuditKind.CHECKPOINT_SAVED, 1, {"step": 100}),
            (200, AuditKind.CHECKPOINT_SAVED, 1, {"step": 200}),
            (252, AuditKind.DETECTED, 1, {"evidence_at": at(250).isoformat()}),
            (253, AuditKind.DETECTED, 1, {"evidence_at": at(251).isoformat()}),  # same failure
            (255, AuditKind.SCHEDULER_ACTION, 1, {}),
            (262, AuditKind.RESTART_ALLOCATED, 2, {}),
            (270, AuditKind.PROGRESS_RESUMED, 2, {"step": 200}),
            (330, AuditKind.CHECKPOINT_SAVED, 2, {"step": 300}),
            (1000, AuditKind.TRAINING_COMPLETED, 2, {}),
        ],
    )
    return workload


def test_a_recovered_failure_gives_every_figure() -> None:
    figure = workload_goodput(failed_once_and_recovered(ClusterFactory()))
    (failure,) = figure.failures
    assert failure.detection_latency_s == 2
    assert failure.action_latency_s == 3
    assert failure.work_lost_s == 50
    assert failure.time_to_productive_s == 80
    assert figure.wall_s == 1000
    # 50 s of lost work plus 20 s from the failure until training progressed again.
    assert figure.ettr == pytest.approx(0.93)


def test_a_workload_without_failures_is_fully_productive() -> None:
    workload = WorkloadFactory(state=WorkloadState.RUNNING)
    trail(workload, [(0, AuditKind.STATE_CHANGED, 1, {"to": "running"})])
    figure = workload_goodput(workload, now=at(600))
    assert figure.failures == []
    assert figure.wall_s == 600
    assert figure.ettr == 1.0


def test_a_workload_that_never_ran_has_no_figures() -> None:
    figure = workload_goodput(WorkloadFactory(state=WorkloadState.PENDING))
    assert figure.ettr is None


def test_an_unrecovered_failure_counts_until_now() -> None:
    workload = WorkloadFactory(state=WorkloadState.REQUEUED)
    trail(
        workload,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (100, AuditKind.DETECTED, 1, {"evidence_at": at(100).isoformat()}),
        ],
    )
    figure = workload_goodput(workload, now=at(200))
    (failure,) = figure.failures
    assert failure.action_latency_s is None
    assert failure.time_to_productive_s is None
    assert figure.ettr == pytest.approx(0.5)


def test_cluster_figures_aggregate_their_workloads() -> None:
    cluster = ClusterFactory()
    failed_once_and_recovered(cluster)
    healthy = WorkloadFactory(cluster=cluster, state=WorkloadState.COMPLETED)
    trail(
        healthy,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (1000, AuditKind.TRAINING_COMPLETED, 1, {}),
        ],
    )
    figures = cluster_goodput(cluster)
    assert figures.workloads == 2
    assert figures.detection_latency_s.median == 2
    assert figures.action_latency_s.count == 1
    assert figures.ettr == pytest.approx((2000 - 70) / 2000)


def cluster_goodput_reading_every_event(cluster: Cluster, *, now: datetime) -> ClusterGoodput:
    """The figures as computed before the trail was streamed: every event of the cluster loaded
    as a model instance, grouped per workload in memory. The reference for the streamed reader."""
    by_workload: dict[int, list[AuditEvent]] = {}
    events = AuditEvent.objects.filter(cluster=cluster, workload__isnull=False)
    for event in events.order_by("occurred_at", "id"):
        assert event.workload_id is not None
        by_workload.setdefault(event.workload_id, []).append(event)
    states = dict(Workload.objects.filter(pk__in=by_workload).values_list("pk", "state"))
    finished_states = {
        WorkloadState.COMPLETED,
        WorkloadState.FAILED,
        WorkloadState.CANCELLED,
        WorkloadState.STOPPED,
    }
    figures = [
        goodput_from_events(evs, finished=states.get(pk) in finished_states, now=now)
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
        failed=sum(state == WorkloadState.FAILED for state in states.values()),
        given_up=sum(state == WorkloadState.STOPPED for state in states.values()),
    )


def busy_cluster() -> Cluster:
    """
    A cluster whose workloads cover every case the figures distinguish, created newest first
    (so workload order and time order differ), with times to the microsecond, events sharing a
    time, cluster-wide events and another cluster's trail beside it.
    """
    cluster = ClusterFactory()
    other = ClusterFactory()
    failed_once_and_recovered(other)
    for offset in (3000, 2000):  # the later workload gets the lower id
        twice = WorkloadFactory(cluster=cluster, state=WorkloadState.STOPPED)
        trail(
            twice,
            [
                (offset + 0.25, AuditKind.STATE_CHANGED, 1, {"to": "pending"}),
                (offset + 10.5, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
                (offset + 60.000001, AuditKind.CHECKPOINT_SAVED, 1, {"step": 6}),
                (offset + 61.3, AuditKind.DETECTED, 1, {}),  # no evidence time
                (offset + 61.3, AuditKind.DETECTED, 1, {"evidence_at": "not a time"}),
                (offset + 61.3, AuditKind.SCHEDULER_ACTION, 1, {}),
                (offset + 61.3, AuditKind.SCHEDULER_ACTION, 1, {}),
                (offset + 90.123456, AuditKind.PROGRESS_RESUMED, 2, {"step": 6}),
                (offset + 120.7, AuditKind.CHECKPOINT_SAVED, 2, {"step": 12}),
                (offset + 130, AuditKind.DETECTED, 2, {"evidence_at": None}),
                (
                    offset + 131.5,
                    AuditKind.DETECTED,
                    3,
                    {"evidence_at": at(offset + 129.999999).isoformat()},
                ),
                (offset + 140, AuditKind.RECOMMENDED, 3, {"action": "stop"}),
                (offset + 141.75, AuditKind.STOPPED, 3, {}),  # its wall time ends here
            ],
        )
    failed_once_and_recovered(cluster)
    unrecovered = WorkloadFactory(cluster=cluster, state=WorkloadState.REQUEUED)
    trail(
        unrecovered,
        [
            (1.5, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (50.000002, AuditKind.CHECKPOINT_SAVED, 1, {"step": 50}),
            (104.9, AuditKind.DETECTED, 1, {"evidence_at": at(100.1).isoformat()}),
        ],
    )
    never_ran = WorkloadFactory(cluster=cluster, state=WorkloadState.PENDING)
    trail(never_ran, [(5, AuditKind.STATE_CHANGED, None, {"to": "pending"})])
    only_decisions = WorkloadFactory(cluster=cluster, state=WorkloadState.COMPLETED)
    trail(only_decisions, [(7, AuditKind.RECOMMENDED, 1, {"action": "restart"})])
    record_event(
        cluster=cluster, kind=AuditKind.MODE_CHANGED, actor="test", occurred_at=at(8), payload={}
    )
    return cluster


@pytest.mark.parametrize("page_size", [1, 2, 3, 7, goodput.TRAIL_PAGE_SIZE])
def test_cluster_figures_read_a_page_at_a_time_equal_those_from_every_event(
    page_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    GIVEN a cluster with several workloads and failures, and pages that end inside a workload
          and between events sharing a time
    WHEN its figures are read a page at a time
    THEN they are those computed from every event loaded at once
    """
    monkeypatch.setattr(goodput, "TRAIL_PAGE_SIZE", page_size)
    cluster = busy_cluster()
    now = at(4000)

    figures = cluster_goodput(cluster, now=now)

    assert figures == cluster_goodput_reading_every_event(cluster, now=now)
    assert figures.workloads == 6
    assert figures.detection_latency_s.count == 8
    assert figures.action_latency_s.count == 3
    assert figures.ettr is not None and 0 < figures.ettr < 1
