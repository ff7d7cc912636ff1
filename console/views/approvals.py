"""The approval queue and the operator's decision."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.access import console_view
from console.forms import DecisionForm
from recovery.loop import recommendations
from recovery.models import Cluster, Recommendation
from recovery.read.filters import ApprovalQueueFilterSet
from recovery.read.queries import pending_approvals, unacknowledged_abandoned
from recovery.roles import actor_name, can_decide

APPROVALS_PAGE_SIZE = 50
# Abandoned actions shown above the queue; the API lists all (?disposition=abandoned).
ABANDONED_SHOWN = 50


@console_view("recovery.view_recommendation", "Viewing the approval queue")
def approvals(request: HttpRequest) -> HttpResponse:
    filterset = ApprovalQueueFilterSet(request.GET, queryset=pending_approvals())
    queue = filterset.qs
    chosen = filterset.value("cluster")
    cluster = chosen.name if chosen else ""
    ignored = " ".join(problem.message for problem in filterset.problems)
    page = Paginator(queue, APPROVALS_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "console/approvals.html",
        {
            "pending": page,
            "page": page,
            "cluster": cluster,
            "clusters": Cluster.objects.values_list("name", flat=True),
            "ignored": ignored,
            "decision_form": DecisionForm(),
            "abandoned": unacknowledged_abandoned()[:ABANDONED_SHOWN],
        },
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
    return _back(request, recommendation_id, outcome)


@require_POST
def acknowledge(request: HttpRequest, recommendation_id: int) -> HttpResponse:
    """An operator saw an abandoned action: its banner goes, the trail says who saw it."""
    if not request.user.is_authenticated:
        return redirect_to_login(reverse("console:approvals"))
    if not can_decide(request.user):
        raise PermissionDenied("Only operators may acknowledge abandoned actions.")
    get_object_or_404(Recommendation, pk=recommendation_id)
    outcome = recommendations.acknowledge(recommendation_id, operator=actor_name(request.user))
    return _back(request, recommendation_id, outcome)


def _back(
    request: HttpRequest, recommendation_id: int, outcome: recommendations.Decision
) -> HttpResponse:
    level = messages.SUCCESS if outcome.changed else messages.INFO
    messages.add_message(request, level, f"Recommendation {recommendation_id}: {outcome.message}")
    next_url = request.POST.get("next", "")
    if next_url and url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(next_url)
    return redirect("console:approvals")
