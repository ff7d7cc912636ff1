"""ETTR over time for the Insights page: where a cluster's data begins, what each hour added
and the ETTR so far of a young cluster, and the hourly snapshots a recorded history is given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recovery.choices import AuditKind, WorkloadState
from recovery.models import ClusterGoodputSnapshot
from recovery.read.insights import (
    EttrPoint,
    backfill_goodput_snapshots,
    data_span_text,
    ettr_lines,
    first_data,
    window_goodput,
)
from tests.factories import AnomalyFactory, ClusterFactory, WorkloadFactory
from tests.read.test_goodput import trail

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
WEEK = 7 * 86400


def hour(n: float) -> datetime:
    return T0 + timedelta(hours=n)


def point(n: int, wall: float, lost: float, *, cluster: int = 1, window: float = WEEK) -> EttrPoint:
    """The snapshots of hour ``n``: the newest taken 50 minutes into it."""
    return EttrPoint(
        cluster,
        hour(n),
        1 - lost / wall if wall else 1.0,
        wall_s=wall,
        unproductive_s=lost,
        newest_at=hour(n) + timedelta(minutes=50),
        window_s=window,
    )


# --- the lines -----------------------------------------------------------------------------------


def test_a_young_cluster_has_its_ettr_of_each_hour_and_so_far() -> None:
    """
    GIVEN a cluster whose data began at 10:20, with snapshots each hour summing its wall and
          unproductive time, 30 minutes lost in the third hour
    THEN each hour's ETTR is what that hour added, and the ETTR so far is the running figure
    """
    points = [point(0, 3000, 0), point(1, 6600, 0), point(2, 10200, 1800), point(3, 13800, 1800)]
    lines = ettr_lines(points, {1: hour(0) + timedelta(minutes=20)}, bucket="hour", since=hour(0))
    line = lines[1]
    assert [(v.at, v.ettr) for v in line.each] == [
        (hour(0), 1.0),  # its first data came in it: all it has is this hour's
        (hour(1), 1.0),
        (hour(2), pytest.approx(0.5)),  # 1,800 of the 3,600 s added were lost
        (hour(3), 1.0),
    ]
    assert [round(v.ettr, 4) for v in line.so_far] == [1.0, 1.0, 0.8235, 0.8696]
    assert line.trailing == []


def test_an_hour_after_a_gap_in_the_snapshots_adds_nothing_it_cannot_tell() -> None:
    points = [point(0, 3000, 0), point(3, 13800, 1800)]
    line = ettr_lines(points, {1: hour(0)}, bucket="hour", since=hour(0))[1]
    assert [v.at for v in line.each] == [hour(0)]
    assert [v.at for v in line.so_far] == [hour(0), hour(3)]


def test_the_hour_before_the_range_is_read_only_to_compare_with() -> None:
    points = [point(0, 3600, 0), point(1, 7200, 900)]
    line = ettr_lines(points, {1: hour(-5)}, bucket="hour", since=hour(1))[1]
    assert [(v.at, round(v.ettr, 6)) for v in line.each] == [(hour(1), 0.75)]
    assert [v.at for v in line.so_far] == [hour(1)]


def test_a_cluster_older_than_the_window_has_its_trailing_ettr_only() -> None:
    """Figures over a sliding window do not add up: what an hour added is not drawn."""
    points = [point(0, 3600, 0, window=3600), point(1, 3600, 360, window=3600)]
    line = ettr_lines(points, {1: hour(-30)}, bucket="hour", since=hour(0))[1]
    assert line.each == line.so_far == []
    assert [(v.at, round(v.ettr, 2)) for v in line.trailing] == [(hour(0), 1.0), (hour(1), 0.9)]


def test_a_cluster_without_known_data_draws_its_trailing_ettr() -> None:
    line = ettr_lines([point(0, 3600, 0)], {}, bucket="hour", since=hour(0))[1]
    assert [v.ettr for v in line.trailing] == [1.0]


def test_daily_buckets_compare_with_the_day_before() -> None:
    day = T0.replace(hour=0)
    points = [
        EttrPoint(1, day, 1.0, 40_000, 0, day + timedelta(hours=20), WEEK),
        EttrPoint(
            1, day + timedelta(days=1), 0.9, 126_400, 8_640, day + timedelta(days=1, hours=20), WEEK
        ),
    ]
    line = ettr_lines(points, {1: day}, bucket="day", since=day)[1]
    assert [round(v.ettr, 2) for v in line.each] == [1.0, 0.9]


# --- where the data begins ----------------------------------------------------------------------


def test_a_clusters_data_begins_with_its_first_event_snapshot_or_anomaly() -> None:
    by_event, by_snapshot, by_anomaly, empty = (ClusterFactory() for _ in range(4))
    trail(WorkloadFactory(cluster=by_event), [(0, AuditKind.STATE_CHANGED, 1, {})])
    trail(WorkloadFactory(cluster=by_event), [(-60, AuditKind.STATE_CHANGED, 1, {})])
    ClusterGoodputSnapshot.objects.create(cluster=by_snapshot, taken_at=hour(1), window_seconds=1)
    trail(WorkloadFactory(cluster=by_snapshot), [(7200 + 5, AuditKind.STATE_CHANGED, 1, {})])
    AnomalyFactory(workload__cluster=by_anomaly, detected_at=hour(2))

    with CaptureQueriesContext(connection) as queries:
        firsts = first_data([by_event, by_snapshot, by_anomaly, empty])

    assert len(queries) == 1
    assert firsts == {
        by_event.pk: T0 - timedelta(seconds=60),
        by_snapshot.pk: hour(1),
        by_anomaly.pk: hour(2),
    }
    assert first_data([]) == {}


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(seconds=20), "1 minute"),
        (timedelta(minutes=40), "40 minutes"),
        (timedelta(hours=1), "1 hour"),
        (timedelta(hours=5, minutes=20), "5 hours"),
        (timedelta(hours=23, minutes=50), "1 day"),
        (timedelta(days=1, minutes=10), "1 day"),
        (timedelta(days=2, hours=12), "2.5 days"),
    ],
)
def test_the_span_of_data_in_words(span: timedelta, text: str) -> None:
    assert data_span_text(span) == text


# --- hourly snapshots for a recorded history ----------------------------------------------------


def test_a_recorded_history_gets_the_hourly_snapshots_the_worker_would_have_taken() -> None:
    """
    GIVEN a workload running from 10:00, failing at 11:30 and training again at 11:45, recorded
          all at once, and a snapshot taken now at 13:20
    WHEN the history is backfilled
    THEN each whole hour since it began has a snapshot with the figures up to that hour, once
    """
    cluster = ClusterFactory()
    workload = WorkloadFactory(cluster=cluster, state=WorkloadState.RUNNING)
    trail(
        workload,
        [
            (0, AuditKind.STATE_CHANGED, 1, {"to": "running"}),
            (3000, AuditKind.CHECKPOINT_SAVED, 1, {"step": 30}),
            (5402, AuditKind.DETECTED, 1, {"evidence_at": hour(1.5).isoformat()}),
            (6300, AuditKind.PROGRESS_RESUMED, 2, {"step": 30}),
            (9000, AuditKind.CHECKPOINT_SAVED, 2, {"step": 90}),
        ],
    )
    now = hour(3) + timedelta(minutes=20)
    ClusterGoodputSnapshot.objects.create(cluster=cluster, taken_at=now, window_seconds=WEEK)

    assert backfill_goodput_snapshots(now, since=T0) == 3
    assert backfill_goodput_snapshots(now, since=T0) == 0

    taken = ClusterGoodputSnapshot.objects.filter(cluster=cluster).order_by("taken_at")
    assert [s.taken_at for s in taken] == [hour(1), hour(2), hour(3), now]
    at_two = taken[1]
    expected = window_goodput(cluster, start=hour(2) - timedelta(days=7), end=hour(2))
    assert at_two.wall_seconds == expected.wall_s == 7200
    # 40 minutes of work lost since the checkpoint at 10:50, then 15 minutes down.
    assert at_two.unproductive_seconds == expected.unproductive_s == 2400 + 900
    assert at_two.failures == 1
    assert taken[0].failures == 0


def test_backfilling_goes_back_a_window_at_most_and_never_before_the_data() -> None:
    cluster = ClusterFactory()
    trail(WorkloadFactory(cluster=cluster), [(0, AuditKind.STATE_CHANGED, 1, {"to": "running"})])
    young = ClusterFactory()
    trail(WorkloadFactory(cluster=young), [(28.5 * 3600, AuditKind.STATE_CHANGED, 1, {})])
    ClusterFactory()  # no data at all: no snapshot
    now = hour(30)
    # The whole hours in (now - 5 h, now), 12:00 to 15:00 of the next day; for the young
    # cluster, those after its first event at 14:30.
    assert backfill_goodput_snapshots(now, since=T0, window=timedelta(hours=5)) == 4 + 1
    assert ClusterGoodputSnapshot.objects.filter(cluster=young).get().taken_at == hour(29)
