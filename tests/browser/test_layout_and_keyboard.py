"""Nothing jumps while pages load and update live, and the keyboard reaches what matters."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Page, expect

from recovery.audit.record import record_event
from recovery.choices import AuditKind, RecommendationStatus, WorkloadState
from recovery.models import AuditEvent, Workload
from tests.browser.conftest import Browsing, off_loop, wait_until_live
from tests.factories import (
    AnomalyFactory,
    AttemptFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

pytestmark = pytest.mark.django_db(transaction=True)

# Google's "good" cumulative layout shift is at most 0.1.
CLS_LIMIT = 0.1
# Installed before any page script runs; `buffered` also reports shifts from before it started.
MEASURE_LAYOUT_SHIFT = """
window.__cls = 0;
window.__shifts = [];
new PerformanceObserver(list => {
    for (const entry of list.getEntries()) {
        if (entry.hadRecentInput) continue;
        window.__cls += entry.value;
        window.__shifts.push({
            value: entry.value,
            moved: (entry.sources || []).map(s => s.node
                ? `${s.node.nodeName}#${s.node.id || ''}.${s.node.className || ''}` : '?'),
        });
    }
}).observe({type: 'layout-shift', buffered: true});
"""
FOCUSED = """() => {
    const el = document.activeElement;
    const style = getComputedStyle(el);
    const rect = el.getBoundingClientRect();
    return {
        tag: el.tagName, id: el.id, classes: el.className, text: (el.textContent || '').trim(),
        href: el.getAttribute('href'),
        outline: style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0,
        shadow: style.boxShadow !== 'none',
        onScreen: rect.width > 0 && rect.height > 0 && rect.top >= 0 && rect.left >= 0,
    };
}"""
NAV_LINKS = ["Fleet", "Approvals", "Nodes", "Insights", "Audit trail", "Clusters"]


def layout_shift(page: Page) -> tuple[float, list[dict[str, Any]]]:
    # Layout-shift entries arrive after the frame that moved things: let two frames pass.
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    page.wait_for_timeout(300)
    return page.evaluate("() => window.__cls"), page.evaluate("() => window.__shifts")


def a_workload_with_history(name: str) -> Workload:
    workload = WorkloadFactory(
        cluster=ClusterFactory(name="train-a100"),
        name=name,
        last_progress_step=18_400,
        last_progress_at=timezone.now() - timedelta(minutes=2),
        last_checkpoint_step=18_000,
        last_checkpoint_at=timezone.now() - timedelta(minutes=9),
    )
    attempt = AttemptFactory(workload=workload, nodes=["gpu-001", "gpu-002", "gpu-003"])
    anomaly = AnomalyFactory(workload=workload, attempt=attempt)
    RecommendationFactory(workload=workload, anomaly=anomaly, attempt=attempt)
    for kind in (AuditKind.DETECTED, AuditKind.ATTRIBUTED, AuditKind.RECOMMENDED):
        off_loop(
            record_event, cluster=workload.cluster, workload=workload, attempt=1, kind=kind,
            actor="policy", payload={"anomaly": anomaly.pk},
        )  # fmt: skip
    return workload


def fail_workload(workload: Workload) -> AuditEvent:
    Workload.objects.filter(pk=workload.pk).update(
        state=WorkloadState.FAILED, state_reason="NodeFail on gpu-002"
    )
    return record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=1,
        kind=AuditKind.STATE_CHANGED,
        actor="poller",
        payload={"from": WorkloadState.RUNNING, "to": WorkloadState.FAILED},
    )


def test_the_fleet_does_not_shift_on_load_or_live_update(browsing: Browsing, viewer: User) -> None:
    """
    GIVEN a fleet of six workloads, one with an anomaly and a pending recommendation
    WHEN the fleet page loads and then updates live (a workload fails)
    THEN its cumulative layout shift stays under 0.1
    """
    workloads = [a_workload_with_history("llama-pretrain")]
    workloads += [WorkloadFactory(cluster=workloads[0].cluster) for _ in range(5)]
    page = browsing.page(viewer)
    page.add_init_script(MEASURE_LAYOUT_SHIFT)
    page.goto("/")
    wait_until_live(page)

    off_loop(fail_workload, workloads[-1])

    row = page.locator("#fleet-rows tr").filter(
        has=page.locator(f'a[href$="/{workloads[-1].pk}/"]')
    )
    expect(row).to_contain_text("Failed", timeout=5_000)
    cls, shifts = layout_shift(page)
    assert cls < CLS_LIMIT, shifts
    assert browsing.problems_on(page) == []


def test_the_workload_page_does_not_shift_on_load_or_live_update(
    browsing: Browsing, viewer: User
) -> None:
    """
    GIVEN a workload with an attempt, an anomaly with evidence, a recommendation and events
    WHEN its page loads (charts included) and then updates live (the workload fails)
    THEN its cumulative layout shift stays under 0.1
    """
    workload = a_workload_with_history("llama-pretrain")
    page = browsing.page(viewer)
    page.add_init_script(MEASURE_LAYOUT_SHIFT)
    page.goto(f"/workloads/{workload.pk}/")
    wait_until_live(page)
    page.wait_for_function(
        """() => [...document.querySelectorAll('.chart[data-chart-source]')].every(
            c => c.hasAttribute('data-chart-drawn') || c.hasAttribute('data-chart-error'))"""
    )

    event = off_loop(fail_workload, workload)

    expect(page.locator(f"#audit-trail #event-{event.pk}")).to_be_visible(timeout=5_000)
    expect(page.locator("#workload-summary")).to_contain_text("Failed")
    cls, shifts = layout_shift(page)
    assert cls < CLS_LIMIT, shifts
    assert browsing.problems_on(page) == []


def test_the_keyboard_reaches_the_skip_link_the_nav_and_approve_with_visible_focus(
    browsing: Browsing, operator: User
) -> None:
    """
    GIVEN an operator on the Approvals page with one recommendation awaiting approval
    WHEN they press Tab from the top of the page
    THEN focus goes first to the skip link (shown on screen), then through the main navigation,
        and on to the Approve button; every focused element shows a visible focus style,
    AND the skip link moves focus to the main content
    """
    recommendation = RecommendationFactory(
        workload=WorkloadFactory(cluster=ClusterFactory(name="train-a100")),
        status=RecommendationStatus.AWAITING_APPROVAL,
    )
    page = browsing.page(operator)
    page.goto("/approvals/")
    page.locator("body").focus()

    visited = []
    for _ in range(60):
        page.keyboard.press("Tab")
        focused = page.evaluate(FOCUSED)
        visited.append(focused)
        if focused["tag"] == "BUTTON" and focused["text"] == "Approve":
            break

    first = visited[0]
    assert "skip-link" in first["classes"] and first["text"] == "Skip to content", first
    assert first["onScreen"], "the focused skip link stays off screen"
    # The Approvals link carries its count of pending approvals ("Approvals1 (1 awaiting…)").
    texts = [re.sub(r"\d.*$", "", f["text"]).strip() for f in visited if f["tag"] == "A"]
    nav_order = [text for text in texts if text in NAV_LINKS]
    assert nav_order[: len(NAV_LINKS)] == NAV_LINKS, texts
    assert visited[-1]["text"] == "Approve", f"Tab never reached Approve: {visited}"
    assert page.locator(f"#recommendation-{recommendation.pk} button:focus").count() == 1
    unstyled = [f for f in visited if not (f["outline"] or f["shadow"])]
    assert unstyled == [], "focused without a visible focus style"

    page.goto("/approvals/")
    page.locator("body").focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == "main"
    assert browsing.problems_on(page) == []
