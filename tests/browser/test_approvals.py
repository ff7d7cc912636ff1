"""Operators decide on recommendations in the browser; viewers follow the queue and cannot."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from recovery.choices import AuditKind, RecommendationStatus
from recovery.loop.recommendations import claimable_for
from recovery.models import AuditEvent, Recommendation
from tests.browser.conftest import Browsing
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db(transaction=True)

REJECT_REASON = "gpu-002 was replaced this morning; the job's own code is at fault"


def awaiting_approval() -> Recommendation:
    workload = WorkloadFactory(cluster=ClusterFactory(name="train-a100"), name="llama-pretrain")
    return RecommendationFactory(
        workload=workload,
        status=RecommendationStatus.AWAITING_APPROVAL,
        expires_at=timezone.now() + timedelta(minutes=30),
    )


def form_fields(
    page: Page, recommendation: Recommendation, decision: str
) -> tuple[str, dict[str, str | float | bool]]:
    """The decision form's action and fields, as the browser would send them."""
    form = page.locator(f'#recommendation-{recommendation.pk} form[action$="/{decision}/"]')
    action = form.get_attribute("action")
    assert action, f"no {decision} form for recommendation {recommendation.pk}"
    fields = form.evaluate("form => Object.fromEntries(new FormData(form))")
    return action, fields


def events(recommendation: Recommendation, kind: str) -> list[AuditEvent]:
    return [
        event
        for event in AuditEvent.objects.filter(workload=recommendation.workload, kind=kind)
        if event.payload.get("recommendation") == recommendation.pk
    ]


def test_an_operator_approves_on_the_approvals_page_once_however_often_sent(
    browsing: Browsing, operator: User
) -> None:
    """
    GIVEN a recommendation awaiting approval, on the Approvals page of a signed-in operator
    WHEN the operator double-clicks Approve, and the same form is then posted again
    THEN it leaves the queue and is ready for the cluster's controllers,
    AND exactly one `approved` event names the operator, whatever the repeats
    """
    recommendation = awaiting_approval()
    page = browsing.page(operator)
    page.goto("/approvals/")
    card = page.locator(f"#recommendation-{recommendation.pk}")
    expect(card).to_contain_text(recommendation.reason)
    action, fields = form_fields(page, recommendation, "approve")

    card.get_by_role("button", name="Approve").dblclick()

    expect(card).to_have_count(0)
    expect(page).to_have_url(re.compile(r"/approvals/$"))
    expect(page.locator(".messages")).to_contain_text(f"Recommendation {recommendation.pk}:")
    expect(page.locator("#approval-queue")).to_contain_text("Nothing awaits approval.")
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY
    assert recommendation.decided_by == operator.get_username()
    assert recommendation.expires_at is not None and recommendation.expires_at > timezone.now()
    assert recommendation in claimable_for(recommendation.workload.cluster)
    approved = events(recommendation, AuditKind.APPROVED)
    assert [event.actor for event in approved] == [operator.get_username()]

    again = page.request.post(action, form=fields)

    assert again.ok, again.status
    assert "Already ready." in again.text()
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY
    assert len(events(recommendation, AuditKind.APPROVED)) == 1
    assert browsing.problems_on(page) == []


def test_an_operator_approves_on_the_workload_page(browsing: Browsing, operator: User) -> None:
    """
    GIVEN a workload page showing a recommendation awaiting approval
    WHEN the operator approves it there
    THEN the page comes back with the recommendation ready and decided by the operator,
    AND the database and the audit trail agree; posting the form again changes nothing
    """
    recommendation = awaiting_approval()
    page = browsing.page(operator)
    page.goto(f"/workloads/{recommendation.workload.pk}/")
    item = page.locator(f"#recommendation-{recommendation.pk}")
    expect(item.locator(".badge")).to_have_text("Awaiting approval")
    action, fields = form_fields(page, recommendation, "approve")

    item.get_by_role("button", name="Approve").click()

    expect(page).to_have_url(re.compile(f"/workloads/{recommendation.workload.pk}/$"))
    expect(item.locator(".badge")).to_have_text("Ready")
    expect(item).to_contain_text(f"Decided by{operator.get_username()}")
    expect(item.get_by_role("button", name="Approve")).to_have_count(0)
    approved = events(recommendation, AuditKind.APPROVED)
    assert [event.actor for event in approved] == [operator.get_username()]
    expect(page.locator(f"#audit-trail #event-{approved[0].pk}")).to_contain_text("Approved")
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY

    again = page.request.post(action, form=fields)

    assert again.ok, again.status
    assert len(events(recommendation, AuditKind.APPROVED)) == 1
    assert browsing.problems_on(page) == []


