"""The workload timeline: attempts, anomalies, decisions and training progress on one time axis.

The top panel has one row per attempt (a bar from start to end, or to now while it runs) with
the attempt's anomalies on it, and one row for decisions and scheduler actions. The bottom panel
shares the time axis and draws the training step over time, with checkpoints as diamonds and the
cost of each failure shaded: the work lost since the last checkpoint, and the time from the
failure until training progressed again.

The data comes from the read model in ``recovery.read.timeline``, whose queries are bounded, so
the figure stays small (a few thousand points at most) however long the workload's history is.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import plotly.graph_objects as go
from django.utils import timezone
from plotly.subplots import make_subplots

from console.charts import base_layout, colour_for_category
from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    AuditKind,
    Confirmation,
    FailureCategory,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.models import Anomaly, Attempt, AuditEvent, Recommendation, Workload
from recovery.read.goodput import Failure
from recovery.read.timeline import (
    MAX_ATTEMPT_ROWS,
    ProgressPoint,
    TimelineData,
    anomaly_attempt_number,
    event_step,
    load_timeline,
    progress_points,
    step_before,
)
from recovery.schedulers.nodelist import NodeListError, compress_nodelist

# Tall enough for two panels and the legend's rows below them (static/console/workload.css).
TIMELINE_HEIGHT_PX = 560
DECISIONS_ROW = "Decisions & actions"
# Decisions closer than this share of the chart's time span are drawn as one marker. A marker
# is 12 to 14 px wide and the plot some 800 to 1,000 px, so markers nearer than about 1 % of
# the span overlap: at 24 h that is 15 minutes, in which a recommendation, its approval and the
# scheduler action usually all fall. The hover lists each.
SAME_MOMENT_SHARE = 0.01
SEVERAL_MARKER = ("circle", "#5b6270")
SEVERAL_NAME = "Several at once"

EVIDENCE_HOVER_CHARS = 160
REASON_HOVER_CHARS = 160
BAR_TEXT_CHARS = 40
BAR_TEXT_NODES = 3
HOVER_LINE_CHARS = 80

EXIT_STATE_COLOURS: dict[str, str] = {
    AttemptExitState.RUNNING: "#4d8fd6",
    AttemptExitState.COMPLETED: "#5fae5a",
    AttemptExitState.FAILED: "#d6453d",
    AttemptExitState.NODE_FAIL: "#b8452e",
    AttemptExitState.TIMEOUT: "#d9a21b",
    AttemptExitState.OUT_OF_MEMORY: "#a35ec0",
    AttemptExitState.PREEMPTED: "#e07b39",
    AttemptExitState.CANCELLED: "#8a8f99",
    AttemptExitState.REQUEUED: "#2e9ab3",
}
ANOMALY_SYMBOLS: dict[str, str] = {
    AnomalyKind.CRASH: "x",
    AnomalyKind.HANG: "hourglass",
    AnomalyKind.STRAGGLER: "triangle-down",
    AnomalyKind.DIVERGENCE: "diamond-wide",
    AnomalyKind.SLOWDOWN: "triangle-down-open",
}


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
PROGRESS_COLOUR = "#4d8fd6"
CHECKPOINT_COLOUR = "#3f9b6e"
RESUMED_COLOUR = "#2e9ab3"
WORK_LOST_FILL = "rgba(214, 69, 61, 0.22)"
DOWNTIME_FILL = "rgba(217, 162, 27, 0.22)"

_CATEGORY_LABELS = dict(FailureCategory.choices)
_KIND_LABELS = dict(AnomalyKind.choices)
_CONFIRMATION_LABELS = dict(Confirmation.choices)
_EXIT_LABELS = dict(AttemptExitState.choices)
_AUDIT_LABELS = dict(AuditKind.choices)
_ACTION_LABELS = dict(RecommendationAction.choices)
_STATUS_LABELS = dict(RecommendationStatus.choices)


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


def attempt_bar(
    state: str,
    bases: list[str],
    widths: list[float],
    rows: list[str],
    labels: list[str],
    hovers: list[str],
) -> go.Bar:
    """The attempts that ended in ``state``, one horizontal bar each, coloured by the state."""
    return go.Bar(
        name=f"Attempt: {_EXIT_LABELS.get(state, state)}",
        legendgroup="attempts",
        orientation="h",
        base=bases,
        x=widths,
        y=rows,
        text=labels,
        textposition="inside",
        insidetextanchor="start",
        constraintext="none",
        marker={"color": EXIT_STATE_COLOURS.get(state, "#9aa3ad"), "opacity": 0.85},
        hovertext=hovers,
        hovertemplate="%{hovertext}<extra></extra>",
        width=0.6,
    )


def annotate_notes(figure: go.Figure, notes: list[str]) -> None:
    """What the figure leaves out (rows, points), in small print at its bottom right."""
    if not notes:
        return
    figure.add_annotation(
        text="; ".join(notes),
        xref="paper",
        yref="paper",
        x=1,
        y=0,
        xanchor="right",
        yanchor="bottom",
        showarrow=False,
        font={"size": 11},
    )


def plot_time(moment: datetime) -> str:
    """A time as plotly reads it: wall-clock time in the Console's time zone, no offset.

    plotly.js does not understand UTC offsets; the page shows times in the current zone too.
    """
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return local.replace(tzinfo=None).isoformat(sep=" ", timespec="milliseconds")


def _shown_time(moment: datetime | None) -> str:
    if moment is None:
        return "—"
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return local.strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float) -> str:
    whole = max(round(seconds), 0)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _esc(text: object) -> str:
    # Hover text is plotly's small HTML dialect: user-supplied text must not become markup.
    return html.escape(str(text), quote=False)


def _hover(lines: Iterable[str]) -> str:
    return "<br>".join(line for line in lines if line)


def compressed_nodes(nodes: Sequence[str]) -> str:
    """All the nodes in Slurm's compressed form (``gpu[01-04]``), or the names if unsafe."""
    try:
        return compress_nodelist(nodes)
    except NodeListError:
        return ",".join(nodes)


