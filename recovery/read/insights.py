"""Insights: periodic goodput snapshots per cluster, and anomalies counted over time.

A cluster's goodput figures are computed from its audit trail (``recovery.read.goodput``), which may
hold a million events: far too many to read during a request. ``take_goodput_snapshots`` runs
in the worker every few minutes, streams only what the figures need for the workloads active in
a trailing window, and stores one ``ClusterGoodputSnapshot`` per cluster. Pages read snapshots
(``latest_snapshots``, ``ettr_over_time``) and count anomalies with grouped queries over their
detection time (``anomalies_over_time``), which the Anomaly index on ``detected_at`` serves.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypedDict

from django.db import transaction
from django.db.models import Avg, Count, Max, Min, OuterRef, QuerySet, Subquery
from django.db.models.functions import TruncDay, TruncHour

from recovery.audit import live
from recovery.choices import AuditKind
from recovery.models import Anomaly, AuditEvent, Cluster, ClusterGoodputSnapshot
from recovery.read.goodput import (
    Distribution,
    Failure,
    goodput_of_workloads,
)

# Figures cover the workloads with events in this trailing window.
SNAPSHOT_WINDOW = timedelta(days=7)
# Snapshots are derived data: older ones are pruned. The Console's longest range is 90 days.
SNAPSHOT_RETENTION = timedelta(days=90)
# Past this age one snapshot per cluster and hour is enough for the charts; thinning keeps
# 90 days at about 2,200 rows per cluster instead of 26,000 at the default interval. Each run
# thins the day before the cut-off, so a worker that was down for a while catches up.
SNAPSHOT_THIN_AFTER = timedelta(days=2)
SNAPSHOT_THIN_SPAN = timedelta(days=1)
# Lower edges of the histogram buckets, in seconds; the last bucket is open-ended. Fixed, so
# snapshots taken at different times compare bucket by bucket.
DETECTION_LATENCY_EDGES = (0, 1, 2, 5, 10, 30, 60, 120, 300, 600)
ACTION_LATENCY_EDGES = (0, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TIME_TO_PRODUCTIVE_EDGES = (0, 60, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200)

Bucket = Literal["hour", "day"]
AnomalyDimension = Literal["category", "attribution"]


# --- taking snapshots ------------------------------------------------------------------------


class Histogram(TypedDict):
    edges: list[float]
    counts: list[int]


@dataclass(frozen=True)
class WindowGoodput:
    """A cluster's figures over ``[start, end]``: what one snapshot stores."""

    workloads: int
    failures: int
    # Workloads recovery stopped in the window (one ``stopped`` event each).
    given_up: int
    wall_s: float
    unproductive_s: float
    detection_latency_s: Distribution
    action_latency_s: Distribution
    time_to_productive_s: Distribution
    work_lost_s: Distribution
    detection_latency_histogram: Histogram
    action_latency_histogram: Histogram
    time_to_productive_histogram: Histogram

    @property
    def ettr(self) -> float | None:
        if self.wall_s <= 0:
            return None
        return max(0.0, min(1.0, (self.wall_s - self.unproductive_s) / self.wall_s))


def take_goodput_snapshots(now: datetime, *, window: timedelta = SNAPSHOT_WINDOW) -> int:
    """Store every cluster's figures over the window ending at ``now``; return how many.

    Running it again for the same ``now`` rewrites the same rows (one per cluster and time).
    Old snapshots are thinned and pruned (``prune_goodput_snapshots``); the audit trail is
    never touched.
    """
    start = now - window
    written = 0
    for cluster in Cluster.objects.order_by("pk"):
        figures = window_goodput(cluster, start=start, end=now)
        ClusterGoodputSnapshot.objects.update_or_create(
            cluster=cluster,
            taken_at=now,
            defaults=_snapshot_fields(figures, cluster, start=start, end=now),
        )
        written += 1
    prune_goodput_snapshots(now)
    transaction.on_commit(lambda: live.announce_snapshots(now, written))
    return written


