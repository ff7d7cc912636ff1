"""The operator at 3 a.m.: what needs a person comes first, and the count of it follows them.

The fleet lists the workloads awaiting an approval first, one compact line each; the navigation
counts the recommendations awaiting approval on every page and keeps the count live.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Locator, Page, expect

from recovery.choices import RecommendationStatus, WorkloadState
from recovery.loop.policy import recommend
from recovery.loop.recommendations import approve
from recovery.models import Cluster, Recommendation, Workload
from tests.browser.conftest import SCREENSHOT_DIR, Browsing, off_loop, wait_until_live
from tests.browser.test_fleet_and_live import mark_page, page_was_not_reloaded
from tests.factories import (
    AnomalyFactory,
    AttemptFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

pytestmark = pytest.mark.django_db(transaction=True)

# One line of text in a row: the rows used to be about 85 px high.
COMPACT_ROW_PX = 45
LONG_NAME = "llama-3-405b-pretrain-stage2-long-context-annealing-rerun-after-node-failure"
LONG_USER = "a-rather-long-service-account-name"
# Whether a cell's text, or some of it, is cut (ellipsis) rather than shown whole.
CUT_SHORT = """td => [td, ...td.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth)"""


def a_busy_fleet() -> list[Workload]:
    """Workloads in every state, long texts among them; the two awaiting approval were active
    longest ago, so only the attention order puts them first. Returns those two."""
    a100, h100 = ClusterFactory(name="train-a100"), ClusterFactory(name="train-h100")
    now = timezone.now()
    awaiting = []
    for n, cluster in enumerate((a100, h100)):
        workload = WorkloadFactory(
            cluster=cluster, name=f"{LONG_NAME}-{n}", user=LONG_USER, state=WorkloadState.FAILED
        )
        anomaly = AnomalyFactory(workload=workload)
        RecommendationFactory(workload=workload, anomaly=anomaly)
        awaiting.append(workload)
    for state in (
        WorkloadState.RUNNING,
        WorkloadState.COMPLETED,
        WorkloadState.FAILED,
        WorkloadState.REQUEUED,
        WorkloadState.STOPPED,
        WorkloadState.PENDING,
    ):
        WorkloadFactory(
            cluster=a100,
            name=LONG_NAME,
            user=LONG_USER,
            state=state,
            opted_in=state != WorkloadState.PENDING,
            opt_in_error="" if state != WorkloadState.PENDING else "no nvidia-recovery key",
            last_progress_step=184_000,
            last_progress_at=now - timedelta(minutes=3),
            last_checkpoint_step=180_000,
        )
    Workload.objects.filter(pk__in=[w.pk for w in awaiting]).update(
        updated_at=now - timedelta(days=2)
    )
    return awaiting


def nav_count(page: Page) -> Locator:
    return page.locator("#nav-approvals-count")


def approvals_link(page: Page) -> Locator:
    return page.get_by_role("navigation", name="Main").get_by_role("link", name="Approvals")


def test_the_fleet_leads_with_what_awaits_approval_in_compact_rows(
    browsing: Browsing, operator: User
) -> None:
    """
    GIVEN a fleet in every state, with long names and users, two workloads awaiting approval
          whose activity is the oldest
    WHEN an operator opens the fleet at 1280 px
    THEN the first two rows are those awaiting approval, marked, linking to their cluster's
         queue; every row is one line (under 45 px), long texts cut with their whole text on
         hover; and neither the page nor the table scrolls sideways
    """
    awaiting = a_busy_fleet()
    page = browsing.page(operator)
    page.goto("/")
    wait_until_live(page)

    rows = page.locator("#fleet-rows tr")
    expect(rows).to_have_count(8)
    for position, workload in enumerate(sorted(awaiting, key=lambda w: -w.pk)):
        row = rows.nth(position)
        expect(row.locator(f'a[href="/workloads/{workload.pk}/"]')).to_be_visible()
        expect(row).to_have_class("fleet-row--awaiting")
        badge = row.get_by_role("link", name="Awaiting approval")
        expect(badge).to_be_visible()
        expect(badge).to_have_attribute(
            "href", re.compile(rf"^/approvals/\?cluster={workload.cluster.name}#recommendation-")
        )
    expect(rows.nth(2)).not_to_have_class("fleet-row--awaiting")

    heights = [box["height"] for box in (row.bounding_box() for row in rows.all()) if box]
    assert len(heights) == 8
    assert max(heights) < COMPACT_ROW_PX, heights
    name_cell = rows.nth(0).locator("td").nth(1)
    expect(name_cell).to_have_attribute("title", f"{LONG_NAME}-1")
    assert name_cell.evaluate(CUT_SHORT), "the long name is not cut"
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 1
    table = page.locator(".table-wrap").filter(has=rows.first)
    assert table.evaluate("wrap => wrap.scrollWidth - wrap.clientWidth") <= 1, "table scrolls"
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOT_DIR / "fleet-triage.png", full_page=True)

    # The badge takes the operator to the queue of that workload's cluster.
    rows.nth(0).get_by_role("link", name="Awaiting approval").click()
    expect(page).to_have_url(re.compile(r"/approvals/\?cluster=train-h100#recommendation-\d+$"))
    expect(page.locator(".rec--pending")).to_have_count(1)
    assert browsing.problems_on(page) == []


def a_failure_to_recommend_on(cluster: Cluster) -> Workload:
    workload = WorkloadFactory(cluster=cluster, name="llama-pretrain")
    AttemptFactory(workload=workload)
    return workload


def recommend_after_a_failure(workload: Workload) -> Recommendation:
    """The policy's own path: the recommendation, its `recommended` event, announced live."""
    anomaly = AnomalyFactory(workload=workload, attempt=workload.attempts.get())
    recommendation = recommend(anomaly)
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    return recommendation


