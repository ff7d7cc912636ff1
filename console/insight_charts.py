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
from recovery.read.insights import (
    AnomalyCount,
    AnomalyDimension,
    Bucket,
    EttrLines,
    EttrValue,
    bucket_labels,
)


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


# One colour per cluster, the same for its lines; plotly's own first colours.
CLUSTER_COLOURS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692")


def ettr_figure(
    lines: dict[int, EttrLines],
    names: dict[int, str],
    *,
    since: datetime,
    until: datetime,
    bucket: Bucket = "hour",
) -> go.Figure:
    """Per cluster, in its own colour: its ETTR in each bucket (lines and markers) and its
    ETTR so far (dashed) while its history fits the snapshots' window, and its ETTR over the
    trailing window (dotted) once it no longer does."""
    if not any(line.each or line.so_far or line.trailing for line in lines.values()):
        return empty_figure("No figures in this range yet")
    figure = go.Figure()
    for index, cluster_id in enumerate(sorted(lines, key=lambda c: names.get(c, str(c)))):
        name = names.get(cluster_id, str(cluster_id))
        colour = CLUSTER_COLOURS[index % len(CLUSTER_COLOURS)]
        line = lines[cluster_id]
        for values, label, dash, mode in (
            (line.each, f"each {bucket}", "solid", "lines+markers"),
            (line.so_far, "so far", "dash", "lines+markers"),
            (line.trailing, "over the trailing window", "dot", "lines+markers"),
        ):
            if not values:
                continue
            figure.add_trace(_ettr_trace(values, f"{name}: {label}", name, colour, dash, mode))
    figure.update_layout(
        base_layout(
            xaxis={"type": "date", "range": [_plotly_time(since), _plotly_time(until)]},
            yaxis={"title": {"text": "ETTR"}, "tickformat": ".0%", "range": [0, 1.02]},
        )
    )
    return figure


def _ettr_trace(
    values: Sequence[EttrValue], label: str, cluster: str, colour: str, dash: str, mode: str
) -> go.Scatter:
    return go.Scatter(
        name=label,
        legendgroup=cluster,
        x=[_plotly_time(v.at) for v in values],
        y=[v.ettr for v in values],
        mode=mode,
        line={"color": colour, "dash": dash, "width": 2},
        marker={"size": 5, "color": colour},
        connectgaps=False,
        hovertemplate=f"%{{x}}: %{{y:.1%}}<extra>{label}</extra>",
    )


def anomaly_figure(
    counts: Sequence[AnomalyCount],
    by: AnomalyDimension,
    bucket: Bucket,
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
                xperiod=_BUCKET_MS[bucket],
                xperiodalignment="middle",
                hovertemplate=f"%{{y}} {name}<extra></extra>",
            )
        )
    figure.update_layout(
        base_layout(
            barmode="stack",
            bargap=0.15,
            xaxis={"type": "date", "range": [_plotly_time(since), _plotly_time(until)]},
            yaxis=_count_axis(f"anomalies per {bucket}", _tallest_stack(counts)),
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
