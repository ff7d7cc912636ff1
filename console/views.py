from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.forms import DecisionForm
from recovery import recommendations
from recovery.choices import WorkloadState
from recovery.models import Cluster, Recommendation, Workload
from recovery.queries import fleet_workloads, pending_approvals, workload_trail
from recovery.roles import actor_name, can_decide

FLEET_PAGE_SIZE = 50


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    filters = {
        "cluster": request.GET.get("cluster", ""),
        "state": request.GET.get("state", ""),
        "search": request.GET.get("q", ""),
    }
    page = Paginator(fleet_workloads(**filters), FLEET_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "console/fleet.html",
        {
            "page": page,
            "filters": filters,
            "clusters": Cluster.objects.values_list("name", flat=True),
            "states": WorkloadState.choices,
        },
    )


@login_required
def workload_detail(request: HttpRequest, workload_id: int) -> HttpResponse:
    workload = get_object_or_404(Workload.objects.select_related("cluster"), pk=workload_id)
    return render(
        request,
        "console/workload.html",
        {
            "workload": workload,
            "attempts": workload.attempts.all(),
            "anomalies": workload.anomalies.select_related("attempt").prefetch_related("verdicts"),
            "recommendations": workload.recommendations.all(),
            "events": workload_trail(workload),
            "decision_form": DecisionForm(),
        },
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
