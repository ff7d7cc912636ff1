"""The fleet: every watched workload on one page."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.access import console_view
from recovery.choices import WorkloadState
from recovery.models import Cluster, Workload
from recovery.read.filters import ANOMALY_CHOICES, ATTENTION_SORT, FleetFilterSet
from recovery.read.goodput import goodput_of_workloads
from recovery.read.insights import latest_snapshots
from recovery.read.queries import fleet_rows

FLEET_PAGE_SIZE = 50
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
# The other order offered beside attention (no column shows the submit time).
SUBMITTED_SORT = "-submitted"
ATTENTION_ORDER_WORDS = (
    "Needing attention first: awaiting approval, then failing or recovering, running, ended"
)


@console_view("recovery.view_workload", "Viewing the fleet")
def fleet(request: HttpRequest) -> HttpResponse:
    filterset = FleetFilterSet(request.GET, queryset=Workload.objects.all())
    filters = {
        "cluster": filterset.value("cluster") or "",
        "state": filterset.value("state") or "",
        "search": filterset.value("q") or "",
        "user": filterset.value("user") or "",
        "anomaly": filterset.value("anomaly") or "",
        "sort": filterset.sort_key,
    }
    selection = filterset.qs.values_list("pk", flat=True)
    page = Paginator(selection, FLEET_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = fleet_rows(list(page))
    figures = dict(goodput_of_workloads([w.pk for w in rows], now=timezone.now()))
    for workload in rows:
        figure = figures.get(workload.pk)
        workload.ettr = figure.ettr if figure is not None else None  # type: ignore[attr-defined]
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
            "ignored": [problem.message for problem in filterset.problems],
            "clusters": [c.name for c in clusters],
            "states": WorkloadState.choices,
            "anomalies": ANOMALY_CHOICES,
            "columns": _sort_links(filters["sort"]),
            "by_attention": filters["sort"] == ATTENTION_SORT,
            "submitted_sort": SUBMITTED_SORT,
            "order": _order_words(filters["sort"]),
            "cluster_goodput": [(c, snapshots.get(c.pk)) for c in shown],
        },
    )


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


def _order_words(sort: str) -> str:
    """The order the rows are in, as the page says it."""
    if sort == ATTENTION_SORT:
        return ATTENTION_ORDER_WORDS
    if sort.removeprefix("-") == "submitted":
        return "Newest first" if sort.startswith("-") else "Oldest first"
    label = SORTABLE_COLUMNS.get(sort.removeprefix("-"), sort)
    return f"By {label.lower()}, {'descending' if sort.startswith('-') else 'ascending'}"
