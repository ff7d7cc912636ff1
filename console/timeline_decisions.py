"""The timeline's decisions row: recommendations, and what operators, controllers and the
watchdog did about them, as markers on the top panel's first row.

Apart from the attempts' bars (``console.timeline``) because these markers are grouped: decisions
closer together than the chart can tell apart are drawn as one marker that lists each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import plotly.graph_objects as go

from console.timeline_common import (
    REASON_HOVER_CHARS,
    _clip,
    _esc,
    _hover,
    _shown_time,
    _wrapped,
    compressed_nodes,
    plot_time,
)
from recovery.choices import AuditKind, RecommendationAction, RecommendationStatus
from recovery.models import AuditEvent, Recommendation
from recovery.read.timeline import TimelineData

DECISIONS_ROW = "Decisions & actions"
# Decisions closer than this share of the chart's time span are drawn as one marker. A marker
# is 12 to 14 px wide and the plot some 800 to 1,000 px, so markers nearer than about 1 % of
# the span overlap: at 24 h that is 15 minutes, in which a recommendation, its approval and the
# scheduler action usually all fall. The hover lists each.
SAME_MOMENT_SHARE = 0.01
SEVERAL_MARKER = ("circle", "#5b6270")
SEVERAL_NAME = "Several at once"

RECOMMENDATION_MARKER = ("star", "#8e63ce")
# What operators, controllers and the watchdog did: (symbol, colour) per kind.
DECISION_MARKERS: dict[str, tuple[str, str]] = {
    AuditKind.APPROVED: ("circle", "#3f9b6e"),
    AuditKind.REJECTED: ("circle-x", "#8a8f99"),
    AuditKind.SCHEDULER_ACTION: ("triangle-right", "#1f5fbf"),
    AuditKind.ACTION_SKIPPED: ("triangle-right-open", "#9aa3ad"),
    AuditKind.ACTION_FAILED: ("x-thin-open", "#d6453d"),
    AuditKind.ACTION_RETRY: ("triangle-right-open", "#d9a21b"),
    AuditKind.REPORT_REFUSED: ("x-thin-open", "#9aa3ad"),
    AuditKind.WATCHDOG_RELEASED: ("square", "#d9a21b"),
    AuditKind.STOPPED: ("octagon", "#b03a2e"),
}

_AUDIT_LABELS = dict(AuditKind.choices)
_ACTION_LABELS = dict(RecommendationAction.choices)
_STATUS_LABELS = dict(RecommendationStatus.choices)


@dataclass(frozen=True)
class DecisionMarker:
    """One marker of the decisions row: when, how it is drawn, and its hover text."""

    at: datetime
    legend: str
    symbol: str
    colour: str
    size: int
    hover: str


# The decisions row's legend entries, in the order they are listed.
_DECISION_LEGENDS = ["Recommendation", *(str(_AUDIT_LABELS.get(k, k)) for k in DECISION_MARKERS)]


def _decisions(data: TimelineData) -> list[DecisionMarker]:
    symbol, colour = RECOMMENDATION_MARKER
    found = [
        DecisionMarker(r.created_at, "Recommendation", symbol, colour, 14, _recommendation_hover(r))
        for r in data.recommendations
    ]
    for event in data.decision_events:
        look = DECISION_MARKERS.get(event.kind)
        if look is not None:
            name = str(_AUDIT_LABELS.get(event.kind, event.kind))
            found.append(DecisionMarker(event.occurred_at, name, *look, 12, _event_hover(event)))
    return sorted(found, key=lambda d: (d.at, _DECISION_LEGENDS.index(d.legend)))


def group_same_moment(
    decisions: Sequence[DecisionMarker], same_moment: timedelta
) -> list[list[DecisionMarker]]:
    """The decisions, oldest first, in groups no wider than ``same_moment``: each group starts
    at its oldest decision and takes the ones that follow within ``same_moment`` of it."""
    groups: list[list[DecisionMarker]] = []
    for decision in sorted(decisions, key=lambda d: d.at):
        if groups and decision.at - groups[-1][0].at <= same_moment:
            groups[-1].append(decision)
        else:
            groups.append([decision])
    return groups


def _decision_markers(data: TimelineData, *, same_moment: timedelta) -> list[go.Scatter]:
    """The decisions row: one marker per recommendation and decision event, in a trace per
    kind; those at the same moment at the chart's scale as one marker listing each."""
    by_legend: dict[str, list[DecisionMarker]] = {}
    several: list[list[DecisionMarker]] = []
    for group in group_same_moment(_decisions(data), same_moment):
        if len(group) == 1:
            by_legend.setdefault(group[0].legend, []).append(group[0])
        else:
            several.append(group)
    traces = []
    for legend in _DECISION_LEGENDS:
        found = by_legend.get(legend, [])
        if not found:
            continue
        traces.append(
            go.Scatter(
                name=legend,
                legendgroup="decisions",
                mode="markers",
                x=[plot_time(d.at) for d in found],
                y=[DECISIONS_ROW] * len(found),
                marker={
                    "symbol": found[0].symbol,
                    "color": found[0].colour,
                    "size": found[0].size,
                    **({"line": {"width": 2}} if legend != "Recommendation" else {}),
                },
                hovertext=[d.hover for d in found],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    if several:
        symbol, colour = SEVERAL_MARKER
        traces.append(
            go.Scatter(
                name=SEVERAL_NAME,
                legendgroup="decisions",
                mode="markers+text",
                x=[plot_time(group[0].at) for group in several],
                y=[DECISIONS_ROW] * len(several),
                text=[str(len(group)) for group in several],
                textposition="middle center",
                textfont={"color": "#ffffff", "size": 11},
                marker={"symbol": symbol, "color": colour, "size": 20},
                hovertext=[_several_hover(group) for group in several],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    return traces


def _several_hover(group: Sequence[DecisionMarker]) -> str:
    first, last = group[0].at, group[-1].at
    span = _shown_time(first) + (f" → {_shown_time(last)}" if last != first else "")
    heading = f"<b>{len(group)} at once</b> · {span}"
    return "<br>".join([heading, *(f"<br>{d.hover}" for d in group)])


def _recommendation_hover(recommendation: Recommendation) -> str:
    action = _ACTION_LABELS.get(recommendation.action, recommendation.action)
    status = _STATUS_LABELS.get(recommendation.status, recommendation.status)
    excluded = recommendation.excluded_nodes
    return _hover(
        [
            f"<b>Recommended: {_esc(action)}</b> · #{recommendation.pk}",
            f"Status: {_esc(status)}"
            + (f" (by {_esc(recommendation.decided_by)})" if recommendation.decided_by else ""),
            f"Excluding: {_wrapped(compressed_nodes(excluded))}" if excluded else "",
            f"At {_shown_time(recommendation.created_at)}",
            _esc(_clip(recommendation.reason, REASON_HOVER_CHARS)),
        ]
    )


def _event_hover(event: AuditEvent) -> str:
    payload = event.payload if isinstance(event.payload, dict) else {}
    details = [
        f"{_esc(key)}: {_esc(_clip(str(value), 60))}"
        for key, value in list(payload.items())[:6]
        if value not in (None, "", [], {})
    ]
    return _hover(
        [
            f"<b>{_esc(event.get_kind_display())}</b> by {_esc(event.actor)}",
            f"At {_shown_time(event.occurred_at)}"
            + (f" · attempt {event.attempt}" if event.attempt is not None else ""),
            *details,
        ]
    )
