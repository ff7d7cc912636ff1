"""The fleet: every watched workload on one page."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from recovery.choices import WorkloadState
from recovery.goodput import (
    ClusterGoodput,
    cluster_goodput,
    workload_goodput,
)
from recovery.models import Cluster
from recovery.queries import fleet_workloads

FLEET_PAGE_SIZE = 50
# A cluster's figures read every event of the cluster; the fleet page is fetched again on each
# live update, so they are computed at most once a minute.
CLUSTER_GOODPUT_SECONDS = 60


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    filters = {
        "cluster": request.GET.get("cluster", ""),
        "state": request.GET.get("state", ""),
        "search": request.GET.get("q", ""),
    }
    page = Paginator(fleet_workloads(**filters), FLEET_PAGE_SIZE).get_page(request.GET.get("page"))
    for workload in page:
        workload.ettr = workload_goodput(workload).ettr
    clusters = Cluster.objects.order_by("name")
    if filters["cluster"]:
        clusters = clusters.filter(name=filters["cluster"])
    return render(
        request,
        "console/fleet.html",
        {
            "page": page,
            "filters": filters,
            "clusters": Cluster.objects.values_list("name", flat=True),
            "states": WorkloadState.choices,
            "cluster_goodput": _cluster_figures(clusters),
        },
    )


def _cluster_figures(clusters: Iterable[Cluster]) -> list[tuple[Cluster, ClusterGoodput]]:
    figures = []
    for cluster in clusters:
        key = f"wr:goodput:cluster:{cluster.pk}:{cluster.name}"
        figure = cache.get(key)
        if not isinstance(figure, ClusterGoodput):
            figure = cluster_goodput(cluster)
            cache.set(key, figure, timeout=CLUSTER_GOODPUT_SECONDS)
        figures.append((cluster, figure))
    return figures
