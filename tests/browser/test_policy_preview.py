"""A superuser previews an edited policy on the recorded history in the admin, then saves it, in a
real browser."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from recovery.demo.fleet import seed_demo_cluster
from recovery.models import Policy
from tests.browser.conftest import SCREENSHOT_DIR, Browsing, off_loop

pytestmark = pytest.mark.django_db(transaction=True)


# The stack's server keeps the content type ids it has read (Django's cache) while the tests'
# flushes make new ones: an admin save, which logs a LogEntry with one, is done once per run.


def open_preview(browsing: Browsing, user: User, theme: str) -> tuple[Page, Policy]:
    """demo-a100's admin form, with max_attempts raised to 10 and drain_nodes unticked,
    previewed on the last 14 days."""
    off_loop(seed_demo_cluster)
    policy = Policy.objects.get(name="demo-a100")
    assert (policy.max_attempts, policy.drain_nodes) == (2, True)
    page = browsing.page(user, color_scheme=theme)
    page.goto(f"/admin/recovery/policy/{policy.pk}/change/")
    page.locator("#id_max_attempts").fill("10")
    page.locator("#id_drain_nodes").uncheck()
    page.locator("#policy-preview-days").fill("14")
    page.get_by_role("button", name="Preview on the last 14 days").click()

    preview = page.locator("#policy-preview")
    expect(preview).to_be_visible()
    expect(preview).to_contain_text("Preview of this form on the last 14 days")
    expect(preview).to_contain_text("Nothing was saved.")
    different = preview.locator('[data-replay-differences] tr[data-verdict="different"]')
    expect(different.first).to_contain_text("restart excluding gpu-a100-")
    expect(preview.locator('[data-total="stops"][data-changed]')).to_have_count(1)
    expect(page.locator("#id_max_attempts")).to_have_value("10")
    expect(page.locator("#id_drain_nodes")).not_to_be_checked()
    expect(page.locator("#policy-preview-days")).to_have_value("14")
    expect(page.locator(".errornote")).to_have_count(0)
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOT_DIR / f"admin-policy-preview-{theme}.png", full_page=True)
    policy.refresh_from_db()
    assert (policy.max_attempts, policy.drain_nodes) == (2, True)
    return page, policy


def test_a_superuser_previews_a_policy_and_then_saves_it(
    browsing: Browsing, make_user: Callable[..., User]
) -> None:
    """
    GIVEN the demo history, whose policy demo-a100 stops a job after two attempts and drains nodes
    WHEN a superuser raises max_attempts to 10, unticks drain_nodes and presses
         "Preview on the last 14 days" on the policy's admin form
    THEN the preview shows the decisions that differ above the form, which keeps the edits, and
         the policy in the database is unchanged
    AND WHEN they press Save, the database holds the edits
    """
    root = make_user("root", is_staff=True, is_superuser=True)
    page, policy = open_preview(browsing, root, "light")

    page.locator('input[name="_save"]').click()
    expect(page.locator(".messagelist")).to_contain_text("was changed successfully")
    policy.refresh_from_db()
    assert (policy.max_attempts, policy.drain_nodes) == (10, False)
    assert browsing.problems_on(page) == []


def test_the_preview_reads_in_the_dark_theme(
    browsing: Browsing, make_user: Callable[..., User]
) -> None:
    root = make_user("root", is_staff=True, is_superuser=True)
    page, _ = open_preview(browsing, root, "dark")
    assert browsing.problems_on(page) == []
