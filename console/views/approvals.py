"""The approval queue and the operator's decision, on one recommendation or a page of them."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from console.access import console_view
from console.forms import MAX_BULK_DECISIONS, BulkDecisionForm, DecisionForm
from console.views.operator_actions import back, note_of, operator, refused
from recovery.choices import RecommendationStatus
from recovery.loop import recommendations
from recovery.models import Cluster, Recommendation
from recovery.read.controllers import controllers_of
from recovery.read.filters import ApprovalQueueFilterSet
from recovery.read.queries import pending_approvals, unacknowledged_abandoned

# A bulk decision covers at most one page: what the operator saw.
APPROVALS_PAGE_SIZE = MAX_BULK_DECISIONS
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
    # The clusters with cards in the queue (or the one filtered on): whether a controller of
    # each calls in, so an approval there is carried out rather than left waiting.
    in_queue = Cluster.objects.filter(pk__in=queue.order_by().values("workload__cluster"))
    shown = [chosen] if chosen else in_queue.order_by("name")
    controllers = controllers_of(shown, timezone.now())
    on_page = [r.pk for r in page]
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
            "controllers": controllers,
            "controllers_shown": list(controllers.values()),
            "on_page": on_page,
            "selected": _selected(request, on_page),
            "max_bulk": MAX_BULK_DECISIONS,
        },
    )


@require_POST
def decide(request: HttpRequest, recommendation_id: int, decision: str) -> HttpResponse:
    if answer := refused(request, HOME, "approve or reject recommendations"):
        return answer
    get_object_or_404(Recommendation, pk=recommendation_id)
    approving = decision == "approve"
    decide_with = recommendations.approve if approving else recommendations.reject
    outcome = decide_with(recommendation_id, operator=operator(request), note=note_of(request))
    answer = _back(request, recommendation_id, outcome)
    if approving and outcome.changed:
        _warn_if_waiting(request, [outcome.recommendation])
    return answer


@require_POST
def bulk_decide(request: HttpRequest) -> HttpResponse:
    """Approve or reject the selected recommendations with one note.

    Each is decided on its own (its own conditional update and audit event), so one already
    decided is reported unchanged while the others go through. Invalid ids decide nothing.
    """
    if answer := refused(request, HOME, "approve or reject recommendations"):
        return answer
    form = BulkDecisionForm(request.POST)
    if not form.is_valid():
        message = f"Nothing was decided. {form.problems()}"
        return back(request, HOME, message, changed=False, level=messages.ERROR)
    approving = form.cleaned_data["decision"] == "approve"
    decide_with = recommendations.approve if approving else recommendations.reject
    who, note = operator(request), form.cleaned_data["note"]
    outcomes: list[tuple[int, recommendations.Decision | None]] = []
    for recommendation_id in form.cleaned_data["recommendation"]:
        try:
            outcomes.append(
                (recommendation_id, decide_with(recommendation_id, operator=who, note=note))
            )
        except Recommendation.DoesNotExist:
            outcomes.append((recommendation_id, None))
    decided = [outcome for _, outcome in outcomes if outcome is not None and outcome.changed]
    answer = back(request, HOME, _summary(approving, outcomes), changed=bool(decided))
    if approving:
        _warn_if_waiting(request, [outcome.recommendation for outcome in decided])
    return answer


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


def _warn_if_waiting(request: HttpRequest, approved: Iterable[Recommendation]) -> None:
    """After approving: say so where no controller of the cluster calls in to carry it out."""
    clusters = {r.workload.cluster.pk: r.workload.cluster for r in approved}
    if not clusters:
        return
    for seen in controllers_of(clusters.values(), timezone.now()).values():
        if seen.wait_warning:
            messages.warning(request, seen.wait_warning)


def _summary(approving: bool, outcomes: list[tuple[int, recommendations.Decision | None]]) -> str:
    """ "Approved 4 of 5: recommendation 12 was already rejected by vera." """
    verb = "Approved" if approving else "Rejected"
    done = [pk for pk, outcome in outcomes if outcome is not None and outcome.changed]
    head = f"{verb} {len(done)} of {len(outcomes)}"
    unchanged = [
        _unchanged(pk, outcome)
        for pk, outcome in outcomes
        if outcome is None or not outcome.changed
    ]
    if unchanged:
        return f"{head}: {'; '.join(unchanged)}."
    return f"{head}: recommendation{'s' if len(done) > 1 else ''} {_listed(done)}."


def _unchanged(recommendation_id: int, outcome: recommendations.Decision | None) -> str:
    """Why one recommendation of a bulk decision was left as it was."""
    if outcome is None:
        return f"recommendation {recommendation_id} no longer exists"
    r = outcome.recommendation
    status = r.get_status_display().lower()
    if r.status == RecommendationStatus.REJECTED and r.decided_by:
        return f"recommendation {r.pk} was already rejected by {r.decided_by}"
    if r.approved_by:
        return f"recommendation {r.pk} was already approved by {r.approved_by} (now {status})"
    return f"recommendation {r.pk}: {outcome.message.rstrip('.')}"


def _listed(ids: list[int]) -> str:
    return ", ".join(str(pk) for pk in ids)


def _selected(request: HttpRequest, on_page: list[int]) -> set[int]:
    """The cards to show ticked: ``?select=`` ids ("Select all on this page" lists the page's),
    only those on the page, so a card arriving later is never ticked unseen."""
    wanted = {
        value for value in request.GET.getlist("select") if value.isascii() and value.isdigit()
    }
    return {pk for pk in on_page if str(pk) in wanted}