def short_nodes(nodes: Sequence[str]) -> str:
    """The nodes in a few characters for a bar's label: compressed, else the first few."""
    if not nodes:
        return ""
    text = compressed_nodes(nodes)
    if len(text) <= BAR_TEXT_CHARS:
        return text
    shown = ", ".join(nodes[:BAR_TEXT_NODES])
    return f"{shown} +{len(nodes) - BAR_TEXT_NODES} more" if len(nodes) > BAR_TEXT_NODES else shown


def _wrapped(text: str, width: int = HOVER_LINE_CHARS) -> str:
    """A long node list over several hover lines, broken after top-level commas."""
    lines: list[str] = []
    current = ""
    depth = 0
    for char in text:
        current += char
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0 and len(current) >= width:
            lines.append(current)
            current = ""
    if current:
        lines.append(current)
    return "<br>".join(_esc(line) for line in lines)


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


# ---------- progress ----------


_SOURCE_LABELS = {
    "sample": "progress line",
    "latest": "latest progress",
    AuditKind.CHECKPOINT_SAVED: "checkpoint saved",
    AuditKind.PROGRESS_RESUMED: "progress resumed",
    AuditKind.TRAINING_COMPLETED: "training completed",
}


def _progress_lines(points: Sequence[ProgressPoint]) -> list[go.Scatter]:
    by_attempt: dict[int | None, list[ProgressPoint]] = {}
    for point in points:
        by_attempt.setdefault(point.attempt, []).append(point)
    traces = []
    for index, (attempt, line) in enumerate(
        sorted(by_attempt.items(), key=lambda item: item[0] or 0)
    ):
        label = f"attempt {attempt}" if attempt is not None else "no attempt"
        traces.append(
            go.Scatter(
                name=f"Progress, {label}",
                legendgroup="progress",
                showlegend=index == 0,
                mode="lines",
                line={"color": PROGRESS_COLOUR, "width": 2},
                x=[plot_time(p.at) for p in line],
                y=[p.step for p in line],
                hovertext=[
                    f"Step {p.step} · {label}<br>{_shown_time(p.at)}"
                    f" · {_SOURCE_LABELS.get(p.source, p.source)}"
                    for p in line
                ],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    if traces:
        traces[0].name = "Progress"
    return traces


def _checkpoint_markers(data: TimelineData, points: Sequence[ProgressPoint]) -> list[go.Scatter]:
    traces = []
    for kind, name, symbol, colour in (
        (AuditKind.CHECKPOINT_SAVED, "Checkpoint saved", "diamond", CHECKPOINT_COLOUR),
        (AuditKind.PROGRESS_RESUMED, "Progress resumed", "triangle-up", RESUMED_COLOUR),
    ):
        events = [e for e in data.progress_events if e.kind == kind]
        if not events:
            continue
        steps = [
            step
            if (step := event_step(e)) is not None
            else step_before(points, e.occurred_at, e.attempt)
            for e in events
        ]
        traces.append(
            go.Scatter(
                name=name,
                legendgroup="progress",
                mode="markers",
                x=[plot_time(e.occurred_at) for e in events],
                y=steps,
                marker={"symbol": symbol, "color": colour, "size": 10},
                hovertext=[
                    _hover(
                        [
                            f"<b>{name}</b> · step {step}",
                            f"{_shown_time(e.occurred_at)}"
                            + (f" · attempt {e.attempt}" if e.attempt is not None else ""),
                            _esc(_clip(str(e.payload.get("path", "")), 80))
                            if isinstance(e.payload, dict)
                            else "",
                        ]
                    )
                    for e, step in zip(events, steps, strict=True)
                ],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    return traces


def _failure_costs(
    data: TimelineData, points: Sequence[ProgressPoint], top_step: int
) -> list[tuple[go.Scatter, tuple[str, str, str]]]:
    """Shaded spans for each failure: the work lost since the last checkpoint, and the time
    from the failure until training progressed again (or until now, if it has not)."""
    height = max(top_step, 1) * 1.05
    end_of_chart = data.chart_end
    checkpoint_steps = data.checkpoint_steps
    spans: list[tuple[go.Scatter, tuple[str, str, str]]] = []
    lost_shown = down_shown = False
    for failure in data.failures:
        attempt = f" (attempt {failure.attempt})" if failure.attempt is not None else ""
        if failure.last_checkpoint_at is not None and failure.last_checkpoint_at < failure.at:
            saved_step = checkpoint_steps.get(failure.last_checkpoint_at)
            reached = step_before(points, failure.at, failure.attempt)
            steps = (
                f"steps {saved_step} to {reached}: {reached - saved_step} steps to redo"
                if saved_step is not None and reached >= saved_step
                else ""
            )
            text = _hover(
                [
                    f"<b>Work lost</b>{attempt}: {_duration(failure.work_lost_s or 0)}",
                    f"last checkpoint {_shown_time(failure.last_checkpoint_at)},"
                    f" failure {_shown_time(failure.at)}",
                    steps,
                ]
            )
            spans.append(
                (
                    _span(
                        "Work lost",
                        failure.last_checkpoint_at,
                        failure.at,
                        height,
                        text,
                        WORK_LOST_FILL,
                        show=not lost_shown,
                    ),
                    (
                        plot_time(failure.last_checkpoint_at),
                        plot_time(failure.at),
                        WORK_LOST_FILL,
                    ),
                )
            )
            lost_shown = True
        back_at = failure.resumed_at or end_of_chart
        if back_at > failure.at:
            productive = failure.time_to_productive_s
            text = _hover(
                [
                    f"<b>Until training resumed</b>{attempt}:"
                    f" {_duration((back_at - failure.at).total_seconds())}"
                    + ("" if failure.resumed_at else " (not resumed yet)"),
                    f"failure {_shown_time(failure.at)},"
                    f" detected {_shown_time(failure.detected_at)}",
                    f"action taken {_shown_time(failure.action_at)}" if failure.action_at else "",
                    f"time to productive training (first new checkpoint): {_duration(productive)}"
                    if productive is not None
                    else "",
                ]
            )
            spans.append(
                (
                    _span(
                        "Until training resumed",
                        failure.at,
                        back_at,
                        height,
                        text,
                        DOWNTIME_FILL,
                        show=not down_shown,
                    ),
                    (plot_time(failure.at), plot_time(back_at), DOWNTIME_FILL),
                )
            )
            down_shown = True
    return spans


def _span(
    name: str,
    start: datetime,
    end: datetime,
    height: float,
    text: str,
    fill: str,
    *,
    show: bool,
) -> go.Scatter:
    x0, x1 = plot_time(start), plot_time(end)
    return go.Scatter(
        name=name,
        legendgroup=name,
        showlegend=show,
        x=[x0, x0, x1, x1, x0],
        y=[0, height, height, 0, 0],
        mode="lines",
        fill="toself",
        fillcolor=fill,
        line={"width": 0},
        hoveron="fills",
        text=text,
        hoverinfo="text",
    )
