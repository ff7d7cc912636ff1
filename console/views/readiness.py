"""A cluster's readiness for action mode, and the form that changes what it may do on its own.

GET shows the report (``recovery.read.readiness``) over ``days`` days. POST, for operators,
changes the mode, the acknowledgement, automatic drains and the canary with a reason, through
``save_with_audit``: one audit event per control changed, each with the reason. Switching to
action mode is confirmed on this page, under the report and its checklist.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.access import console_view
from console.forms import ClusterControlsForm
from console.views.operator_actions import operator, refused
from recovery.audit.cluster_controls import save_with_audit
from recovery.choices import ClusterMode
from recovery.models import Cluster
from recovery.read.readiness import (
    DEFAULT_DAYS,
    MAX_DAYS,
    MIN_DAYS,
    DaysError,
    parse_days,
    readiness_over_days,
)
from recovery.roles import can_decide

# The controls a change stores; the rest of the row (last poll and the like) is the poller's.
CONTROL_FIELDS = [
    "mode",
    "acknowledge_scheduler_actions",
    "drain_automatically",
    "action_partitions",
    "action_share_percent",
    "updated_at",
]


@require_http_methods(["GET", "HEAD", "POST"])
@console_view("recovery.view_cluster", "Viewing a cluster's readiness")
def readiness(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_object_or_404(Cluster, pk=cluster_id)
    try:
        days = parse_days(request.GET.get("days"))
    except DaysError as exc:
        return _render(request, cluster, None, DEFAULT_DAYS, days_error=str(exc), status=400)
    if request.method != "POST":
        return _render(request, cluster, ClusterControlsForm(cluster=cluster), days)
    if answer := refused(request, "console:clusters", "change what a cluster does on its own"):
        return answer
    form = ClusterControlsForm(request.POST, cluster=cluster)
    if not form.is_valid():
        return _render(request, cluster, form, days, status=400)
    changes = form.changes()
    if not changes:
        messages.info(request, f"Nothing changed on {cluster.name}.")
        return _back(cluster, days)
    reason = str(form.cleaned_data["reason"])
    form.apply(cluster)
    save_with_audit(
        cluster,
        operator(request),
        lambda: cluster.save(update_fields=CONTROL_FIELDS),
        reason,
    )
    messages.success(request, f"Changed on {cluster.name}: {'; '.join(changes)}.")
    return _back(cluster, days)


def _back(cluster: Cluster, days: int) -> HttpResponse:
    url = reverse("console:readiness", args=[cluster.pk])
    if days != DEFAULT_DAYS:
        url += "?" + urlencode({"days": days})
    return redirect(url)


def _render(
    request: HttpRequest,
    cluster: Cluster,
    form: ClusterControlsForm | None,
    days: int,
    *,
    days_error: str = "",
    status: int = 200,
) -> HttpResponse:
    report = None if days_error else readiness_over_days(cluster, days)
    return render(
        request,
        "console/readiness.html",
        {
            "cluster": cluster,
            "report": report,
            "form": form,
            "days": days,
            "default_days": DEFAULT_DAYS,
            "min_days": MIN_DAYS,
            "max_days": MAX_DAYS,
            "days_error": days_error,
            "may_change": can_decide(request.user),
            "action_mode": ClusterMode.ACTION,
        },
        status=status,
    )
