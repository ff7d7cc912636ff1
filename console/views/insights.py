"""Insights: latency distributions, goodput over time, anomalies by category and attribution.

Goodput figures come from the snapshots the worker takes every few minutes
(``recovery.insights``); nothing here reads the audit trail. Anomaly counts are grouped queries
over the (much smaller) anomaly table. Every figure is built here and drawn by charts.js.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.charts import base_layout, colour_for_attribution, colour_for_category, figure_payload
from recovery.choices import Attribution, FailureCategory
from recovery.insights import (
    AnomalyCount,
    AnomalyDimension,
    Bucket,
    EttrPoint,
    anomalies_over_time,
    bucket_labels,
    ettr_over_time,
    latest_snapshots,
)
from recovery.models import Cluster, ClusterGoodputSnapshot

# Insights summarise the audit trail; whoever may read the trail may read them.
VIEW_INSIGHTS_PERMISSION = "recovery.view_auditevent"
# A snapshot older than this many snapshot intervals means the worker is not taking them.
STALE_AFTER_INTERVALS = 3


@dataclass(frozen=True)
class TimeRange:
    key: str
    label: str
    span: timedelta
    bucket: Bucket


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

_BUCKET_MS = {"hour": 3_600_000, "day": 86_400_000}
_CATEGORY_LABELS = dict(FailureCategory.choices)
_ATTRIBUTION_LABELS = dict(Attribution.choices)


@login_required
def insights(request: HttpRequest) -> HttpResponse:
    """Latency distributions and ETTR from goodput snapshots; anomalies over time."""
    if not request.user.has_perm(VIEW_INSIGHTS_PERMISSION):
        raise PermissionDenied("Insights need a Console role (viewer or above).")
    clusters = list(Cluster.objects.order_by("name").only("pk", "name"))
    time_range, cluster, ignored = _insights_filters(request, clusters)
    shown = [cluster] if cluster else clusters
    now = timezone.now()
    since = now - time_range.span
    latest = latest_snapshots(shown)
    rows = [(c, latest.get(c.pk)) for c in shown]
    newest = max((s.taken_at for s in latest.values()), default=None)
    interval = timedelta(seconds=settings.INSIGHTS_SECONDS)
    anomalies = {
        by: anomalies_over_time(
            since=since, until=now, bucket=time_range.bucket, by=by, cluster=cluster
        )
        for by in ("category", "attribution")
    }
    names = {c.pk: c.name for c in clusters}
    charts = {
        "detection": _histogram_figure(rows, "detection_latency_histogram", "failures"),
        "action": _histogram_figure(rows, "action_latency_histogram", "failures"),
        "productive": _histogram_figure(rows, "time_to_productive_histogram", "failures"),
        "ettr": _ettr_figure(
            ettr_over_time(since=since, until=now, bucket=time_range.bucket, cluster=cluster),
            names,
            since=since,
            until=now,
        ),
        "by_category": _anomaly_figure(
            anomalies["category"], "category", time_range, since=since, until=now
        ),
        "by_attribution": _anomaly_figure(
            anomalies["attribution"], "attribution", time_range, since=since, until=now
        ),
    }
    return render(
        request,
        "console/insights.html",
        {
            "ranges": RANGES.values(),
            "time_range": time_range,
            "cluster": cluster,
            "clusters": clusters,
            "filtered": cluster is not None or time_range.key != DEFAULT_RANGE,
            "ignored": ignored,
            "rows": rows,
            "newest": newest,
            "stale": newest is not None and now - newest > STALE_AFTER_INTERVALS * interval,
            "interval_text": _interval_text(settings.INSIGHTS_SECONDS),
            "anomaly_total": sum(count.count for count in anomalies["category"]),
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


def _interval_text(seconds: int) -> str:
    if seconds % 60 == 0:
        minutes = seconds // 60
        return "minute" if minutes == 1 else f"{minutes} minutes"
    return f"{seconds} seconds"


# --- figures -----------------------------------------------------------------------------------


def _empty_figure(message: str) -> go.Figure:
    """A figure that says why it has nothing to draw, at the same height as the others."""
    hidden = {"visible": False}
    return go.Figure(
        layout=base_layout(
            xaxis=hidden,
            yaxis=hidden,
            annotations=[
                {
                    "text": message,
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": 0.5,
                }
            ],
        )
    )


def _histogram_figure(
    rows: Iterable[tuple[Cluster, ClusterGoodputSnapshot | None]], field: str, unit: str
) -> go.Figure:
    """One bar per bucket and cluster, from each cluster's newest snapshot."""
    figure = go.Figure()
    for cluster, snapshot in rows:
        histogram = getattr(snapshot, field, None) or {}
        edges, counts = histogram.get("edges") or [], histogram.get("counts") or []
        if not any(counts):
            continue
        figure.add_trace(
            go.Bar(
                name=cluster.name,
                x=bucket_labels(edges),
                y=counts,
                hovertemplate=f"%{{x}}: %{{y}} {unit}<extra>{cluster.name}</extra>",
            )
        )
    if not figure.data:
        return _empty_figure("No failure in the window of the newest figures")
    figure.update_layout(
        base_layout(
            barmode="group",
            xaxis={"type": "category", "title": {"text": "seconds, minutes or hours"}},
            yaxis=_count_axis(unit, max(max(trace.y) for trace in figure.data)),
            hovermode="x unified",
        )
    )
    return figure


