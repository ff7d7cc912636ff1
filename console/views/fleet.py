"""The fleet: every watched workload on one page."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.access import console_view
from recovery.choices import FailureCategory, WorkloadState
from recovery.models import Cluster
from recovery.read.goodput import goodput_of_workloads
from recovery.read.insights import latest_snapshots
from recovery.read.queries import (
    ANY_ANOMALY,
    DEFAULT_FLEET_SORT,
    FLEET_SORTS,
    NO_ANOMALY,
    fleet_rows,
    fleet_workloads,
)

FLEET_PAGE_SIZE = 50
ANOMALY_CHOICES = [
    (ANY_ANOMALY, "Any anomaly"),
    (NO_ANOMALY, "No anomaly"),
    *FailureCategory.choices,
]
# Columns the reader can sort by, in table order; the others are computed per row.
SORTABLE_COLUMNS = {
    "job": "Job",
    "name": "Name",
    "cluster": "Cluster",
    "user": "User",
    "state": "State",
    "attempt": "Attempt",
    "progress": "Last progress",
    "checkpoint": "Checkpoint",
}


@console_view("recovery.view_workload", "Viewing the fleet")
def fleet(request: HttpRequest) -> HttpResponse:
    filters, ignored = _fleet_filters(request)
    selection = fleet_workloads(**filters).values_list("pk", flat=True)
    page = Paginator(selection, FLEET_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = fleet_rows(list(page))
    figures = dict(goodput_of_workloads([w.pk for w in rows], now=timezone.now()))
    for workload in rows:
        figure = figures.get(workload.pk)
        workload.ettr = figure.ettr if figure is not None else None
    clusters = list(Cluster.objects.order_by("name"))
    shown = [c for c in clusters if not filters["cluster"] or c.name == filters["cluster"]]
    snapshots = latest_snapshots(shown)
    return render(
        request,
        "console/fleet.html",
        {
            "page": page,
            "rows": rows,
            "filters": filters,
            "filtered": any(value for key, value in filters.items() if key != "sort"),
            "ignored": ignored,
            "clusters": [c.name for c in clusters],
            "states": WorkloadState.choices,
            "anomalies": ANOMALY_CHOICES,
            "columns": _sort_links(filters["sort"]),
            "cluster_goodput": [(c, snapshots.get(c.pk)) for c in shown],
        },
    )


def _fleet_filters(request: HttpRequest) -> tuple[dict[str, str], list[str]]:
    """The fleet's filters from the query string, and why any value was ignored."""
    ignored: list[str] = []
    filters = {
        "cluster": request.GET.get("cluster", "").strip(),
        "state": request.GET.get("state", "").strip(),
        "search": request.GET.get("q", "").strip()[:200],
        "user": request.GET.get("user", "").strip()[:64],
        "anomaly": request.GET.get("anomaly", "").strip(),
        "sort": request.GET.get("sort", DEFAULT_FLEET_SORT).strip() or DEFAULT_FLEET_SORT,
    }
    if filters["state"] and filters["state"] not in WorkloadState.values:
        ignored.append(f"Unknown state “{filters['state']}”: showing every state.")
        filters["state"] = ""
    if filters["anomaly"] and filters["anomaly"] not in dict(ANOMALY_CHOICES):
        ignored.append(f"Unknown anomaly category “{filters['anomaly']}”: not filtering on it.")
        filters["anomaly"] = ""
    if filters["sort"].removeprefix("-") not in FLEET_SORTS:
        ignored.append(f"Cannot sort by “{filters['sort']}”: newest first instead.")
        filters["sort"] = DEFAULT_FLEET_SORT
    return filters, ignored


def _sort_links(current: str) -> dict[str, dict[str, str]]:
    """Per sortable column: the sort key a click asks for and the aria-sort state now."""
    columns = {}
    for key, label in SORTABLE_COLUMNS.items():
        if current == key:
            state, next_sort = "ascending", f"-{key}"
        elif current == f"-{key}":
            state, next_sort = "descending", key
        else:
            # Times and counts are most useful largest first; names alphabetically.
            descending_first = key in {"progress", "attempt", "checkpoint"}
            state, next_sort = "none", f"-{key}" if descending_first else key
        columns[key] = {"label": label, "aria_sort": state, "next": next_sort}
    return columns
