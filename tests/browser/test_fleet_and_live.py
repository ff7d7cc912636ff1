"""Signing in, the fleet, and events from a Celery worker reaching an open page by themselves."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from recovery.choices import AuditKind, RecommendationStatus, WorkloadState
from recovery.models import AuditEvent
from tests.browser.conftest import Browsing, wait_until_live
from tests.browser.stack import BrowserStack
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db(transaction=True)

NO_RELOAD_MARKER = "window.__notReloaded"


def mark_page(page: object) -> None:
    page.evaluate(f"() => {{ {NO_RELOAD_MARKER} = 'still here'; }}")  # type: ignore[attr-defined]


def page_was_not_reloaded(page: object) -> bool:
    return (
        page.evaluate(  # type: ignore[attr-defined]
            f"() => {NO_RELOAD_MARKER} === 'still here' && "
            "performance.getEntriesByType('navigation').length === 1"
        )
        is True
    )


def test_signing_in_through_the_form_shows_the_fleet(
    browsing: Browsing, operator: User, stack: BrowserStack
) -> None:
    """
    GIVEN three workloads on two clusters
    WHEN an operator signs in through the login form (after one wrong password)
    THEN the fleet lists the three workloads, each linking to its page
    """
    cluster = ClusterFactory(name="train-a100")
    workloads = [
        WorkloadFactory(cluster=cluster, name="llama-pretrain", state=WorkloadState.RUNNING),
        WorkloadFactory(cluster=cluster, name="vision-finetune", state=WorkloadState.FAILED),
        WorkloadFactory(cluster=ClusterFactory(name="train-h100"), name="moe-sweep"),
    ]
    page = browsing.page()
    page.goto("/")
    expect(page).to_have_url(f"{stack.base_url}/accounts/login/?next=/")

    page.get_by_label("Username").fill(operator.get_username())
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_be_visible()

    page.get_by_label("Password").fill(TEST_PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{stack.base_url}/")
    expect(page.get_by_role("heading", name="Fleet", level=1)).to_be_visible()
    rows = page.locator("#fleet-rows tr")
    expect(rows).to_have_count(3)
    for workload in workloads:
        link = page.locator(f'a[href="/workloads/{workload.pk}/"]')
        row = rows.filter(has=link)
        expect(row.locator(link)).to_have_text(workload.job_id)
        expect(row).to_contain_text(workload.name)
    expect(rows.filter(has_text="vision-finetune")).to_contain_text("Failed")
    expect(page.locator(".user-chip__name")).to_have_text(operator.get_username())
    wait_until_live(page)
    assert browsing.problems_on(page) == []


def test_an_event_from_the_worker_appears_on_the_open_workload_page(
    browsing: Browsing, viewer: User, stack: BrowserStack
) -> None:
    """
    GIVEN a workload page open in the browser, live, with a ready recommendation past its deadline
    WHEN the watchdog task runs on the Celery worker (sent through the broker)
    THEN the worker's `expired` event shows in the page's audit trail within seconds,
    AND the recommendation shows as expired, without the page reloading
    """
    recommendation = RecommendationFactory(
        status=RecommendationStatus.READY,
        expires_at=timezone.now() - timedelta(minutes=1),
        workload=WorkloadFactory(cluster=ClusterFactory(name="train-a100")),
    )
    workload = recommendation.workload
    page = browsing.page(viewer)
    page.goto(f"/workloads/{workload.pk}/")
    wait_until_live(page)
    expect(page.locator("#audit-trail tr.empty-row")).to_have_count(1)
    mark_page(page)

    summary = stack.run_task("tasks.maintenance.run_watchdog")

    assert summary == {"expired": 1, "released": 0, "errors": []}
    event = AuditEvent.objects.get(workload=workload, kind=AuditKind.EXPIRED)
    assert event.actor == "watchdog"
    row = page.locator(f"#audit-trail #event-{event.pk}")
    expect(row).to_be_visible(timeout=5_000)
    expect(row).to_contain_text("Expired")
    expect(row).to_contain_text("watchdog")
    # It had been approved: expiring unclaimed, it is also an abandoned action.
    badges = page.locator(f"#recommendation-{recommendation.pk} .badge")
    expect(badges.filter(has_text="Expired")).to_have_count(1)
    expect(badges.filter(has_text="Abandoned")).to_have_count(1)
    assert page_was_not_reloaded(page)
    assert browsing.problems_on(page) == []