def backfill_goodput_snapshots(
    now: datetime, *, since: datetime, window: timedelta = SNAPSHOT_WINDOW
) -> int:
    """Take the hourly snapshots a history recorded before the worker ran would have had: one
    per cluster at each whole hour in ``(since, now)`` after its first data that has none yet,
    at most a window's worth; return how many were written.

    For a trail written all at once, such as the demo fleet's, so the Insights page draws its
    ETTR over time from the start. Each is computed from the trail up to its hour, with one
    difference from a snapshot taken then: a workload that has finished since ends its wall
    time at its last event before the hour, not at the hour.
    """
    clusters = list(Cluster.objects.order_by("pk"))
    firsts = first_data(clusters)
    written = 0
    for cluster in clusters:
        # From the cluster's first data on: no figures before it had any.
        start = max(since, now - window, firsts.get(cluster.pk, now))
        hours = []
        hour = _hour_of(start) + timedelta(hours=1)
        while hour < now:
            hours.append(hour)
            hour += timedelta(hours=1)
        if not hours:
            continue
        taken = {
            _hour_of(at)
            for at in ClusterGoodputSnapshot.objects.filter(
                cluster=cluster, taken_at__gte=hours[0], taken_at__lt=now
            ).values_list("taken_at", flat=True)
        }
        for hour in hours:
            if hour in taken:
                continue
            figures = window_goodput(cluster, start=hour - window, end=hour)
            ClusterGoodputSnapshot.objects.update_or_create(
                cluster=cluster,
                taken_at=hour,
                defaults=_snapshot_fields(figures, cluster, start=hour - window, end=hour),
            )
            written += 1
    return written


def prune_goodput_snapshots(now: datetime) -> int:
    """Remove snapshots past the retention, and thin older ones to the first of each cluster
    and hour; return how many went."""
    deleted, _ = ClusterGoodputSnapshot.objects.filter(
        taken_at__lt=now - SNAPSHOT_RETENTION
    ).delete()
    cutoff = now - SNAPSHOT_THIN_AFTER
    # From an hour boundary, so the first snapshot of every hour seen is the hour's first.
    start = _hour_of(cutoff - SNAPSHOT_THIN_SPAN)
    seen: set[tuple[int, datetime]] = set()
    extra: list[int] = []
    rows = (
        ClusterGoodputSnapshot.objects.filter(taken_at__gte=start, taken_at__lt=cutoff)
        .order_by("cluster_id", "taken_at")
        .values_list("pk", "cluster_id", "taken_at")
    )
    for pk, cluster_id, taken_at in rows:
        hour = (cluster_id, _hour_of(taken_at))
        if hour in seen:
            extra.append(pk)
        seen.add(hour)
    for offset in range(0, len(extra), 1000):
        thinned, _ = ClusterGoodputSnapshot.objects.filter(
            pk__in=extra[offset : offset + 1000]
        ).delete()
        deleted += thinned
    return deleted


def _hour_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def window_goodput(cluster: Cluster, *, start: datetime, end: datetime) -> WindowGoodput:
    """The cluster's figures over the workloads with events in ``(start, end]``.

    Each workload's trail is read whole (only the kinds the figures use, up to ``end``), since
    a failure in the window may follow a checkpoint from before it. Failures count when they
    were detected in the window; wall and unproductive time are clipped to it, so with every
    event inside the window the figures equal ``recovery.read.goodput.cluster_goodput``.
    """
    active = list(
        AuditEvent.objects.filter(
            cluster=cluster, workload__isnull=False, occurred_at__gt=start, occurred_at__lte=end
        )
        .order_by()  # no ordering columns in the DISTINCT
        .values_list("workload_id", flat=True)
        .distinct()
    )
    failures: list[Failure] = []
    wall_s = 0.0
    unproductive_s = 0.0
    for _, figure in goodput_of_workloads(sorted(active), now=end):
        failures.extend(f for f in figure.failures if start < f.detected_at <= end)
        if figure.started_at is None or figure.ended_at is None:
            continue
        wall_s += _overlap(figure.started_at, figure.ended_at, start, end)
        unproductive_s += sum(_overlap(a, b, start, end) for a, b in figure.unproductive_spans())
    detection = [f.detection_latency_s for f in failures]
    action = [f.action_latency_s for f in failures]
    productive_again = [f.time_to_productive_s for f in failures]
    return WindowGoodput(
        workloads=len(active),
        failures=len(failures),
        given_up=AuditEvent.objects.filter(
            cluster=cluster, kind=AuditKind.STOPPED, occurred_at__gt=start, occurred_at__lte=end
        ).count(),
        wall_s=wall_s,
        unproductive_s=unproductive_s,
        detection_latency_s=Distribution.of(detection),
        action_latency_s=Distribution.of(action),
        time_to_productive_s=Distribution.of(productive_again),
        work_lost_s=Distribution.of(f.work_lost_s for f in failures),
        detection_latency_histogram=histogram(detection, DETECTION_LATENCY_EDGES),
        action_latency_histogram=histogram(action, ACTION_LATENCY_EDGES),
        time_to_productive_histogram=histogram(productive_again, TIME_TO_PRODUCTIVE_EDGES),
    )


