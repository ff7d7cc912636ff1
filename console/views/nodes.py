"""Nodes that need a look."""

from __future__ import annotations

from datetime import datetime

from django.core.paginator import Paginator
from django.db.models import F, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.access import console_view
from recovery.choices import NodeHealth
from recovery.models import Cluster, Node

NODES_PAGE_SIZE = 100
NODE_FILTERS = [
    ("suspect", "Suspect"),
    ("unhealthy", "Unhealthy"),
    ("implicated", "Implicated"),
    ("excluded", "Excluded now"),
]


@console_view("recovery.view_node", "Viewing nodes")
def nodes(request: HttpRequest) -> HttpResponse:
    """Nodes that need a look: suspect, unhealthy, implicated in a failure, or excluded."""
    filters = {"cluster": request.GET.get("cluster", ""), "show": request.GET.get("show", "")}
    now = timezone.now()
    listed = _flagged_nodes(now, **filters)
    page = Paginator(listed, NODES_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "console/nodes.html",
        {
            "page": page,
            "filters": filters,
            "now": now,
            "clusters": Cluster.objects.values_list("name", flat=True),
            "shows": NODE_FILTERS,
            "suspect_count": listed.filter(suspect_since__isnull=False).count(),
        },
    )


def _flagged_nodes(now: datetime, *, cluster: str = "", show: str = "") -> QuerySet[Node]:
    conditions = {
        "suspect": Q(suspect_since__isnull=False),
        "unhealthy": Q(health__in=[NodeHealth.UNHEALTHY, NodeHealth.SUSPECT]),
        "implicated": Q(times_implicated__gt=0),
        "excluded": Q(excluded_until__gt=now),
    }
    if show in conditions:
        wanted = conditions[show]
    else:
        wanted = Q()
        for condition in conditions.values():
            wanted |= condition
    listed = Node.objects.select_related("cluster").filter(wanted)
    if cluster:
        listed = listed.filter(cluster__name=cluster)
    # Suspect nodes lead each cluster's list, most recently flagged first.
    return listed.order_by(
        "cluster__name",
        F("suspect_since").desc(nulls_last=True),
        "-times_implicated",
        "name",
    )
