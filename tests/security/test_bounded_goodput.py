"""A cluster's goodput is computed in bounded memory, however long its audit trail.

``/api/v1/clusters/<id>/goodput/`` computes the figures on each call. They are read a page of
light rows at a time, in workload order, so ten times the workloads means more queries of the
same size, never ten times the memory.
"""

from __future__ import annotations

import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries

from recovery.choices import AuditKind, WorkloadState
from recovery.models import AuditEvent, Cluster, Workload
from recovery.read import goodput
from recovery.read.goodput import cluster_goodput
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
EVENTS_PER_WORKLOAD = 40
# What a real trail carries beside the figures: the log excerpt of a detection, the scheduler's
# answer to an action. The figures need neither.
EXCERPT = "NCCL WARN Timeout waiting for rank 17 at collective ALLREDUCE seq 88213 " * 6
SCHEDULER_OUTPUT = "JobId=48213 JobState=REQUEUED Reason=BeginTime Dependency=(null) " * 16


def cycle(number: int, at: datetime) -> list[tuple[datetime, str, int, dict[str, Any]]]:
    """Five events: a checkpoint, a failure detected, the requeue, progress and a checkpoint."""
    return [
        (at, AuditKind.CHECKPOINT_SAVED, number, {"step": number * 100}),
        (
            at + timedelta(seconds=30),
            AuditKind.DETECTED,
            number,
            {"evidence_at": (at + timedelta(seconds=28)).isoformat(), "excerpt": EXCERPT},
        ),
        (
            at + timedelta(seconds=33),
            AuditKind.SCHEDULER_ACTION,
            number,
            {"command": "scontrol requeue 48213", "state_before": SCHEDULER_OUTPUT},
        ),
        (at + timedelta(seconds=90), AuditKind.PROGRESS_RESUMED, number + 1, {"step": 0}),
        (at + timedelta(seconds=150), AuditKind.CHECKPOINT_SAVED, number + 1, {"step": 1}),
    ]


def cluster_with(workloads: int, events_each: int = EVENTS_PER_WORKLOAD) -> Cluster:
    """A cluster whose finished workloads each have ``events_each`` events: started, then
    failing and recovering over and over."""
    cluster = ClusterFactory()
    rows = Workload.objects.bulk_create(
        Workload(
            cluster=cluster,
            job_id=str(100_000 + n),
            name=f"pretrain-{n}",
            user="alice",
            partition="gpu",
            submit_time=T0,
            state=WorkloadState.COMPLETED,
        )
        for n in range(workloads)
    )
    events = []
    for n, workload in enumerate(rows):
        start = T0 + timedelta(minutes=n)
        trail: list[tuple[datetime, str, int, dict[str, Any]]] = [
            (start, AuditKind.STATE_CHANGED, 1, {"to": "running"})
        ]
        while len(trail) < events_each:
            trail += cycle(len(trail) // 5 + 1, start + timedelta(minutes=10 * len(trail)))
        events += [
            AuditEvent(
                cluster=cluster,
                workload=workload,
                attempt=attempt,
                kind=kind,
                actor="test",
                payload=payload,
                occurred_at=at,
            )
            for at, kind, attempt, payload in trail[:events_each]
        ]
    AuditEvent.objects.bulk_create(events, batch_size=2000)
    return cluster


def peak_memory_of_cluster_goodput(cluster: Cluster) -> int:
    tracemalloc.start()
    try:
        cluster_goodput(cluster, now=timezone.now())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_ten_times_the_workloads_do_not_take_ten_times_the_memory() -> None:
    """
    GIVEN a cluster of 50 workloads and one of 500, each workload with 40 events
    WHEN the goodput of each cluster is computed
    THEN the peak of Python memory for 500 workloads stays within 1.5 times that for 50
    """
    cluster_goodput(cluster_with(3))  # first-call allocations are not the trail's
    small = peak_memory_of_cluster_goodput(cluster_with(50))
    large = peak_memory_of_cluster_goodput(cluster_with(500))
    assert large < 1.5 * small, f"peak {large} B for 500 workloads, {small} B for 50"


def test_the_queries_grow_with_the_events_never_with_the_workloads(
    django_assert_max_num_queries: DjangoAssertNumQueries,
) -> None:
    """
    GIVEN a cluster of 500 workloads with 40 events each, and one of 50 with 400 each
    WHEN the goodput of each cluster is computed
    THEN each takes one query per page of events read, the same number for both
    """
    pages = 500 * EVENTS_PER_WORKLOAD // goodput.TRAIL_PAGE_SIZE + 1
    many_workloads = cluster_with(500)
    long_trails = cluster_with(50, events_each=10 * EVENTS_PER_WORKLOAD)

    with django_assert_max_num_queries(pages):
        assert cluster_goodput(many_workloads).workloads == 500
    with django_assert_max_num_queries(pages):
        assert cluster_goodput(long_trails).workloads == 50
