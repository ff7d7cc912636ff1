"""The timeline's bottom panel: the training step over time, checkpoints, and what each
failure cost.

It shares the time axis with the attempts and decisions above (``console.timeline``) but draws
from the progress points and the goodput figures' failures, not from the attempts, so it is
apart from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import plotly.graph_objects as go

from console.timeline_common import _clip, _duration, _esc, _hover, _shown_time, plot_time
from recovery.choices import AuditKind
from recovery.read.timeline import ProgressPoint, TimelineData, event_step, step_before

PROGRESS_COLOUR = "#4d8fd6"
CHECKPOINT_COLOUR = "#3f9b6e"
RESUMED_COLOUR = "#2e9ab3"
WORK_LOST_FILL = "rgba(214, 69, 61, 0.22)"
DOWNTIME_FILL = "rgba(217, 162, 27, 0.22)"


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
