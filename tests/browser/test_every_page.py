"""Every Console page renders cleanly in a real browser, in the light and the dark theme.

Clean: the page answers 200, has a heading, its live channel connects, its charts draw, nothing
overflows sideways at a laptop's width, the theme's background applies, its icon loads, and the
browser reports no console error, no script error and no failed same-origin request. Each page
is saved as a full-page screenshot, var/screenshots/<page>-<theme>.png, for a person to look at.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db.models import Count
from django.utils import timezone
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from recovery.choices import (
    DRAIN_REASON_PREFIX,
    AnomalyKind,
    AuditKind,
    Confirmation,
    Disposition,
    FailureCategory,
    NodeHealth,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.demo.fleet import A100_CLUSTER, seed_demo_cluster
from recovery.models import (
    Anomaly,
    AuditEvent,
    Node,
    ProgressSample,
    Recommendation,
    Workload,
)
from tests.browser.conftest import SCREENSHOT_DIR, Browsing, log_in, off_loop

pytestmark = pytest.mark.django_db(transaction=True)

THEMES = ("light", "dark")
CHARTS_SETTLED = """() => [...document.querySelectorAll('.chart[data-chart-source]')].every(
    chart => chart.hasAttribute('data-chart-drawn') || chart.hasAttribute('data-chart-error'))"""
# The relative luminance of the first opaque background from <body> up; 1 is white.
BACKGROUND_LUMINANCE = """() => {
    for (const el of [document.body, document.documentElement]) {
        const m = getComputedStyle(el).backgroundColor.match(/[\\d.]+/g);
        if (!m || (m.length > 3 && Number(m[3]) === 0)) continue;
        const [r, g, b] = m.slice(0, 3).map(v => { v = v / 255;
            return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
        return 0.2126 * r + 0.7152 * g + 0.0722 * b;
    }
    return null;
}"""


def seed_a_realistic_fleet() -> dict[str, str]:
    """The demo fleet (two clusters, stories in every state), plus progress samples and a suspect
    node; returns the pages to visit, by name."""
    seed_demo_cluster()
    now = timezone.now()
    running = (
        Workload.objects.filter(cluster__name=A100_CLUSTER, state=WorkloadState.RUNNING)
        .order_by("pk")
        .first()
    )
    assert running is not None, "the demo fleet has no running workload"
    ProgressSample.objects.bulk_create(
        ProgressSample(
            workload=running,
            attempt=running.current_attempt or 1,
            rank=rank,
            node=f"gpu-a100-00{rank + 1}",
            step=1000 + 10 * i,
            throughput=3100.0 - 40 * rank + (i % 5) * 12,
            step_time_seconds=1.9 + 0.05 * rank,
            at=now - timedelta(seconds=20 * (60 - i)),
        )
        for i in range(60)
        for rank in range(4)
    )
    # One restart the scheduler did not carry through: the banner and its disposition show.
    Recommendation.objects.filter(
        pk=Recommendation.objects.filter(status=RecommendationStatus.EXECUTED)
        .order_by("pk")
        .values("pk")[:1]
    ).update(
        disposition=Disposition.ABANDONED,
        disposition_reason="abandoned: the job is FAILED and Slurm will not requeue it",
    )
    node = Node.objects.filter(cluster__name=A100_CLUSTER).order_by("name").last()
    assert node is not None
    node.suspect_since = now - timedelta(minutes=20)
    node.suspect_reason = "implicated in 3 workloads' failures within 24 h"
    node.health = NodeHealth.SUSPECT
    node.save()
    seed_drains(running, now)
    richest = (
        Workload.objects.annotate(events=Count("audit_events"))
        .order_by("-events", "pk")
        .values_list("pk", flat=True)
        .first()
    )
    event = (
        AuditEvent.objects.filter(kind=AuditKind.APPROVED).order_by("pk").first()
        or AuditEvent.objects.order_by("pk").first()
    )
    assert richest is not None and event is not None
    unexplained = seed_unexplained(running)
    return {
        "fleet": "/",
        "workload": f"/workloads/{richest}/",
        "approvals": "/approvals/",
        "nodes": "/nodes/",
        "unexplained": "/unexplained/",
        "teach-pattern": f"/unexplained/{unexplained.pk}/teach/?line=2",
        "insights": "/insights/",
        "audit": "/audit/",
        "audit-event": f"/audit/{event.pk}/",
        "clusters": "/clusters/",
        "readiness": f"/clusters/{running.cluster_id}/readiness/",
        # demo-a100 with a larger retry budget: the totals change and differing rows show.
        "replay": f"/clusters/{running.cluster_id}/replay/?overrides="
        "%7B%22name%22%3A%22demo-a100%22%2C%22max_attempts%22%3A10%7D",
    }


def seed_unexplained(workload: Workload) -> Anomaly:
    """A failure nothing explained, with long last lines: the page must wrap them."""
    at = timezone.now() - timedelta(minutes=7)
    return Anomaly.objects.create(
        workload=workload,
        kind=AnomalyKind.CRASH,
        category=FailureCategory.UNEXPLAINED,
        signature="slurm-failed-exit-3",
        evidence_line="Slurm job state FAILED, exit code 3",
        fingerprint="browser:unexplained",
        evidence_at=at,
        detected_at=at,
        confirmation=Confirmation.CONFIRMED,
        details={
            "role": "wrapper",
            "exit_code": 3,
            "last_lines": [
                "step 4180 loss 1.9212 tps 5,102",
                "wrapper: /scratch/" + "very-long-path-segment/" * 18 + "shard-0042.bin: retry",
                " 3: 2024-05-01T10:00:07Z weka: io stalled on fd 0x7f3a for 120 s (tries=3)",
            ],
        },
    )


def seed_drains(workload: Workload, now: datetime) -> None:
    """A drain awaiting approval and a node recovery drained: the approvals page's drain card,
    the Nodes page's drain column and its resume button show."""
    first, second = Node.objects.filter(cluster=workload.cluster).order_by("name")[:2]
    reason = f"{DRAIN_REASON_PREFIX} hardware: gpu_hardware (xid-79) on {{}}, from node kernel log"
    for node, status in (
        (first, RecommendationStatus.AWAITING_APPROVAL),
        (second, RecommendationStatus.EXECUTED),
    ):
        Recommendation.objects.create(
            workload=workload,
            node=node,
            action=RecommendationAction.DRAIN,
            reason=reason.format(node.name),
            status=status,
            disposition=Disposition.CONVERGED if status == RecommendationStatus.EXECUTED else "",
            idempotency_key=f"browser:drain:{node.pk}",
            created_at=now - timedelta(minutes=3),
        )
    second.scheduler_state, second.state_reason = "IDLE+DRAIN", reason.format(second.name)
    second.times_implicated = max(second.times_implicated, 1)
    second.save()


def icon_problems(page: Page) -> list[str]:
    """The page's icon must load: without one Chromium asks for /favicon.ico, and its 404 is a
    console error (once per browser, so the console listener alone would miss it by chance)."""
    href = page.evaluate("() => document.querySelector('link[rel~=\"icon\"]')?.href ?? null")
    if href and href.startswith("data:"):
        return []
    url = href or "/favicon.ico"  # relative to the context's base URL
    status = page.request.get(url).status
    if status == 200:
        return []
    named = "the <link rel=icon>" if href else "no <link rel=icon>, so the browser's own"
    return [f"{named} request for {url} answers {status}"]


# Text wider than its table cell, drawn over the next column (a cell that clips or scrolls its
# overflow, as an ellipsis does, is fine).
CELLS_SPILLING = """() => [...document.querySelectorAll('td, th')]
  .filter(cell => cell.getClientRects().length)
  .filter(cell => getComputedStyle(cell).overflowX === 'visible')
  .filter(cell => cell.scrollWidth > cell.clientWidth + 1)
  .map(cell => cell.innerText.trim().slice(0, 80))"""

# A Plotly chart whose mode bar overlaps its legend.
LEGENDS_COVERED = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(plot => {
  const bar = plot.querySelector('.modebar'), legend = plot.querySelector('.legend');
  if (!bar || !legend || !bar.getClientRects().length) return false;
  const a = bar.getBoundingClientRect(), b = legend.getBoundingClientRect();
  return a.width && b.width && a.left < b.right && b.left < a.right
    && a.top < b.bottom && b.top < a.bottom;
}).map(plot => plot.closest('[id]') ? plot.closest('[id]').id : 'a chart')"""


def check_page(page: Page, name: str, path: str | None, theme: str) -> list[str]:
    """Open ``path`` (None: stay on the current page), check it, save its screenshot."""
    problems = []
    if path is not None:
        response = page.goto(path)
        if response is None or response.status != 200:
            return [f"answers {response.status if response else 'nothing'}"]
    page.wait_for_load_state("load")
    if page.locator("h1").count() == 0:
        problems.append("has no <h1>")
    if page.locator("[data-live-url]").count():
        try:
            page.wait_for_selector('#live-status[data-state="live"]', state="attached")
        except PlaywrightError:
            state = page.locator("#live-status").get_attribute("data-state")
            problems.append(f"live channel not connected (status {state!r})")
    try:
        page.wait_for_function(CHARTS_SETTLED)
    except PlaywrightError:
        problems.append("charts not drawn within 10 s")
    for chart in page.locator(".chart[data-chart-error]").all():
        problems.append(f"chart error: {chart.get_attribute('data-chart-error')}")
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    if overflow > 1:
        problems.append(f"overflows sideways by {overflow}px at 1280px")
    for cell in page.evaluate(CELLS_SPILLING):
        problems.append(f"table cell spills into the next: {cell!r}")
    for chart in page.evaluate(LEGENDS_COVERED):
        problems.append(f"the chart's toolbar covers its legend: {chart}")
    luminance = page.evaluate(BACKGROUND_LUMINANCE)
    if luminance is None or (luminance < 0.5) != (theme == "dark"):
        problems.append(f"background luminance {luminance} does not fit the {theme} theme")
    problems += icon_problems(page)
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOT_DIR / f"{name}-{theme}.png", full_page=True)
    return problems


def test_every_page_renders_cleanly_in_light_and_dark(browsing: Browsing, operator: User) -> None:
    """
    GIVEN a realistic fleet: two clusters, workloads in various states, attempts on nodes,
          anomalies with evidence, recommendations awaiting approval, suspect and excluded nodes,
          audit events and progress samples
    WHEN an operator opens every page, in the light and in the dark colour scheme
    THEN each renders cleanly (see the module docstring), and a screenshot of each is saved
    """
    pages = off_loop(seed_a_realistic_fleet)
    problems: dict[str, list[str]] = {}
    for theme in THEMES:
        page = browsing.page(color_scheme=theme)
        page.goto("/accounts/login/")
        problems[f"login-{theme}"] = check_page(page, "login", None, theme)
        problems[f"login-{theme}"] += browsing.problems_on(page)
        log_in(page, operator)
        for name, path in pages.items():
            found = check_page(page, name, path, theme)
            problems[f"{name}-{theme} ({path})"] = found + browsing.problems_on(page)

    failing = {page: found for page, found in problems.items() if found}
    assert not failing, "pages with problems:\n" + "\n".join(
        f"  {page}:\n" + "\n".join(f"    - {problem}" for problem in found)
        for page, found in failing.items()
    )