def test_an_operator_rejects_with_a_reason_once(browsing: Browsing, operator: User) -> None:
    """
    GIVEN a recommendation awaiting approval
    WHEN the operator opens the card's details, types a reason and double-clicks Reject, then
        the form is posted again
    THEN it is rejected with that reason, by that operator, in exactly one `rejected` event,
    AND approving it afterwards is refused without changing anything
    """
    recommendation = awaiting_approval()
    page = browsing.page(operator)
    page.goto("/approvals/")
    card = page.locator(f"#recommendation-{recommendation.pk}")
    # The note is in the card's details, sent with the Reject button of its one-line summary.
    card.locator("summary").click()
    card.get_by_label(f"Reason for rejecting recommendation {recommendation.pk}").fill(
        REJECT_REASON
    )
    action, fields = form_fields(page, recommendation, "reject")
    approve_action, approve_fields = form_fields(page, recommendation, "approve")

    card.get_by_role("button", name="Reject").dblclick()

    expect(card).to_have_count(0)
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.REJECTED
    assert recommendation.decided_by == operator.get_username()
    assert recommendation.decision_note == REJECT_REASON
    rejected = events(recommendation, AuditKind.REJECTED)
    assert [(e.actor, e.payload["note"]) for e in rejected] == [
        (operator.get_username(), REJECT_REASON)
    ]
    assert recommendation not in claimable_for(recommendation.workload.cluster)

    again = page.request.post(action, form=fields)
    late_approval = page.request.post(approve_action, form=approve_fields)

    assert again.ok and "Already rejected." in again.text()
    assert late_approval.ok and "Not awaiting approval: it is rejected." in late_approval.text()
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.REJECTED
    assert len(events(recommendation, AuditKind.REJECTED)) == 1
    assert events(recommendation, AuditKind.APPROVED) == []
    assert browsing.problems_on(page) == []


def test_a_viewer_sees_the_queue_but_cannot_decide(browsing: Browsing, viewer: User) -> None:
    """
    GIVEN a recommendation awaiting approval and a signed-in viewer
    WHEN the viewer opens the Approvals and workload pages, then forges approve and reject
        POSTs with a valid CSRF token from the page (from the page's own fetch and directly)
    THEN the pages show the recommendation without Approve or Reject buttons,
    AND every forged POST is refused with 403 and nothing changes
    """
    recommendation = awaiting_approval()
    page = browsing.page(viewer)
    page.goto("/approvals/")
    card = page.locator(f"#recommendation-{recommendation.pk}")
    expect(card).to_contain_text(recommendation.reason)
    expect(page.get_by_text("Only operators can approve or reject")).to_be_visible()
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name="Reject")).to_have_count(0)
    expect(card.locator("form")).to_have_count(0)
    page.goto(f"/workloads/{recommendation.workload.pk}/")
    expect(page.locator(f"#recommendation-{recommendation.pk}")).to_contain_text(
        "Only operators can approve or reject"
    )
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    assert browsing.problems_on(page) == []

    token = page.locator("form.logout-form input[name=csrfmiddlewaretoken]").input_value()
    assert token
    statuses = []
    for decision in ("approve", "reject"):
        url = f"/recommendations/{recommendation.pk}/{decision}/"
        statuses.append(
            page.evaluate(
                """async ([url, token]) => {
                    const body = new URLSearchParams({csrfmiddlewaretoken: token, note: 'forged'});
                    const reply = await fetch(url, {method: 'POST', body, redirect: 'manual',
                                                    credentials: 'same-origin'});
                    return reply.status;
                }""",
                [url, token],
            )
        )
        direct = page.request.post(url, form={"csrfmiddlewaretoken": token, "note": "forged"})
        statuses.append(direct.status)
        assert "Only operators may approve or reject" in direct.text()

    assert statuses == [403, 403, 403, 403]
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    assert recommendation.decided_by == ""
    assert not AuditEvent.objects.filter(workload=recommendation.workload).exists()