def _ettr_figure(
    points: Sequence[EttrPoint], names: dict[int, str], *, since: datetime, until: datetime
) -> go.Figure:
    """One line per cluster: its snapshots' ETTR, averaged per bucket."""
    if not points:
        return _empty_figure("No figures in this range yet")
    by_cluster: dict[int, list[EttrPoint]] = defaultdict(list)
    for point in points:
        by_cluster[point.cluster_id].append(point)
    figure = go.Figure()
    for cluster_id, series in by_cluster.items():
        name = names.get(cluster_id, str(cluster_id))
        figure.add_trace(
            go.Scatter(
                name=name,
                x=[_plotly_time(p.at) for p in series],
                y=[p.ettr for p in series],
                mode="lines+markers",
                marker={"size": 4},
                hovertemplate=f"%{{x}}: %{{y:.1%}}<extra>{name}</extra>",
            )
        )
    figure.update_layout(
        base_layout(
            xaxis={"type": "date", "range": [_plotly_time(since), _plotly_time(until)]},
            yaxis={"title": {"text": "ETTR"}, "tickformat": ".0%", "range": [0, 1.02]},
        )
    )
    return figure


def _anomaly_figure(
    counts: Sequence[AnomalyCount],
    by: AnomalyDimension,
    time_range: TimeRange,
    *,
    since: datetime,
    until: datetime,
) -> go.Figure:
    """Stacked bars per hour or day, one colour per category or attribution."""
    if not counts:
        return _empty_figure("No anomaly in this range")
    labels = _CATEGORY_LABELS if by == "category" else _ATTRIBUTION_LABELS
    colour = colour_for_category if by == "category" else colour_for_attribution
    by_key: dict[str, list[AnomalyCount]] = defaultdict(list)
    for count in counts:
        by_key[count.key].append(count)
    order = [key for key in labels if key in by_key] + sorted(set(by_key) - set(labels))
    figure = go.Figure()
    for key in order:
        name = labels.get(key) or "Uncategorised"
        figure.add_trace(
            go.Bar(
                name=name,
                x=[_plotly_time(c.at) for c in by_key[key]],
                y=[c.count for c in by_key[key]],
                marker={"color": colour(key or None)},
                xperiod=_BUCKET_MS[time_range.bucket],
                xperiodalignment="middle",
                hovertemplate=f"%{{y}} {name}<extra></extra>",
            )
        )
    figure.update_layout(
        base_layout(
            barmode="stack",
            bargap=0.15,
            xaxis={"type": "date", "range": [_plotly_time(since), _plotly_time(until)]},
            yaxis=_count_axis(f"anomalies per {time_range.bucket}", _tallest_stack(counts)),
            hovermode="x unified",
        )
    )
    return figure


def _count_axis(title: str, highest: int) -> dict[str, Any]:
    """A y axis of counts: from zero, and one tick per unit while counts are small (plotly
    would otherwise label halves, rounded to repeated integers)."""
    axis: dict[str, Any] = {"title": {"text": title}, "rangemode": "tozero"}
    if highest <= 5:
        axis["dtick"] = 1
    return axis


def _tallest_stack(counts: Iterable[AnomalyCount]) -> int:
    totals: dict[datetime, int] = defaultdict(int)
    for count in counts:
        totals[count.at] += count.count
    return max(totals.values(), default=0)


def _plotly_time(at: datetime) -> str:
    # plotly reads dates without a zone; show them in the Console's time zone.
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S")
