"""An operator switches a cluster to action mode on its readiness page, in a real browser."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from recovery.choices import AuditKind, ClusterMode
from recovery.models import AuditEvent
from tests.browser.conftest import Browsing
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db(transaction=True)

REASON = "monitor-mode trial done: 40 decisions, 95 % agreement"


def test_an_operator_switches_to_action_mode_with_a_reason(
    browsing: Browsing, operator: User
) -> None:
    """
    GIVEN a cluster in monitor mode, its readiness page open in the light theme
    WHEN the operator reads the checklist, picks action mode and saves with a reason
    THEN the page says what changed, and the audit trail keeps the change with the reason
    """
    cluster = ClusterFactory(name="train-a100")
    page = browsing.page(operator, color_scheme="light")
    page.goto(f"/clusters/{cluster.pk}/readiness/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Readiness of")
    expect(page.locator('[data-check="trial"]')).to_have_attribute("data-state", "attention")
    expect(page.locator("#controls-confirm")).to_be_visible()

    page.get_by_label("Mode", exact=True).select_option(ClusterMode.ACTION)
    page.get_by_label("Acknowledge scheduler actions", exact=True).check()
    page.get_by_label("Reason", exact=True).fill(REASON)
    page.get_by_role("button", name="Save").click()

    expect(page.locator(".messages")).to_contain_text(
        "Changed on train-a100: mode monitor to action; acknowledgement of scheduler actions on"
    )
    expect(page.locator("#readiness-mode")).to_have_text("Action mode")
    cluster.refresh_from_db()
    assert cluster.acts_automatically
    changed = AuditEvent.objects.get(cluster=cluster, kind=AuditKind.MODE_CHANGED)
    assert changed.actor == operator.get_username()
    assert changed.payload["reason"] == REASON
    assert browsing.problems_on(page) == []
