"""One workload: its attempts, goodput, recommendations, anomalies and audit trail."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from console.access import console_view
from console.charts import figure_payload
from console.forms import DecisionForm
from console.timeline import workload_timeline as workload_timeline_figure
from recovery.loop.policy import policies_read_once, policy_for, site_policy
from recovery.models import Attempt, Cluster, Node, Workload
from recovery.read.goodput import (
    Distribution,
    WorkloadGoodput,
    workload_goodput,
)
from recovery.read.queries import workload_trail

PAGE_ANOMALIES = 50
PAGE_RECOMMENDATIONS = 50


@console_view("recovery.view_workload", "Viewing a workload")
def workload_detail(request: HttpRequest, workload_id: int) -> HttpResponse:
    workload = get_object_or_404(
        Workload.objects.select_related("cluster", "workflow"), pk=workload_id
    )
    now = timezone.now()
    attempts = list(workload.attempts.all())
    goodput = workload_goodput(workload, now=now)
    flags = _node_flags(workload.cluster, attempts, now)
    anomalies = list(
        workload.anomalies.select_related("attempt")
        .prefetch_related("verdicts")
        .order_by("-detected_at", "-id")[: PAGE_ANOMALIES + 1]
    )
    recommendations = list(
        workload.recommendations.select_related("node").order_by("-created_at", "-id")[
            : PAGE_RECOMMENDATIONS + 1
        ]
    )
    timeline = workload_timeline_figure(workload, now=now, failures=goodput.failures)
    with policies_read_once():
        own_policy = policy_for(workload)
        site = site_policy(workload, own_policy)
    return render(
        request,
        "console/workload.html",
        {
            "workload": workload,
            "attempts": attempts,
            "suspect_nodes": flags.suspect,
            "excluded_nodes_until": flags.excluded_until,
            "policy": own_policy,
            "site_policy": site,
            "goodput": _goodput_panel(goodput),
            "anomalies": anomalies[:PAGE_ANOMALIES],
            "more_anomalies": len(anomalies) > PAGE_ANOMALIES,
            "page_anomalies": PAGE_ANOMALIES,
            "recommendations": recommendations[:PAGE_RECOMMENDATIONS],
            "more_recommendations": len(recommendations) > PAGE_RECOMMENDATIONS,
            "page_recommendations": PAGE_RECOMMENDATIONS,
            "trail": workload_trail(workload),
            "timeline": figure_payload(timeline),
            "decision_form": DecisionForm(),
        },
    )


@dataclass(frozen=True)
class NodeFlags:
    """What recovery knows about an attempt's nodes: suspect (why), excluded (until when)."""

    suspect: dict[str, str]
    excluded_until: dict[str, datetime]


def _node_flags(cluster: Cluster, attempts: Iterable[Attempt], now: datetime) -> NodeFlags:
    """Suspect and currently excluded nodes among the attempts' nodes, in one query."""
    names = {name for attempt in attempts for name in attempt.nodes}
    if not names:
        return NodeFlags({}, {})
    flagged = (
        Node.objects.filter(cluster=cluster, name__in=names)
        .filter(Q(suspect_since__isnull=False) | Node.excluded_at(now))
        .order_by()  # the default order joins the cluster table for nothing
    )
    suspect: dict[str, str] = {}
    excluded: dict[str, datetime] = {}
    for name, suspect_since, reason, until in flagged.values_list(
        "name", "suspect_since", "suspect_reason", "excluded_until"
    ):
        if suspect_since is not None:
            suspect[name] = reason
        if until is not None and until > now:
            excluded[name] = until
    return NodeFlags(suspect, excluded)


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


@console_view("recovery.view_workload", "Viewing a workload")
def workload_timeline(request: HttpRequest, workload_id: int) -> JsonResponse:
    """The workload page's timeline figure as JSON, for scripts and for redrawing it."""
    workload = get_object_or_404(Workload.objects.select_related("cluster"), pk=workload_id)
    return JsonResponse(figure_payload(workload_timeline_figure(workload)))
