"""The Insights page's figures, built with plotly's graph objects and drawn by charts.js."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go
from django.utils import timezone

from console.charts import base_layout, colour_for_attribution, colour_for_category
from recovery.choices import Attribution, FailureCategory
from recovery.models import Cluster, ClusterGoodputSnapshot
from recovery.read.insights import AnomalyCount, AnomalyDimension, Bucket, EttrPoint, bucket_labels


@dataclass(frozen=True)
class TimeRange:
    key: str
    label: str
    span: timedelta
    bucket: Bucket


_BUCKET_MS = {"hour": 3_600_000, "day": 86_400_000}
_CATEGORY_LABELS = dict(FailureCategory.choices)
_ATTRIBUTION_LABELS = dict(Attribution.choices)


def empty_figure(message: str) -> go.Figure:
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


def histogram_figure(
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
        return empty_figure("No failure in the window of the newest figures")
    figure.update_layout(
        base_layout(
            barmode="group",
            xaxis={"type": "category", "title": {"text": "seconds, minutes or hours"}},
            yaxis=_count_axis(unit, max(max(trace.y) for trace in figure.data)),
            hovermode="x unified",
        )
    )
    return figure


def ettr_figure(
    points: Sequence[EttrPoint], names: dict[int, str], *, since: datetime, until: datetime
) -> go.Figure:
    """One line per cluster: its snapshots' ETTR, averaged per bucket."""
    if not points:
        return empty_figure("No figures in this range yet")
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


def anomaly_figure(
    counts: Sequence[AnomalyCount],
    by: AnomalyDimension,
    time_range: TimeRange,
    *,
    since: datetime,
    until: datetime,
) -> go.Figure:
    """Stacked bars per hour or day, one colour per category or attribution."""
    if not counts:
        return empty_figure("No anomaly in this range")
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
