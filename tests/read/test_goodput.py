"""Goodput figures come from the audit trail alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recovery.audit.record import record_event
from recovery.choices import AuditKind, WorkloadState
from recovery.models import Cluster, Workload
from recovery.read.goodput import cluster_goodput, workload_goodput
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
