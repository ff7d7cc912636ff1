"""What the workload timeline and the workflow timeline (``console.workflow_timeline``) share.

Both draw attempts as bars coloured by how they ended and anomalies with their kind's symbol, on a
time axis plotly reads as wall-clock time, with hover text in plotly's small HTML dialect. Those
looks and the helpers that write times, durations, node lists and hover lines are here, apart
from either figure, so that each timeline's panels import them without importing each other.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import datetime

import plotly.graph_objects as go
from django.utils import timezone

from recovery.choices import AnomalyKind, AttemptExitState
from recovery.schedulers.nodelist import NodeListError, compress_nodelist

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

_EXIT_LABELS = dict(AttemptExitState.choices)


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
