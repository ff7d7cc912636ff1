"""Insights: latency distributions, goodput over time, anomalies by category and attribution,
and the precision of the loop's actions.

Goodput figures come from the snapshots the worker takes every few minutes
(``recovery.read.insights``). Anomaly counts are grouped queries over the (much smaller) anomaly
table. Action precision reads only the actions in the range and what judged them
(``recovery.read.precision``), never a whole trail. The figures are built in
``console.insight_charts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.access import console_view
from console.charts import figure_payload
from console.insight_charts import TimeRange, anomaly_figure, ettr_figure, histogram_figure
from recovery.models import Cluster
from recovery.read.insights import (
    BUCKET_SPANS,
    Bucket,
    anomalies_over_time,
    data_span_text,
    ettr_lines,
    ettr_over_time,
    first_data,
    latest_snapshots,
)
from recovery.read.precision import action_precision

# A snapshot older than this many snapshot intervals means the worker is not taking them.
STALE_AFTER_INTERVALS = 3


RANGES = {
    r.key: r
    for r in (
        TimeRange("24h", "Last 24 hours", timedelta(hours=24), "hour"),
        TimeRange("7d", "Last 7 days", timedelta(days=7), "hour"),
        TimeRange("30d", "Last 30 days", timedelta(days=30), "day"),
        TimeRange("90d", "Last 90 days", timedelta(days=90), "day"),
    )
}
DEFAULT_RANGE = "7d"
# Charts over no more than this are drawn per hour, whatever their range's own bucket: a range
# of 30 days over a cluster with 2 days of data shows those 2 days, hour by hour.
HOURLY_UP_TO = timedelta(days=7)


# Insights summarise the audit trail; whoever may read the trail may read them.
@console_view("recovery.view_auditevent", "Viewing insights")
def insights(request: HttpRequest) -> HttpResponse:
    """Latency distributions and ETTR from goodput snapshots; anomalies over time; how many of
    the loop's actions in the range were judged unnecessary."""
    clusters = list(Cluster.objects.order_by("name").only("pk", "name"))
    time_range, cluster, ignored = _insights_filters(request, clusters)
    shown = [cluster] if cluster else clusters
    now = timezone.now()
    since = now - time_range.span
    # The charts start where the data does, when that is later than the range's start.
    firsts = first_data(shown)
    data_since = min(firsts.values(), default=None)
    drawn_since = max(since, data_since) if data_since is not None else since
    bucket: Bucket = "hour" if now - drawn_since <= HOURLY_UP_TO else time_range.bucket
    drawn_since = _bucket_start(drawn_since, bucket)
    latest = latest_snapshots(shown)
    rows = [(c, latest.get(c.pk)) for c in shown]
    newest = max((s.taken_at for s in latest.values()), default=None)
    interval = timedelta(seconds=settings.INSIGHTS_SECONDS)
    anomalies = {
        by: anomalies_over_time(since=since, until=now, bucket=bucket, by=by, cluster=cluster)
        for by in ("category", "attribution")
    }
    names = {c.pk: c.name for c in clusters}
    precision = action_precision(shown, since=since, until=now)
    charts = {
        "detection": histogram_figure(rows, "detection_latency_histogram", "failures"),
        "action": histogram_figure(rows, "action_latency_histogram", "failures"),
        "productive": histogram_figure(rows, "time_to_productive_histogram", "failures"),
        "ettr": ettr_figure(
            ettr_lines(
                # One bucket more: the first bucket shown is compared with the one before.
                ettr_over_time(
                    since=drawn_since - BUCKET_SPANS[bucket],
                    until=now,
                    bucket=bucket,
                    cluster=cluster,
                ),
                firsts,
                bucket=bucket,
                since=drawn_since,
            ),
            names,
            since=drawn_since,
            until=now,
            bucket=bucket,
        ),
        "by_category": anomaly_figure(
            anomalies["category"], "category", bucket, since=drawn_since, until=now
        ),
        "by_attribution": anomaly_figure(
            anomalies["attribution"], "attribution", bucket, since=drawn_since, until=now
        ),
    }
    return render(
        request,
        "console/insights.html",
        {
            "ranges": RANGES.values(),
            "time_range": time_range,
            "bucket": bucket,
            # "1 day of data" when there is less data than the range covers.
            "data_span": (
                data_span_text(now - data_since)
                if data_since is not None and data_since > since
                else ""
            ),
            "cluster": cluster,
            "clusters": clusters,
            "filtered": cluster is not None or time_range.key != DEFAULT_RANGE,
            "ignored": ignored,
            "rows": rows,
            "newest": newest,
            "stale": newest is not None and now - newest > STALE_AFTER_INTERVALS * interval,
            "interval_text": _interval_text(settings.INSIGHTS_SECONDS),
            "anomaly_total": sum(count.count for count in anomalies["category"]),
            "precision": precision,
            "charts": {key: figure_payload(figure) for key, figure in charts.items()},
        },
    )


def _insights_filters(
    request: HttpRequest, clusters: Sequence[Cluster]
) -> tuple[TimeRange, Cluster | None, list[str]]:
    """The range and cluster asked for, and why a value was ignored."""
    ignored: list[str] = []
    range_key = request.GET.get("range", "").strip() or DEFAULT_RANGE
    if range_key not in RANGES:
        ignored.append(
            f"Unknown range “{range_key[:40]}”: showing the {RANGES[DEFAULT_RANGE].label.lower()}"
            f" (choose one of {', '.join(RANGES)})."
        )
        range_key = DEFAULT_RANGE
    name = request.GET.get("cluster", "").strip()
    cluster = next((c for c in clusters if c.name == name), None)
    if name and cluster is None:
        ignored.append(f"Unknown cluster “{name[:63]}”: showing every cluster.")
    return RANGES[range_key], cluster, ignored


def _bucket_start(moment: datetime, bucket: Bucket) -> datetime:
    """The start of the hour or day (UTC, as the buckets are cut) ``moment`` falls in."""
    hour = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return hour if bucket == "hour" else hour.replace(hour=0)


def _interval_text(seconds: int) -> str:
    if seconds % 60 == 0:
        minutes = seconds // 60
        return "minute" if minutes == 1 else f"{minutes} minutes"
    return f"{seconds} seconds"


# --- figures -----------------------------------------------------------------------------------
