"""Goodput snapshots: the worker's periodic figures per cluster, and anomalies over time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from recovery.choices import Attribution, AuditKind, FailureCategory, WorkloadState
from recovery.demo.fleet import A100_CLUSTER, H100_CLUSTER, seed_demo_cluster
from recovery.models import Cluster, ClusterGoodputSnapshot, Workload
from recovery.read.goodput import cluster_goodput
from recovery.read.insights import (
    ACTION_LATENCY_EDGES,
    DETECTION_LATENCY_EDGES,
    SNAPSHOT_RETENTION,
    SNAPSHOT_THIN_AFTER,
    TIME_TO_PRODUCTIVE_EDGES,
    anomalies_over_time,
    bucket_labels,
    ettr_over_time,
    histogram,
    latest_snapshots,
    prune_goodput_snapshots,
    take_goodput_snapshots,
)
from tasks import maintenance
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, ClusterFactory, WorkloadFactory
from tests.read.test_goodput import at, failed_once_and_recovered, trail

pytestmark = pytest.mark.django_db


def snapshot_of(cluster: Cluster, taken_at: datetime, **fields: object) -> ClusterGoodputSnapshot:
    fields.setdefault("window_seconds", 7 * 86400)
    return ClusterGoodputSnapshot.objects.create(cluster=cluster, taken_at=taken_at, **fields)


def unrecovered(cluster: Cluster) -> Workload:
    """Running at 0, a checkpoint at 50, a failure at 100 detected at 104, nothing since."""
    workload = WorkloadFactory(cluster=cluster, state=WorkloadState.REQUEUED)
    trail(
        workload,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (50, AuditKind.CHECKPOINT_SAVED, 1, {"step": 50}),
            (104, AuditKind.DETECTED, 1, {"evidence_at": at(100).isoformat()}),
            (110, AuditKind.RECOMMENDED, 1, {"action": "restart"}),
        ],
    )
    return workload


# --- the figures ---------------------------------------------------------------------------


def test_a_snapshot_of_a_history_inside_its_window_equals_the_cluster_figures() -> None:
    """
    GIVEN a cluster whose whole history lies inside the window: a recovered failure, a healthy
          completed run, an unrecovered failure and a workload that never ran
    WHEN the worker takes a snapshot
    THEN it holds the same figures as cluster_goodput computed over every event
    """
    cluster = ClusterFactory()
    failed_once_and_recovered(cluster)
    healthy = WorkloadFactory(cluster=cluster, state=WorkloadState.COMPLETED)
    trail(
        healthy,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (900, AuditKind.TRAINING_COMPLETED, 1, {}),
        ],
    )
    unrecovered(cluster)
    pending = WorkloadFactory(cluster=cluster, state=WorkloadState.PENDING)
    trail(pending, [(5, AuditKind.STATE_CHANGED, None, {"to": "pending"})])
    now = at(2000)

    assert take_goodput_snapshots(now) == 1

    expected = cluster_goodput(cluster, now=now)
    snapshot = ClusterGoodputSnapshot.objects.get(cluster=cluster)
    assert snapshot.taken_at == now
    assert snapshot.window_seconds == 7 * 86400
    assert snapshot.workloads == expected.workloads == 4
    assert snapshot.failures == expected.detection_latency_s.count == 2
    assert snapshot.ettr == pytest.approx(expected.ettr)
    for name in ("detection_latency", "action_latency", "time_to_productive", "work_lost"):
        distribution = getattr(expected, f"{name}_s")
        assert getattr(snapshot, f"{name}_median") == pytest.approx(distribution.median)
        assert getattr(snapshot, f"{name}_p95") == pytest.approx(distribution.p95)


def test_histograms_count_each_failure_in_its_bucket() -> None:
    cluster = ClusterFactory()
    failed_once_and_recovered(cluster)  # detection 2 s, action 3 s, productive again after 80 s
    unrecovered(cluster)  # detection 4 s, no action yet
    take_goodput_snapshots(at(2000))
    snapshot = ClusterGoodputSnapshot.objects.get(cluster=cluster)

    assert snapshot.detection_latency_histogram == {
        "edges": list(DETECTION_LATENCY_EDGES),
        "counts": [0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
    }
    assert snapshot.action_latency_histogram["counts"] == [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert snapshot.time_to_productive_histogram["edges"] == list(TIME_TO_PRODUCTIVE_EDGES)
    assert snapshot.time_to_productive_histogram["counts"][1] == 1  # 1-5 min
    assert sum(snapshot.time_to_productive_histogram["counts"]) == 1


def test_histogram_buckets_are_fixed_and_open_ended() -> None:
    counts = histogram([0, 0.5, 1, 4.9, 599, 600, 86400, None, -1], DETECTION_LATENCY_EDGES)
    assert counts["counts"] == [3, 1, 1, 0, 0, 0, 0, 0, 1, 2]
    assert bucket_labels(DETECTION_LATENCY_EDGES)[:2] == ["0\N{EN DASH}1 s", "1\N{EN DASH}2 s"]
    assert bucket_labels(ACTION_LATENCY_EDGES)[3] == "30 s\N{EN DASH}1 min"
    assert bucket_labels(TIME_TO_PRODUCTIVE_EDGES)[-1] == "≥ 12 h"
    assert len(bucket_labels(ACTION_LATENCY_EDGES)) == len(ACTION_LATENCY_EDGES)


def test_the_window_limits_which_workloads_failures_and_time_count() -> None:
    """
    GIVEN a 1000 s window ending at 3000 s, and
          - a workload that finished at 500 s (no event in the window),
          - a workload whose failure was detected at 2100 s, inside the window,
          - a workload whose failure was detected at 1500 s, before the window, and resumed
            at 2050 s,
          - an event after the snapshot time
    WHEN the worker takes a snapshot at 3000 s
    THEN only the failure inside the window is in the distributions, the old workload is left
         out, and wall and lost time are clipped to the window
    """
    cluster = ClusterFactory()
    old = WorkloadFactory(cluster=cluster, state=WorkloadState.COMPLETED)
    trail(
        old,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (200, AuditKind.DETECTED, 1, {"evidence_at": at(150).isoformat()}),
            (500, AuditKind.TRAINING_COMPLETED, 1, {}),
        ],
    )
    inside = WorkloadFactory(cluster=cluster, state=WorkloadState.RUNNING)
    trail(
        inside,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (1900, AuditKind.CHECKPOINT_SAVED, 1, {"step": 19}),
            (2100, AuditKind.DETECTED, 1, {"evidence_at": at(2095).isoformat()}),
            (2110, AuditKind.SCHEDULER_ACTION, 1, {}),
            (2200, AuditKind.PROGRESS_RESUMED, 2, {"step": 19}),
            (2300, AuditKind.CHECKPOINT_SAVED, 2, {"step": 23}),
            (3500, AuditKind.DETECTED, 2, {"evidence_at": at(3400).isoformat()}),  # after now
        ],
    )
    before = WorkloadFactory(cluster=cluster, state=WorkloadState.RUNNING)
    trail(
        before,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (1400, AuditKind.CHECKPOINT_SAVED, 1, {"step": 14}),
            (1500, AuditKind.DETECTED, 1, {"evidence_at": at(1500).isoformat()}),
            (2050, AuditKind.PROGRESS_RESUMED, 2, {"step": 14}),
            (2060, AuditKind.CHECKPOINT_SAVED, 2, {"step": 15}),
        ],
    )

    take_goodput_snapshots(at(3000), window=timedelta(seconds=1000))

    snapshot = ClusterGoodputSnapshot.objects.get(cluster=cluster)
    assert snapshot.window_seconds == 1000
    assert snapshot.workloads == 2
    assert snapshot.failures == 1
    assert snapshot.detection_latency_median == 5
    assert snapshot.action_latency_median == 10
    assert snapshot.work_lost_median == 195  # from the checkpoint at 1900 s, before the window
    assert snapshot.time_to_productive_median == 205
    assert snapshot.wall_seconds == 2000
    # 95 s lost before and 105 s down after the failure inside; 50 s of the earlier one's downtime.
    assert snapshot.unproductive_seconds == 250
    assert snapshot.ettr == pytest.approx(1 - 250 / 2000)


def test_a_cluster_without_activity_gets_an_empty_snapshot() -> None:
    cluster = ClusterFactory()
    take_goodput_snapshots(at(100))
    snapshot = ClusterGoodputSnapshot.objects.get(cluster=cluster)
    assert (snapshot.workloads, snapshot.failures, snapshot.ettr) == (0, 0, None)
    assert snapshot.detection_latency_median is None
    assert sum(snapshot.detection_latency_histogram["counts"]) == 0
    assert snapshot.anomalies_by_category == {}


def test_it_counts_the_windows_anomalies_by_category_and_attribution() -> None:
    cluster = ClusterFactory()
    workload = WorkloadFactory(cluster=cluster)
    now = at(10_000)
    for seconds, category, attribution in [
        (9_000, FailureCategory.GPU_HARDWARE, Attribution.HARDWARE),
        (9_500, FailureCategory.GPU_HARDWARE, Attribution.HARDWARE),
        (9_900, FailureCategory.NCCL_TIMEOUT, Attribution.UNKNOWN),
        (10_500, FailureCategory.GPU_OOM, Attribution.APPLICATION),  # after the snapshot
    ]:
        AnomalyFactory(
            workload=workload, category=category, attribution=attribution, detected_at=at(seconds)
        )
    AnomalyFactory(detected_at=at(9_000))  # another cluster
    AnomalyFactory(workload=workload, detected_at=now - timedelta(days=8))  # before the window

    take_goodput_snapshots(now)

    snapshot = ClusterGoodputSnapshot.objects.get(cluster=cluster)
    assert snapshot.anomalies_by_category == {"gpu_hardware": 2, "nccl_timeout": 1}
    assert snapshot.anomalies_by_attribution == {"hardware": 2, "unknown": 1}


def test_taking_a_snapshot_twice_for_the_same_time_rewrites_it() -> None:
    """
    GIVEN a snapshot already taken at a given time
    WHEN the task runs again for that time, after another failure was recorded
    THEN there is still one snapshot per cluster and time, holding the newer figures
    """
    cluster = ClusterFactory()
    ClusterFactory()
    failed_once_and_recovered(cluster)
    now = at(2000)
    assert take_goodput_snapshots(now) == 2
    unrecovered(cluster)

    assert take_goodput_snapshots(now) == 2

    assert ClusterGoodputSnapshot.objects.count() == 2
    assert ClusterGoodputSnapshot.objects.get(cluster=cluster).failures == 2


def test_it_prunes_snapshots_past_the_retention_only() -> None:
    cluster = ClusterFactory()
    now = at(0)
    expired = snapshot_of(cluster, now - SNAPSHOT_RETENTION - timedelta(minutes=1))
    kept = snapshot_of(cluster, now - SNAPSHOT_RETENTION + timedelta(minutes=1))

    take_goodput_snapshots(now)

    remaining = set(ClusterGoodputSnapshot.objects.values_list("pk", flat=True))
    assert expired.pk not in remaining
    assert kept.pk in remaining
    assert len(remaining) == 2


def test_snapshots_older_than_two_days_are_thinned_to_one_per_hour() -> None:
    """
    GIVEN snapshots every 5 minutes for the last 3 days, for two clusters
    WHEN the worker takes the next snapshot
    THEN those from the day before the 2-day cut-off keep the first of each cluster and hour,
         the newer ones all stay, and thinning again removes nothing more
    """
    now = datetime(2026, 11, 29, 12, 2, tzinfo=UTC)
    lab, prod = ClusterFactory(), ClusterFactory()
    for cluster in (lab, prod):
        ClusterGoodputSnapshot.objects.bulk_create(
            ClusterGoodputSnapshot(
                cluster=cluster, taken_at=now - timedelta(minutes=5 * i + 1), window_seconds=1
            )
            for i in range(3 * 24 * 12)
        )
    cutoff = now - SNAPSHOT_THIN_AFTER

    take_goodput_snapshots(now)

    for cluster in (lab, prod):
        older = list(
            ClusterGoodputSnapshot.objects.filter(cluster=cluster, taken_at__lt=cutoff)
            .order_by("taken_at")
            .values_list("taken_at", flat=True)
        )
        hours = [t.replace(minute=0, second=0, microsecond=0) for t in older]
        assert len(hours) == len(set(hours)) == 25  # 24 whole hours and the one cut through
        # Each hour keeps its first (the oldest hour began before the first snapshot).
        assert all(t.minute == 1 for t in older[1:])
        newer = ClusterGoodputSnapshot.objects.filter(cluster=cluster, taken_at__gte=cutoff)
        assert newer.count() == 2 * 24 * 12 + 1  # and the one just taken
    assert prune_goodput_snapshots(now) == 0


def test_the_task_takes_snapshots_of_every_cluster() -> None:
    ClusterFactory()
    ClusterFactory()
    assert maintenance.take_goodput_snapshots() == 2
    assert ClusterGoodputSnapshot.objects.count() == 2


def test_the_beat_schedule_takes_snapshots_at_the_configured_interval() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["goodput-snapshots"]
    assert entry["task"] == "tasks.maintenance.take_goodput_snapshots"
    assert entry["schedule"] == float(settings.INSIGHTS_SECONDS)
    options = entry["options"]
    assert isinstance(options, dict)
    assert options["expires"] < entry["schedule"]


def test_the_demo_seed_leaves_figures_for_the_insights_page() -> None:
    now = datetime(2025, 6, 3, 12, 0, tzinfo=UTC)
    seed_demo_cluster(now=now)
    snapshots = ClusterGoodputSnapshot.objects.filter(taken_at=now)
    assert {s.cluster.name for s in snapshots} == {A100_CLUSTER, H100_CLUSTER}
    assert any(s.failures for s in snapshots)


# --- reading them --------------------------------------------------------------------------


def test_latest_snapshots_gives_each_clusters_newest_in_one_query() -> None:
    lab, prod, idle = ClusterFactory(), ClusterFactory(), ClusterFactory()
    for minutes in (0, 5, 10):
        snapshot_of(lab, at(minutes * 60), failures=minutes)
    snapshot_of(prod, at(120), failures=7)
    snapshot_of(prod, at(60), failures=1)

    with CaptureQueriesContext(connection) as queries:
        latest = latest_snapshots([lab, prod, idle])
        failures = {cluster_id: s.failures for cluster_id, s in latest.items()}

    assert len(queries) == 1
    assert failures == {lab.pk: 10, prod.pk: 7}
    assert latest_snapshots([]) == {}
    assert set(latest_snapshots([prod.pk])) == {prod.pk}


def test_ettr_over_time_averages_snapshots_per_bucket() -> None:
    lab, prod = ClusterFactory(), ClusterFactory()
    start = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    snapshot_of(lab, start + timedelta(minutes=5), ettr=0.9)
    snapshot_of(lab, start + timedelta(minutes=35), ettr=0.8)
    snapshot_of(lab, start + timedelta(hours=1, minutes=5), ettr=0.7)
    snapshot_of(lab, start + timedelta(hours=1, minutes=10))  # no figure: left out
    snapshot_of(prod, start + timedelta(minutes=20), ettr=1.0)
    snapshot_of(prod, start - timedelta(hours=5), ettr=0.1)  # before the range

    with CaptureQueriesContext(connection) as queries:
        points = ettr_over_time(
            since=start - timedelta(hours=1), until=start + timedelta(hours=2), bucket="hour"
        )
    assert len(queries) == 1
    assert [(p.cluster_id, p.at, round(p.ettr, 6)) for p in points] == sorted(
        [
            (lab.pk, start, 0.85),
            (lab.pk, start + timedelta(hours=1), 0.7),
            (prod.pk, start, 1.0),
        ]
    )
    only_prod = ettr_over_time(
        since=start - timedelta(days=1), until=start + timedelta(days=1), bucket="day", cluster=prod
    )
    expected: list[tuple[datetime, object]] = [(start.replace(hour=0), pytest.approx(0.55))]
    assert [(p.at, p.ettr) for p in only_prod] == expected


def test_anomalies_are_counted_per_bucket_and_category_in_one_query() -> None:
    lab, prod = ClusterFactory(), ClusterFactory()
    day = datetime(2026, 11, 29, tzinfo=UTC)

    def anomaly(cluster: Cluster, at: datetime, category: str, attribution: str) -> None:
        AnomalyFactory(
            workload__cluster=cluster, detected_at=at, category=category, attribution=attribution
        )

    anomaly(lab, day + timedelta(hours=1, minutes=5), "gpu_hardware", "hardware")
    anomaly(lab, day + timedelta(hours=1, minutes=55), "gpu_hardware", "hardware")
    anomaly(lab, day + timedelta(hours=1, minutes=30), "gpu_oom", "application")
    anomaly(prod, day + timedelta(hours=3), "gpu_oom", "application")
    anomaly(prod, day - timedelta(hours=1), "gpu_oom", "application")  # before the range

    with CaptureQueriesContext(connection) as queries:
        counts = anomalies_over_time(
            since=day, until=day + timedelta(days=1), bucket="hour", by="category"
        )
    assert len(queries) == 1
    assert [(c.at, c.key, c.count) for c in counts] == [
        (day + timedelta(hours=1), "gpu_hardware", 2),
        (day + timedelta(hours=1), "gpu_oom", 1),
        (day + timedelta(hours=3), "gpu_oom", 1),
    ]

    by_layer = anomalies_over_time(
        since=day - timedelta(days=1), until=day + timedelta(days=1), bucket="day", by="attribution"
    )
    assert [(c.at, c.key, c.count) for c in by_layer] == [
        (day - timedelta(days=1), "application", 1),
        (day, "application", 2),
        (day, "hardware", 2),
    ]

    only_prod = anomalies_over_time(
        since=day, until=day + timedelta(days=1), bucket="day", by="category", cluster=prod
    )
    assert [(c.key, c.count) for c in only_prod] == [("gpu_oom", 1)]


def test_the_admin_shows_snapshots_read_only(make_user: Callable[..., User]) -> None:
    root = make_user("root", is_staff=True, is_superuser=True)
    snapshot_of(ClusterFactory(), at(0), ettr=0.9)
    client = Client()
    assert client.login(username=root.username, password=TEST_PASSWORD)
    changelist = client.get(reverse("admin:recovery_clustergoodputsnapshot_changelist"))
    assert changelist.status_code == 200
    assert client.get(reverse("admin:recovery_clustergoodputsnapshot_add")).status_code == 403


def test_workloads_recovery_stopped_in_the_window_count_as_given_up() -> None:
    """
    GIVEN one workload recovery stopped inside a 1000 s window, one before it, one that failed
    WHEN the worker takes the snapshot at the window's end
    THEN one is given up, apart from the failures
    """
    cluster = ClusterFactory()
    for stopped_at in (500, 2500):
        workload = WorkloadFactory(cluster=cluster, state=WorkloadState.STOPPED)
        stop = {"recommendation": 1, "stop_reason": "retry_budget", "reason": "after 3 attempts"}
        trail(
            workload,
            [
                (stopped_at - 100, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
                (stopped_at, AuditKind.STOPPED, 1, stop),
            ],
        )
    unrecovered(cluster)
    take_goodput_snapshots(at(3000), window=timedelta(seconds=1000))
    snapshot = ClusterGoodputSnapshot.objects.get(cluster=cluster)
    assert snapshot.given_up == 1
