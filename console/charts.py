"""Plotly figures for the Console, as plain JSON-ready dicts.

Figures are built on the server with plotly's own graph objects and drawn in the browser by
``static/console/charts.js`` with the plotly.js that ships in the same package. Colours of the
page (text, grid, background) are applied in the browser, where the theme is known; data colours
are fixed here so a category has the same colour on every chart.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from recovery.choices import Attribution, FailureCategory
from recovery.detection.taxonomy import NO_CATEGORY

# One colour per failure category and attribution, readable on dark and light backgrounds.
CATEGORY_COLOURS: dict[str, str] = {
    FailureCategory.GPU_HARDWARE: "#d6453d",
    FailureCategory.INTERCONNECT: "#e07b39",
    FailureCategory.NCCL_TIMEOUT: "#d9a21b",
    FailureCategory.NCCL_ERROR: "#c98a1e",
    FailureCategory.CUDA_ERROR_APP: "#c24f8a",
    FailureCategory.GPU_OOM: "#8e63ce",
    FailureCategory.HOST_OOM: "#a35ec0",
    FailureCategory.APP_EXCEPTION: "#3f9b6e",
    FailureCategory.STORAGE_IO: "#4d8fd6",
    FailureCategory.SCHEDULER_EVENT: "#8a8f99",
    FailureCategory.SEGFAULT: "#b8452e",
    FailureCategory.NAN_DIVERGENCE: "#2e9ab3",
    FailureCategory.HEALTHY: "#5fae5a",
    FailureCategory.UNEXPLAINED: "#6b5e8f",
}
ATTRIBUTION_COLOURS: dict[str, str] = {
    Attribution.HARDWARE: "#d6453d",
    Attribution.SYSTEM_SOFTWARE: "#d9a21b",
    Attribution.APPLICATION: "#3f9b6e",
    Attribution.UNKNOWN: "#9aa3ad",
}
FALLBACK_COLOUR = "#9aa3ad"


def colour_for_category(category: str | None) -> str:
    return CATEGORY_COLOURS.get(category or NO_CATEGORY, FALLBACK_COLOUR)


def colour_for_attribution(attribution: str | None) -> str:
    return ATTRIBUTION_COLOURS.get(attribution or Attribution.UNKNOWN, FALLBACK_COLOUR)


# The legend in rows along the bottom of the chart, below the axis and its title: plotly's mode
# bar sits at the top right and covered a legend placed on top as soon as it spanned the width
# (many categories, many decision kinds). Plotly grows the bottom margin to fit the rows.
LEGEND_BELOW: dict[str, Any] = {
    "orientation": "h",
    "x": 0,
    "xanchor": "left",
    "yref": "container",
    "y": 0,
    "yanchor": "bottom",
}


def base_layout(**overrides: Any) -> dict[str, Any]:
    """Layout shared by every Console chart: compact margins, legend below, hover by x."""
    layout: dict[str, Any] = {
        "margin": {"l": 56, "r": 16, "t": 24, "b": 40},
        "legend": dict(LEGEND_BELOW),
        "hovermode": "closest",
        "height": 320,
    }
    layout.update(overrides)
    return layout


def figure_payload(figure: go.Figure) -> dict[str, Any]:
    """The figure as data for ``json_script``: plotly's own encoding, then plain JSON types."""
    payload: dict[str, Any] = json.loads(pio.to_json(figure, validate=True, remove_uids=True))
    return payload
