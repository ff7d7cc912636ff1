"""Operators approve several recommendations at once on one-line cards, warned where no
controller will carry the approval out."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from recovery.audit.record import record_event
from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import AuditEvent, Recommendation
from tests.browser.conftest import SCREENSHOT_DIR, Browsing, off_loop, wait_until_live
from tests.factories import AnomalyFactory, ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db(transaction=True)

NOTE = "Xid 79 storm on rack 4: restart both without the bad nodes"
NO_CONTROLLER = (
    "No controller token is issued for train-a100: an approved recommendation will wait, "
    "and expire, until a controller runs for it."
)
# The acceptance bound; the design aims at about 45 px.
COLLAPSED_MAX_PX = 80


def three_awaiting() -> list[Recommendation]:
    cluster = ClusterFactory(name="train-a100")
    made = []
    for n, name in enumerate(("llama-pretrain", "mixtral-sft", "a-much-longer-job-name" * 6)):
        workload = WorkloadFactory(cluster=cluster, name=name)
        made.append(
            RecommendationFactory(
                workload=workload,
                anomaly=AnomalyFactory(workload=workload),
                excluded_nodes=[f"gpu-00{n + 1}"],
                expires_at=timezone.now() + timedelta(minutes=30),
            )
        )
    return made


def approved_events(recommendation: Recommendation) -> list[AuditEvent]:
    return [
        event
        for event in AuditEvent.objects.filter(
            workload=recommendation.workload, kind=AuditKind.APPROVED
        )
        if event.payload.get("recommendation") == recommendation.pk
    ]


def test_an_operator_approves_two_of_three_with_one_note(
    browsing: Browsing, operator: User
) -> None:
    """
    GIVEN three recommendations awaiting approval on a cluster no controller calls in for
    WHEN the operator ticks two, writes one note and presses Approve selected
    THEN those two are ready, each with one `approved` event carrying the note, the third still
         awaits; the page says 2 of 2 were approved and warns the approvals will wait
    """
    first, second, third = three_awaiting()
    page = browsing.page(operator)
    page.goto("/approvals/")
    for recommendation in (first, second, third):
        card = page.locator(f"#recommendation-{recommendation.pk}")
        wait = card.locator(".decision__wait")
        expect(wait).to_be_visible()
        expect(wait).to_have_attribute("title", NO_CONTROLLER)
        expect(wait).to_contain_text("No controller")

    page.get_by_label(f"Select recommendation {first.pk}").check()
    page.get_by_label(f"Select recommendation {third.pk}").check()
    page.get_by_label("Note for every selected recommendation").fill(NOTE)
    page.get_by_role("button", name="Approve selected").click()

    expect(page).to_have_url(re.compile(r"/approvals/$"))
    messages = page.locator(".messages")
    expect(messages.locator(".message--success")).to_have_text(
        f"Approved 2 of 2: recommendations {first.pk}, {third.pk}."
    )
    expect(messages.locator(".message--warning")).to_have_text(NO_CONTROLLER)
    expect(messages.locator(".message--warning")).to_be_visible()
    expect(page.locator(f"#recommendation-{first.pk}")).to_have_count(0)
    expect(page.locator(f"#recommendation-{third.pk}")).to_have_count(0)
    expect(page.locator(f"#recommendation-{second.pk}")).to_be_visible()
    # Still not carried out by anybody: the remaining card says so too.
    expect(page.locator(f"#recommendation-{second.pk} .decision__wait")).to_be_visible()

    for recommendation in (first, third):
        recommendation.refresh_from_db()
        assert recommendation.status == RecommendationStatus.READY
        assert [(e.actor, e.payload["note"]) for e in approved_events(recommendation)] == [
            (operator.get_username(), NOTE)
        ]
    second.refresh_from_db()
    assert second.status == RecommendationStatus.AWAITING_APPROVAL
    assert approved_events(second) == []
    assert browsing.problems_on(page) == []


def test_each_card_is_one_line_until_opened(browsing: Browsing, operator: User) -> None:
    """
    GIVEN three recommendations awaiting approval, one for a job with a very long name
    WHEN an operator opens the Approvals page at a laptop's width
    THEN each card is one line, under 80 px high, the job's id whole and its long name cut with
         the full text in the title, Approve and Reject in reach; opening its details shows the
         evidence
    """
    recommendations = three_awaiting()
    page = browsing.page(operator)
    page.goto("/approvals/")
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOT_DIR / "approvals-compact.png", full_page=True)
    for recommendation in recommendations:
        card = page.locator(f"#recommendation-{recommendation.pk}")
        box = card.bounding_box()
        assert box is not None and box["height"] < COLLAPSED_MAX_PX, box
        expect(card.get_by_role("button", name="Approve")).to_be_visible()
        expect(card.get_by_role("button", name="Reject")).to_be_visible()
        expect(card.get_by_text(recommendation.reason)).to_be_hidden()
    long_one = page.locator(f"#recommendation-{recommendations[2].pk}")
    workload = recommendations[2].workload
    expect(long_one.locator(".approval__target")).to_have_text(f"train-a100:{workload.job_id}")
    name = long_one.locator(".approval__name")
    expect(name).to_have_attribute("title", f"train-a100:{workload.job_id} {workload.name}")
    assert name.evaluate("el => el.scrollWidth > el.clientWidth"), "the long name is not cut"

    long_one.locator("summary").click()

    expect(long_one.get_by_text(recommendations[2].reason)).to_be_visible()
    expect(long_one.get_by_text("What would be done")).to_be_visible()
    expect(
        long_one.get_by_label(f"Reason for rejecting recommendation {recommendations[2].pk}")
    ).to_be_visible()
    opened = long_one.bounding_box()
    assert opened is not None and opened["height"] > COLLAPSED_MAX_PX
    page.screenshot(path=SCREENSHOT_DIR / "approvals-compact-open.png", full_page=True)
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 1
    assert browsing.problems_on(page) == []


def test_select_all_then_reject_with_one_note(browsing: Browsing, operator: User) -> None:
    """
    GIVEN three recommendations awaiting approval
    WHEN the operator follows "Select all on this page" and rejects with one note
    THEN all three are rejected with the note, and the queue is empty
    """
    recommendations = three_awaiting()
    page = browsing.page(operator)
    page.goto("/approvals/")

    page.get_by_role("link", name="Select all on this page").click()
    for recommendation in recommendations:
        expect(page.get_by_label(f"Select recommendation {recommendation.pk}")).to_be_checked()
    page.get_by_label("Note for every selected recommendation").fill(NOTE)
    page.get_by_role("button", name="Reject selected").click()

    expect(page.locator("#approval-queue")).to_contain_text("Nothing awaits approval.")
    expect(page.locator(".messages .message--success")).to_contain_text("Rejected 3 of 3")
    expect(page.locator(".messages .message--warning")).to_have_count(0)
    for recommendation in recommendations:
        recommendation.refresh_from_db()
        assert recommendation.status == RecommendationStatus.REJECTED
        assert recommendation.decision_note == NOTE
    assert browsing.problems_on(page) == []


def test_ticked_cards_stay_ticked_when_the_queue_updates_live(
    browsing: Browsing, operator: User
) -> None:
    """
    GIVEN an operator who ticked one card of three
    WHEN a new recommendation arrives and the queue is redrawn live
    THEN the new card is shown, the ticked one is still ticked and no other is
    """
    first, second, third = three_awaiting()
    page = browsing.page(operator)
    page.goto("/approvals/")
    wait_until_live(page)
    page.get_by_label(f"Select recommendation {second.pk}").check()

    workload = WorkloadFactory(cluster=first.workload.cluster, name="arrived-later")
    arrived = RecommendationFactory(
        workload=workload,
        anomaly=AnomalyFactory(workload=workload),
        expires_at=timezone.now() + timedelta(minutes=30),
    )
    off_loop(
        record_event,
        cluster=workload.cluster,
        workload=workload,
        attempt=None,
        kind=AuditKind.RECOMMENDED,
        actor="policy",
        payload={"recommendation": arrived.pk},
    )

    expect(page.locator(f"#recommendation-{arrived.pk}")).to_be_visible(timeout=10_000)
    expect(page.get_by_label(f"Select recommendation {second.pk}")).to_be_checked()
    for other in (first, third, arrived):
        expect(page.get_by_label(f"Select recommendation {other.pk}")).not_to_be_checked()