def _overlap(a: datetime, b: datetime, start: datetime, end: datetime) -> float:
    return max((min(b, end) - max(a, start)).total_seconds(), 0.0)


def histogram(values: Iterable[float | None], edges: Sequence[float]) -> Histogram:
    """Counts of the known values per bucket: ``counts[i]`` from ``edges[i]`` to the next edge,
    the last bucket open-ended; values below the first edge count in the first bucket."""
    counts = [0] * len(edges)
    for value in values:
        if value is not None:
            counts[max(bisect_right(edges, value) - 1, 0)] += 1
    return {"edges": list(edges), "counts": counts}


def _snapshot_fields(
    figures: WindowGoodput, cluster: Cluster, *, start: datetime, end: datetime
) -> dict[str, Any]:
    anomalies = Anomaly.objects.filter(
        workload__cluster=cluster, detected_at__gt=start, detected_at__lte=end
    ).order_by()
    return {
        "window_seconds": round((end - start).total_seconds()),
        "workloads": figures.workloads,
        "failures": figures.failures,
        "given_up": figures.given_up,
        "ettr": figures.ettr,
        "wall_seconds": figures.wall_s,
        "unproductive_seconds": figures.unproductive_s,
        "detection_latency_median": figures.detection_latency_s.median,
        "detection_latency_p95": figures.detection_latency_s.p95,
        "action_latency_median": figures.action_latency_s.median,
        "action_latency_p95": figures.action_latency_s.p95,
        "time_to_productive_median": figures.time_to_productive_s.median,
        "time_to_productive_p95": figures.time_to_productive_s.p95,
        "work_lost_median": figures.work_lost_s.median,
        "work_lost_p95": figures.work_lost_s.p95,
        "detection_latency_histogram": figures.detection_latency_histogram,
        "action_latency_histogram": figures.action_latency_histogram,
        "time_to_productive_histogram": figures.time_to_productive_histogram,
        "anomalies_by_category": dict(
            anomalies.values("category").annotate(n=Count("id")).values_list("category", "n")
        ),
        "anomalies_by_attribution": dict(
            anomalies.values("attribution").annotate(n=Count("id")).values_list("attribution", "n")
        ),
    }


# --- reading them ------------------------------------------------------------------------------


def latest_snapshots(clusters: Iterable[Cluster | int]) -> dict[int, ClusterGoodputSnapshot]:
    """The newest snapshot of each cluster that has one, by cluster id, in one query.

    The newest is looked up once per cluster (on the cluster-and-time index), so the cost
    grows with the clusters asked for, not with the snapshots kept.
    """
    ids = [cluster if isinstance(cluster, int) else cluster.pk for cluster in clusters]
    if not ids:
        return {}
    newest = (
        ClusterGoodputSnapshot.objects.filter(cluster_id=OuterRef("pk"))
        .order_by("-taken_at")
        .values("pk")[:1]
    )
    per_cluster = Cluster.objects.filter(pk__in=ids).annotate(newest=Subquery(newest))
    rows = ClusterGoodputSnapshot.objects.filter(pk__in=per_cluster.values("newest")).order_by()
    return {snapshot.cluster_id: snapshot for snapshot in rows}


@dataclass(frozen=True)
class EttrPoint:
    """A cluster's snapshots in one hour or day: their ETTR averaged, and what the newest of
    them had summed (wall and unproductive seconds, never less as a young cluster ages)."""

    cluster_id: int
    at: datetime
    ettr: float
    wall_s: float = 0.0
    unproductive_s: float = 0.0
    # The newest snapshot in the bucket, and the shortest window among them.
    newest_at: datetime | None = None
    window_s: float | None = None

    def covers_since(self, first_data: datetime | None) -> bool:
        """Whether the bucket's snapshots reach back to the cluster's first data: their
        figures are then its whole history, summed since it began."""
        if first_data is None or self.newest_at is None or self.window_s is None:
            return False
        return self.newest_at - timedelta(seconds=self.window_s) <= first_data


