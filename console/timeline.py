"""The workload timeline: attempts, anomalies, decisions and training progress on one time axis.

The top panel has one row per attempt (a bar from start to end, or to now while it runs) with
the attempt's anomalies on it, and one row for decisions and scheduler actions. The bottom panel
shares the time axis and draws the training step over time, with checkpoints as diamonds and the
cost of each failure shaded: the work lost since the last checkpoint, and the time from the
failure until training progressed again.

The data comes from the read model in ``recovery.read.timeline``, whose queries are bounded, so
the figure stays small (a few thousand points at most) however long the workload's history is.

The decisions row is drawn by ``console.timeline_decisions``, the progress panel by
``console.timeline_progress``, and what this figure shares with the workflow timeline is in
``console.timeline_common``; this module puts them together and draws the attempts' bars and
their anomalies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from console.charts import base_layout, colour_for_category
from console.timeline_common import (
    _EXIT_LABELS,
    ANOMALY_SYMBOLS,
    REASON_HOVER_CHARS,
    _clip,
    _duration,
    _esc,
    _hover,
    _shown_time,
    _wrapped,
    annotate_notes,
    attempt_bar,
    compressed_nodes,
    plot_time,
    short_nodes,
)
from console.timeline_decisions import DECISIONS_ROW, SAME_MOMENT_SHARE, _decision_markers
from console.timeline_progress import _checkpoint_markers, _failure_costs, _progress_lines
from recovery.choices import AnomalyKind, Confirmation, FailureCategory
from recovery.models import Anomaly, Attempt, Workload
from recovery.read.goodput import Failure
from recovery.read.timeline import (
    MAX_ATTEMPT_ROWS,
    TimelineData,
    anomaly_attempt_number,
    load_timeline,
    progress_points,
)

# Tall enough for two panels and the legend's rows below them (static/console/workload.css).
TIMELINE_HEIGHT_PX = 560

EVIDENCE_HOVER_CHARS = 160


@dataclass(frozen=True)
class ConfirmationMarker:
    """How an anomaly in one confirmation state is drawn, and its name in the legend."""

    symbol: str
    opacity: float
    name: str


# A crash read from a log is only suspected until the process is seen to end. Its marker says
# how that turned out, in the category's colour: filled once acted on (confirmed, or stalled and
# handled as a hang: an hourglass on its side), hollow while only suspected, and a faint open
# circle when training went on after it and nothing was done. Anomalies without a state (hangs,
# stragglers, crashes recorded before confirmation existed) keep their kind's symbol, filled.
CONFIRMATION_MARKERS: dict[str, ConfirmationMarker] = {
    Confirmation.CONFIRMED: ConfirmationMarker("x", 1.0, "confirmed"),
    Confirmation.SUSPECTED: ConfirmationMarker("x-open", 1.0, "suspected"),
    Confirmation.STALLED: ConfirmationMarker("bowtie", 1.0, "stalled"),
    Confirmation.SURVIVED: ConfirmationMarker("circle-open", 0.6, "survived"),
}

_CATEGORY_LABELS = dict(FailureCategory.choices)
_KIND_LABELS = dict(AnomalyKind.choices)
_CONFIRMATION_LABELS = dict(Confirmation.choices)


def workload_timeline(
    workload: Workload,
    *,
    now: datetime | None = None,
    failures: Sequence[Failure] | None = None,
) -> go.Figure:
    """The workload's timeline figure.

    ``failures`` are the goodput figures' failures when the caller has them already (the
    workload page computes them for its goodput panel); they are computed otherwise.
    """
    return timeline_figure(load_timeline(workload, now=now, failures=failures))


def timeline_figure(data: TimelineData) -> go.Figure:
    rows = [DECISIONS_ROW, *(_attempt_row(a.number) for a in data.attempts)]
    figure = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        row_heights=[0.55, 0.45],
    )
    for trace in _attempt_bars(data):
        figure.add_trace(trace, row=1, col=1)
    for trace in _anomaly_markers(data, set(rows)):
        figure.add_trace(trace, row=1, col=1)
    for trace in _decision_markers(data, same_moment=_time_span(data) * SAME_MOMENT_SHARE):
        figure.add_trace(trace, row=1, col=1)
    progress = progress_points(data)
    top_step = max((p.step for p in progress), default=0)
    for trace in _progress_lines(progress):
        figure.add_trace(trace, row=2, col=1)
    for trace in _checkpoint_markers(data, progress):
        figure.add_trace(trace, row=2, col=1)
    for trace, (start, end, fill) in _failure_costs(data, progress, top_step):
        figure.add_trace(trace, row=2, col=1)
        figure.add_vrect(
            x0=start, x1=end, fillcolor=fill, line_width=0, layer="below", row=1, col=1
        )
    notes = []
    if data.older_attempts_hidden:
        notes.append(f"newest {MAX_ATTEMPT_ROWS} attempts shown")
    if data.samples_downsampled:
        notes.append(f"progress thinned to {len(data.samples)} points")
    figure.update_layout(
        base_layout(
            height=TIMELINE_HEIGHT_PX,
            barmode="overlay",
            hovermode="closest",
            margin={"l": 130, "r": 16, "t": 24, "b": 24},
        )
    )
    annotate_notes(figure, notes)
    figure.update_xaxes(type="date")
    figure.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=rows,
        range=[len(rows) - 0.5, -0.5],  # the decisions row on top, attempts in order below
        fixedrange=True,
        row=1,
        col=1,
    )
    figure.update_yaxes(title_text="Step", rangemode="tozero", row=2, col=1)
    return figure


def _attempt_row(number: int) -> str:
    return f"Attempt {number}"


def _attempt_bars(data: TimelineData) -> list[go.Bar]:
    by_state: dict[str, list[Attempt]] = {}
    for attempt in data.attempts:
        if attempt.started_at is not None:
            by_state.setdefault(attempt.exit_state, []).append(attempt)
    traces = []
    for state, attempts in by_state.items():
        bases, widths, rows, labels, hovers = [], [], [], [], []
        for attempt in attempts:
            assert attempt.started_at is not None
            end = attempt.ended_at or data.now
            seconds = max((end - attempt.started_at).total_seconds(), 0.0)
            bases.append(plot_time(attempt.started_at))
            widths.append(seconds * 1000)
            rows.append(_attempt_row(attempt.number))
            labels.append(_esc(short_nodes(attempt.nodes)))
            hovers.append(_attempt_hover(attempt, end, seconds, running=attempt.ended_at is None))
        traces.append(attempt_bar(state, bases, widths, rows, labels, hovers))
    return traces


def _attempt_hover(attempt: Attempt, end: datetime, seconds: float, *, running: bool) -> str:
    state = _EXIT_LABELS.get(attempt.exit_state, attempt.exit_state)
    if attempt.exit_code is not None:
        state += f" (exit code {attempt.exit_code})"
    ended = "still running" if running else _shown_time(end)
    return _hover(
        [
            f"<b>{_attempt_row(attempt.number)}</b> · {_esc(state)}",
            f"{_shown_time(attempt.started_at)} → {ended} ({_duration(seconds)})",
            f"Nodes ({len(attempt.nodes)}): {_wrapped(compressed_nodes(attempt.nodes))}"
            if attempt.nodes
            else "Nodes: —",
            f"Excluded: {_wrapped(compressed_nodes(attempt.excluded_nodes))}"
            if attempt.excluded_nodes
            else "",
            "Produced a checkpoint" if attempt.produced_checkpoint else "",
        ]
    )


def _anomaly_row(anomaly: Anomaly, attempts: Sequence[Attempt]) -> str:
    number = anomaly_attempt_number(anomaly, attempts)
    return DECISIONS_ROW if number is None else _attempt_row(number)


def _anomaly_markers(data: TimelineData, rows: set[str]) -> list[go.Scatter]:
    """One trace per category and confirmation state, so each legend entry shows one look: the
    category's colour with the state's symbol and fill."""
    by_category: dict[str, dict[str, list[tuple[str, Anomaly]]]] = {}
    for anomaly in reversed(data.anomalies):  # oldest first
        row = _anomaly_row(anomaly, data.attempts)
        if row in rows:  # an anomaly of an attempt too old to be shown stays off the chart
            by_state = by_category.setdefault(anomaly.category, {})
            by_state.setdefault(anomaly.confirmation, []).append((row, anomaly))
    traces = []
    for category, by_state in by_category.items():
        label = _CATEGORY_LABELS.get(category, category) if category else "uncategorised"
        for state in _states_in_legend_order(by_state):
            traces.append(_anomaly_trace(category, label, state, by_state[state]))
    return traces


def _states_in_legend_order(by_state: dict[str, list[tuple[str, Anomaly]]]) -> list[str]:
    # Blank first (the plain category entry), then the states in the order they can occur.
    order = ["", *Confirmation.values]
    return sorted(by_state, key=lambda state: order.index(state) if state in order else len(order))


def _anomaly_trace(
    category: str, label: str, state: str, found: Sequence[tuple[str, Anomaly]]
) -> go.Scatter:
    colour = colour_for_category(category)
    look = CONFIRMATION_MARKERS.get(state)
    symbols = (
        [look.symbol] * len(found)
        if look is not None
        else [ANOMALY_SYMBOLS.get(a.kind, "circle") for _, a in found]
    )
    return go.Scatter(
        name=f"Anomaly: {label}" + (f" · {look.name}" if look is not None else ""),
        legendgroup="anomalies",
        mode="markers",
        x=[plot_time(a.detected_at) for _, a in found],
        y=[row for row, _ in found],
        marker={
            "color": colour,
            "symbol": symbols,
            "size": 13,
            "opacity": look.opacity if look is not None else 1.0,
            "line": {"width": 2, "color": colour},
        },
        hovertext=[_anomaly_hover(a, label) for _, a in found],
        hovertemplate="%{hovertext}<extra></extra>",
    )


def _anomaly_hover(anomaly: Anomaly, category_label: str) -> str:
    kind = _KIND_LABELS.get(anomaly.kind, anomaly.kind)
    latency = (anomaly.detected_at - anomaly.evidence_at).total_seconds()
    return _hover(
        [
            f"<b>{_esc(kind)}</b> · {_esc(category_label)} · #{anomaly.pk}",
            _confirmation_hover(anomaly),
            f"Attribution: {_esc(anomaly.get_attribution_display())}"
            f" · severity {_esc(anomaly.get_severity_display())}",
            f"Signature: {_esc(anomaly.signature)}" if anomaly.signature else "",
            f"Nodes: {_wrapped(compressed_nodes(anomaly.implicated_nodes))}"
            if anomaly.implicated_nodes
            else "",
            f"Occurrences: {anomaly.occurrences}" if anomaly.occurrences > 1 else "",
            f"With {anomaly.folded_findings} more findings past the anomaly cap"
            if anomaly.folded_findings
            else "",
            f"Evidence: {_esc(anomaly.evidence_provenance)}",
            f"Evidence at {_shown_time(anomaly.evidence_at)},"
            f" detected {_shown_time(anomaly.detected_at)} ({latency:.1f} s later)",
            f"<i>{_esc(_clip(anomaly.evidence_line, EVIDENCE_HOVER_CHARS))}</i>"
            if anomaly.evidence_line
            else "",
        ]
    )


def _confirmation_hover(anomaly: Anomaly) -> str:
    """The crash's state, when and why it was settled; nothing for anomalies without one."""
    if not anomaly.confirmation:
        return ""
    state = _CONFIRMATION_LABELS.get(anomaly.confirmation, anomaly.confirmation)
    when = ""
    if anomaly.confirmation_at is not None:
        when = f" at {_shown_time(anomaly.confirmation_at)}"
        seconds = anomaly.confirmation_latency_seconds
        if seconds is not None:
            when += f" ({seconds:.1f} s after the evidence)"
    reason = _clip(anomaly.confirmation_reason, REASON_HOVER_CHARS)
    return f"State: <b>{_esc(state)}</b>{when}" + (f"<br>Why: {_esc(reason)}" if reason else "")


def _time_span(data: TimelineData) -> timedelta:
    """The span the time axis covers: from the first thing drawn to the chart's end."""
    moments = [a.started_at for a in data.attempts if a.started_at is not None]
    moments += [r.created_at for r in data.recommendations]
    moments += [e.occurred_at for e in data.decision_events]
    moments += [a.detected_at for a in data.anomalies]
    moments += [p.at for p in data.samples[:1]]
    moments += [e.occurred_at for e in data.progress_events[:1]]
    if not moments:
        return timedelta(0)
    return max(data.chart_end - min(moments), timedelta(0))