def expect_count(page: Page, count: int) -> None:
    if count:
        expect(nav_count(page).locator(".nav-count__badge")).to_have_text(str(count))
        expect(approvals_link(page)).to_have_accessible_name(
            f"Approvals ({count} awaiting approval)"
        )
    else:
        expect(nav_count(page).locator(".nav-count__badge")).to_have_count(0)
        expect(approvals_link(page)).to_have_accessible_name("Approvals")


@pytest.mark.parametrize(
    "where",
    [
        # No live channel of its own: the count opens one.
        "unexplained",
        # A workload's own channel: the count listens to the fleet beside it.
        "workload",
        # Listening to the fleet already: the page's live refresh renders the count.
        "nodes",
    ],
)
def test_the_navigation_count_follows_recommendations_live(
    browsing: Browsing, viewer: User, operator: User, where: str
) -> None:
    """
    GIVEN a viewer on a page other than the approval queue, nothing awaiting approval
    WHEN the policy recommends a restart that awaits approval, and then an operator approves it
    THEN the Approvals link's count shows 1, then nothing, without the page reloading
    """
    cluster = ClusterFactory(name="train-a100")
    workload = a_failure_to_recommend_on(cluster)
    other = a_failure_to_recommend_on(cluster)
    path = {
        "unexplained": "/unexplained/",
        "workload": f"/workloads/{other.pk}/",
        "nodes": "/nodes/",
    }[where]
    page = browsing.page(viewer)
    page.goto(path)
    if where == "nodes":
        wait_until_live(page)
    else:
        expect(nav_count(page)).to_have_attribute("data-live-state", "live")
        if where == "workload":
            wait_until_live(page)
    expect_count(page, 0)
    mark_page(page)

    recommendation = off_loop(recommend_after_a_failure, workload)
    expect_count(page, 1)

    decision = off_loop(approve, recommendation.pk, operator=operator.get_username())
    assert decision.changed
    expect_count(page, 0)

    assert page_was_not_reloaded(page)
    assert browsing.problems_on(page) == []


def test_the_count_catches_up_with_what_happened_before_it_listened(
    browsing: Browsing, viewer: User
) -> None:
    """
    GIVEN a recommendation made while a page was on its way to the browser
    WHEN the page's count starts listening
    THEN it shows the recommendation anyway (it reads the count once listening)
    """
    workload = a_failure_to_recommend_on(ClusterFactory(name="train-a100"))
    page = browsing.page(viewer)
    # The page is rendered with no count; the recommendation lands before its script runs.
    page.route(
        "**/static/console/nav_badge*.js",  # hashed by the stack's static storage
        lambda route: (off_loop(recommend_after_a_failure, workload), route.continue_()),
    )
    page.goto("/unexplained/")
    expect_count(page, 1)
    assert browsing.problems_on(page) == []


# Items of an excluded-node list that reach past the right edge of their definition.
ITEMS_SPILLING = """dd => [...dd.querySelectorAll('li')]
  .filter(li => li.getBoundingClientRect().right > dd.getBoundingClientRect().right + 1)
  .map(li => li.textContent)"""


def test_excluded_nodes_with_their_reasons_stay_in_their_column(
    browsing: Browsing, viewer: User
) -> None:
    """
    GIVEN a recommendation excluding three nodes, each with where its exclusion came from
    WHEN its workload's page shows it at 1280 px
    THEN each node is an item of a list, wrapped within its column, with no comma between
    """
    nodes = ["gpu-a100-007", "gpu-a100-012", "gpu-a100-031"]
    recommendation = RecommendationFactory(
        workload=WorkloadFactory(cluster=ClusterFactory(name="train-a100")),
        excluded_nodes=nodes,
        exclusion_sources={
            "gpu-a100-007": "cluster: unhealthy",
            "gpu-a100-012": "implicated",
            "gpu-a100-031": "earlier attempt",
        },
    )
    page = browsing.page(viewer)
    page.goto(f"/workloads/{recommendation.workload.pk}/")

    excluded = page.locator(f"#recommendation-{recommendation.pk} dd").filter(
        has=page.locator("ul.node-list")
    )
    items = excluded.get_by_role("listitem")
    expect(items).to_have_text(
        [
            "gpu-a100-007 (cluster: unhealthy)",
            "gpu-a100-012 (implicated)",
            "gpu-a100-031 (earlier attempt)",
        ]
    )
    assert "," not in excluded.inner_text()
    assert excluded.evaluate(ITEMS_SPILLING) == []
    assert excluded.evaluate("dd => dd.scrollWidth <= dd.clientWidth + 1")
    assert browsing.problems_on(page) == []