BUCKET_SPANS: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


def ettr_over_time(
    *, since: datetime, until: datetime, bucket: Bucket, cluster: Cluster | None = None
) -> list[EttrPoint]:
    """Each cluster's snapshots per hour or day, oldest first; one query.

    At most one point per cluster and bucket, however often snapshots are taken.
    """
    snapshots = ClusterGoodputSnapshot.objects.filter(
        taken_at__gt=since, taken_at__lte=until, ettr__isnull=False
    )
    if cluster is not None:
        snapshots = snapshots.filter(cluster=cluster)
    rows = (
        snapshots.annotate(at=_trunc(bucket, "taken_at"))
        .order_by()
        .values("cluster_id", "at")
        .annotate(
            ettr=Avg("ettr"),
            wall=Max("wall_seconds"),
            unproductive=Max("unproductive_seconds"),
            newest=Max("taken_at"),
            window=Min("window_seconds"),
        )
        .order_by("cluster_id", "at")
    )
    return [
        EttrPoint(
            row["cluster_id"],
            row["at"],
            row["ettr"],
            wall_s=row["wall"] or 0.0,
            unproductive_s=row["unproductive"] or 0.0,
            newest_at=row["newest"],
            window_s=row["window"],
        )
        for row in rows
    ]


@dataclass(frozen=True)
class EttrValue:
    at: datetime
    ettr: float


@dataclass
class EttrLines:
    """What the ETTR chart draws of one cluster.

    ``each`` is the ETTR of what each bucket added: productive over wall time accrued between
    the newest snapshots of the bucket and of the one before (a bucket in which a failure was
    detected also bears the work lost before it, back to the last checkpoint). ``so_far`` is
    the cluster's ETTR since its first data, and ``trailing`` its ETTR over the snapshots'
    trailing window. A young cluster, whose whole history lies inside the window, has the
    first two; buckets whose window no longer reaches its first data have ``trailing`` only:
    figures over a sliding window do not add up to what one bucket added.
    """

    each: list[EttrValue] = field(default_factory=list)
    so_far: list[EttrValue] = field(default_factory=list)
    trailing: list[EttrValue] = field(default_factory=list)


def ettr_lines(
    points: Iterable[EttrPoint],
    first_data: dict[int, datetime],
    *,
    bucket: Bucket,
    since: datetime,
) -> dict[int, EttrLines]:
    """Each cluster's lines from ``ettr_over_time`` points, oldest first; points before
    ``since`` (read so the first bucket shown has one before it) only serve as that."""
    step = BUCKET_SPANS[bucket]
    lines: dict[int, EttrLines] = {}
    previous: dict[int, EttrPoint] = {}
    for point in sorted(points, key=lambda p: (p.cluster_id, p.at)):
        line = lines.setdefault(point.cluster_id, EttrLines())
        start = first_data.get(point.cluster_id)
        whole = point.covers_since(start)
        before = previous.get(point.cluster_id)
        previous[point.cluster_id] = point
        if point.at < _floor(since, bucket):
            continue
        if not whole:
            line.trailing.append(EttrValue(point.at, point.ettr))
            continue
        line.so_far.append(EttrValue(point.at, _ratio(point.wall_s, point.unproductive_s, point)))
        if before is not None and before.at == point.at - step and before.covers_since(start):
            added = point.wall_s - before.wall_s
            lost = point.unproductive_s - before.unproductive_s
        elif before is None and start is not None and start >= point.at - step:
            added, lost = point.wall_s, point.unproductive_s  # its first data came in it
        else:
            continue  # no snapshot in the bucket before: what this one added is unknown
        if added > 0:
            line.each.append(EttrValue(point.at, max(0.0, min(1.0, 1 - max(lost, 0.0) / added))))
    return lines


def _ratio(wall_s: float, unproductive_s: float, point: EttrPoint) -> float:
    if wall_s <= 0:
        return point.ettr
    return max(0.0, min(1.0, (wall_s - unproductive_s) / wall_s))


