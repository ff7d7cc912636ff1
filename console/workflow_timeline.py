"""A workflow's timeline: every attempt of each of its jobs on one time axis.

One row per attempt, named by its job, oldest job on top: a bar from the attempt's start to its
end (or to now while it runs), coloured by how it ended as on the workload timeline, with the
attempt's anomalies on it. The retry budget and the excluded nodes the jobs share are read
across these rows, so they are drawn together. The data comes from the bounded read model in
``recovery.read.workflows``.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

import plotly.graph_objects as go

from console.charts import base_layout, colour_for_category
from console.timeline_common import (
    ANOMALY_SYMBOLS,
    annotate_notes,
    attempt_bar,
    compressed_nodes,
    plot_time,
    short_nodes,
)
from recovery.choices import AnomalyKind, AttemptExitState, FailureCategory
from recovery.models import Anomaly, Attempt
from recovery.read.workflows import (
    MAX_WORKFLOW_ATTEMPT_ROWS,
    MAX_WORKFLOW_JOBS,
    WorkflowTimelineData,
)

ROW_HEIGHT_PX = 34
# The chart's height is set by CSS before plotly draws it (static/console/workflow.css), so it
# takes one of these, the smallest that gives every row its height.
CHART_HEIGHTS_PX = (320, 560, 1000, 2200)

_EXIT_LABELS = dict(AttemptExitState.choices)
_CATEGORY_LABELS = dict(FailureCategory.choices)
_KIND_LABELS = dict(AnomalyKind.choices)


def attempt_row(job_id: str, number: int) -> str:
    return f"{job_id} · attempt {number}"


def chart_height(rows: int) -> int:
    wanted = 90 + ROW_HEIGHT_PX * rows
    return next((h for h in CHART_HEIGHTS_PX if h >= wanted), CHART_HEIGHTS_PX[-1])


def workflow_timeline_figure(data: WorkflowTimelineData) -> go.Figure:
    rows = [attempt_row(a.workload.job_id, a.number) for a in data.attempts]
    figure = go.Figure()
    for trace in _attempt_bars(data):
        figure.add_trace(trace)
    for trace in _anomaly_markers(data, set(rows)):
        figure.add_trace(trace)
    notes = []
    if data.older_jobs_hidden:
        notes.append(f"newest {MAX_WORKFLOW_JOBS} jobs shown")
    if data.older_attempts_hidden:
        notes.append(f"newest {MAX_WORKFLOW_ATTEMPT_ROWS} attempts shown")
    figure.update_layout(
        base_layout(
            height=chart_height(len(rows)),
            barmode="overlay",
            margin={"l": 150, "r": 16, "t": 24, "b": 40},
        )
    )
    annotate_notes(figure, notes)
    figure.update_xaxes(type="date")
    figure.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=rows,
        range=[len(rows) - 0.5, -0.5],  # the first job's first attempt on top
        fixedrange=True,
    )
    return figure


def _hover(lines: Iterable[str]) -> str:
    return "<br>".join(line for line in lines if line)


def _attempt_bars(data: WorkflowTimelineData) -> list[go.Bar]:
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
            rows.append(attempt_row(attempt.workload.job_id, attempt.number))
            labels.append(html.escape(short_nodes(attempt.nodes)))
            hovers.append(_attempt_hover(attempt))
        traces.append(attempt_bar(state, bases, widths, rows, labels, hovers))
    return traces


def _attempt_hover(attempt: Attempt) -> str:
    state = _EXIT_LABELS.get(attempt.exit_state, attempt.exit_state)
    if attempt.exit_code is not None:
        state += f" (exit code {attempt.exit_code})"
    job = attempt.workload
    return _hover(
        [
            f"<b>Job {html.escape(job.job_id)}</b> · attempt {attempt.number} · "
            f"{html.escape(state)}",
            html.escape(job.name),
            f"Nodes: {html.escape(compressed_nodes(attempt.nodes))}" if attempt.nodes else "",
            f"Excluded: {html.escape(compressed_nodes(attempt.excluded_nodes))}"
            if attempt.excluded_nodes
            else "",
            "Produced a checkpoint" if attempt.produced_checkpoint else "",
        ]
    )


def _anomaly_row(anomaly: Anomaly, rows: set[str]) -> str | None:
    number = anomaly.attempt.number if anomaly.attempt is not None else None
    if number is None:
        return None
    row = attempt_row(anomaly.workload.job_id, number)
    return row if row in rows else None


def _anomaly_markers(data: WorkflowTimelineData, rows: set[str]) -> list[go.Scatter]:
    """One trace per category, each anomaly on its attempt's row in its kind's symbol."""
    by_category: dict[str, list[tuple[str, Anomaly]]] = {}
    for anomaly in reversed(data.anomalies):  # oldest first
        row = _anomaly_row(anomaly, rows)
        if row is not None:
            by_category.setdefault(anomaly.category, []).append((row, anomaly))
    traces = []
    for category, found in by_category.items():
        label = _CATEGORY_LABELS.get(category, category) if category else "uncategorised"
        colour = colour_for_category(category)
        traces.append(
            go.Scatter(
                name=f"Anomaly: {label}",
                legendgroup="anomalies",
                mode="markers",
                x=[plot_time(a.detected_at) for _, a in found],
                y=[row for row, _ in found],
                marker={
                    "color": colour,
                    "symbol": [ANOMALY_SYMBOLS.get(a.kind, "circle") for _, a in found],
                    "size": 13,
                    "line": {"width": 2, "color": colour},
                },
                hovertext=[_anomaly_hover(a, label) for _, a in found],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    return traces


def _anomaly_hover(anomaly: Anomaly, category_label: str) -> str:
    kind = _KIND_LABELS.get(anomaly.kind, anomaly.kind)
    return _hover(
        [
            f"<b>{html.escape(kind)}</b> · {html.escape(category_label)} · "
            f"job {html.escape(anomaly.workload.job_id)}",
            f"Implicated: {html.escape(compressed_nodes(anomaly.implicated_nodes))}"
            if anomaly.implicated_nodes
            else "",
            html.escape(anomaly.evidence_line[:160]),
        ]
    )
