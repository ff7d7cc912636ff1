"""One workload: its attempts, goodput, recommendations, anomalies and audit trail."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from console.forms import DecisionForm
from recovery.goodput import (
    Distribution,
    WorkloadGoodput,
    workload_goodput,
)
from recovery.models import Attempt, Cluster, Node, Workload
from recovery.queries import workload_trail


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
def workload_timeline(request: HttpRequest, workload_id: int) -> HttpResponse:
    raise NotImplementedError