def _floor(moment: datetime, bucket: Bucket) -> datetime:
    hour = _hour_of(moment)
    return hour if bucket == "hour" else hour.replace(hour=0)


def first_data(clusters: Iterable[Cluster | int]) -> dict[int, datetime]:
    """When each cluster's data begins: its first audit event, goodput snapshot or anomaly,
    whichever came first; one query of three grouped minimums (the first two on their
    (cluster, time) indexes, the third over the much smaller anomaly table). A cluster with
    none is left out."""
    ids = [cluster if isinstance(cluster, int) else cluster.pk for cluster in clusters]
    if not ids:
        return {}
    events = (
        AuditEvent.objects.filter(cluster_id__in=ids)
        .order_by()
        .values("cluster_id")
        .annotate(first=Min("occurred_at"))
        .values_list("cluster_id", "first")
    )
    snapshots = (
        ClusterGoodputSnapshot.objects.filter(cluster_id__in=ids)
        .order_by()
        .values("cluster_id")
        .annotate(first=Min("taken_at"))
        .values_list("cluster_id", "first")
    )
    anomalies = (
        Anomaly.objects.filter(workload__cluster_id__in=ids)
        .order_by()
        .values("workload__cluster_id")
        .annotate(first=Min("detected_at"))
        .values_list("workload__cluster_id", "first")
    )
    firsts: dict[int, datetime] = {}
    for cluster_id, first in events.union(snapshots, anomalies, all=True):
        if cluster_id is not None and first is not None:
            firsts[cluster_id] = min(first, firsts.get(cluster_id, first))
    return firsts


def data_span_text(span: timedelta) -> str:
    """How much data there is, in words: "40 minutes", "5 hours", "1 day", "2.5 days"."""
    seconds = max(span.total_seconds(), 0.0)
    if seconds < 3600:
        minutes = max(round(seconds / 60), 1)
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    if seconds < 86400:
        hours = round(seconds / 3600)
        return "1 day" if hours == 24 else f"{hours} hour{'s' if hours != 1 else ''}"
    days = round(seconds / 86400, 1)
    shown = f"{days:g}"
    return f"{shown} day{'s' if shown != '1' else ''}"


@dataclass(frozen=True)
class AnomalyCount:
    at: datetime
    key: str
    count: int


def anomalies_over_time(
    *,
    since: datetime,
    until: datetime,
    bucket: Bucket,
    by: AnomalyDimension,
    cluster: Cluster | None = None,
) -> list[AnomalyCount]:
    """Anomalies detected in ``(since, until]`` counted per hour or day and per category or
    attribution, oldest first; one grouped query."""
    anomalies: QuerySet[Anomaly] = Anomaly.objects.filter(
        detected_at__gt=since, detected_at__lte=until
    )
    if cluster is not None:
        anomalies = anomalies.filter(workload__cluster=cluster)
    rows = (
        anomalies.annotate(at=_trunc(bucket, "detected_at"))
        .order_by()
        .values("at", by)
        .annotate(n=Count("id"))
        .order_by("at", by)
    )
    return [AnomalyCount(row["at"], row[by], row["n"]) for row in rows]


def _trunc(bucket: Bucket, field: str) -> TruncHour | TruncDay:
    # Buckets are cut in UTC: the database needs no time zone tables for that.
    return TruncHour(field, tzinfo=UTC) if bucket == "hour" else TruncDay(field, tzinfo=UTC)


def bucket_labels(edges: Sequence[float]) -> list[str]:
    """Readable names of histogram buckets, such as "0-1 s", "30 s-1 min", "≥ 10 min" (with an
    en dash between the bounds)."""
    if not edges:
        return []
    parts = [_duration_parts(edge) for edge in edges]
    labels = []
    for (low, low_unit), (high, high_unit) in itertools.pairwise(parts):
        start = low if low == "0" or low_unit == high_unit else f"{low} {low_unit}"
        labels.append(f"{start}\N{EN DASH}{high} {high_unit}")
    number, unit = parts[-1]
    return [*labels, f"≥ {number} {unit}"]


def _duration_parts(seconds: float) -> tuple[str, str]:
    if seconds < 60:
        return f"{seconds:g}", "s"
    if seconds < 3600:
        return f"{seconds / 60:g}", "min"
    return f"{seconds / 3600:g}", "h"
