from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import F, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.forms import DecisionForm
from recovery import recommendations
from recovery.choices import NodeHealth, WorkloadState
from recovery.goodput import (
    ClusterGoodput,
    Distribution,
    WorkloadGoodput,
    cluster_goodput,
    workload_goodput,
)
from recovery.models import Attempt, Cluster, Node, Recommendation, Workload
from recovery.queries import fleet_workloads, pending_approvals, workload_trail
from recovery.roles import actor_name, can_decide

FLEET_PAGE_SIZE = 50
NODES_PAGE_SIZE = 100
VIEW_NODES_PERMISSION = "recovery.view_node"
# A cluster's figures read every event of the cluster; the fleet page is fetched again on each
# live update, so they are computed at most once a minute.
CLUSTER_GOODPUT_SECONDS = 60
NODE_FILTERS = [
    ("suspect", "Suspect"),
    ("unhealthy", "Unhealthy"),
    ("implicated", "Implicated"),
    ("excluded", "Excluded now"),
]


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


@login_required
def workload_detail(request: HttpRequest, workload_id: int) -> HttpResponse:
    workload = get_object_or_404(Workload.objects.select_related("cluster"), pk=workload_id)
    attempts = list(workload.attempts.all())
    return render(
        request,
        "console/workload.html",
        {
            "workload": workload,
            "attempts": attempts,
            "suspect_nodes": _suspects_among(workload.cluster, attempts),
            "goodput": _goodput_panel(workload_goodput(workload)),
            "anomalies": workload.anomalies.select_related("attempt").prefetch_related("verdicts"),
            "recommendations": workload.recommendations.all(),
            "events": workload_trail(workload),
            "decision_form": DecisionForm(),
        },
    )


def _suspects_among(cluster: Cluster, attempts: Iterable[Attempt]) -> dict[str, str]:
    """Suspect nodes among the attempts' nodes, with the reason each is suspect."""
    names = {name for attempt in attempts for name in attempt.nodes}
    if not names:
        return {}
    suspects = Node.objects.filter(cluster=cluster, name__in=names, suspect_since__isnull=False)
    return {name: reason for name, reason in suspects.values_list("name", "suspect_reason")}


def _goodput_panel(figure: WorkloadGoodput) -> dict[str, Any]:
    failures = figure.failures
    lost = [f.work_lost_s for f in failures if f.work_lost_s is not None]
    return {
        "ettr": figure.ettr,
        "wall_s": figure.wall_s,
        "failures": failures,
        "detection": Distribution.of(f.detection_latency_s for f in failures),
        "action": Distribution.of(f.action_latency_s for f in failures),
        "productive": Distribution.of(f.time_to_productive_s for f in failures),
        "work_lost_total": sum(lost) if lost else None,
    }


@login_required
def nodes(request: HttpRequest) -> HttpResponse:
    """Nodes that need a look: suspect, unhealthy, implicated in a failure, or excluded."""
    if not request.user.has_perm(VIEW_NODES_PERMISSION):
        raise PermissionDenied("Viewing nodes needs a Console role (viewer or above).")
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


@login_required
def approvals(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "console/approvals.html",
        {"pending": pending_approvals(), "decision_form": DecisionForm()},
    )


@require_POST
def decide(request: HttpRequest, recommendation_id: int, decision: str) -> HttpResponse:
    if not request.user.is_authenticated:
        # After logging in, land on the queue: the decision URL itself only takes POST.
        return redirect_to_login(reverse("console:approvals"))
    if not can_decide(request.user):
        raise PermissionDenied("Only operators may approve or reject recommendations.")
    get_object_or_404(Recommendation, pk=recommendation_id)
    form = DecisionForm(request.POST)
    note = form.cleaned_data["note"] if form.is_valid() else ""
    decide_with = recommendations.approve if decision == "approve" else recommendations.reject
    outcome = decide_with(recommendation_id, operator=actor_name(request.user), note=note)
    level = messages.SUCCESS if outcome.changed else messages.INFO
    messages.add_message(request, level, f"Recommendation {recommendation_id}: {outcome.message}")
    next_url = request.POST.get("next", "")
    if next_url and url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(next_url)
    return redirect("console:approvals")
