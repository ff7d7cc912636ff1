"""The approval queue and the operator's decision."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST

from console.access import console_view
from console.forms import DecisionForm
from console.views.operator_actions import back, note_of, operator, refused
from recovery.loop import recommendations
from recovery.models import Cluster, Recommendation
from recovery.read.filters import ApprovalQueueFilterSet
from recovery.read.queries import pending_approvals, unacknowledged_abandoned

APPROVALS_PAGE_SIZE = 50
HOME = "console:approvals"
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
    if answer := refused(request, HOME, "approve or reject recommendations"):
        return answer
    get_object_or_404(Recommendation, pk=recommendation_id)
    decide_with = recommendations.approve if decision == "approve" else recommendations.reject
    outcome = decide_with(recommendation_id, operator=operator(request), note=note_of(request))
    return _back(request, recommendation_id, outcome)


@require_POST
def acknowledge(request: HttpRequest, recommendation_id: int) -> HttpResponse:
    """An operator saw an abandoned action: its banner goes, the trail says who saw it."""
    if answer := refused(request, HOME, "acknowledge abandoned actions"):
        return answer
    get_object_or_404(Recommendation, pk=recommendation_id)
    outcome = recommendations.acknowledge(recommendation_id, operator=operator(request))
    return _back(request, recommendation_id, outcome)


def _back(
    request: HttpRequest, recommendation_id: int, outcome: recommendations.Decision
) -> HttpResponse:
    message = f"Recommendation {recommendation_id}: {outcome.message}"
    return back(request, HOME, message, changed=outcome.changed)
