"""The workflow pages in a real browser, light and dark: the list, one workflow's jobs on one
timeline, and the way there from a job's page. Screenshots: var/screenshots/workflow*-<theme>.png.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db.models import Count
from playwright.sync_api import expect

from recovery.demo.fleet import seed_demo_cluster
from recovery.loop.workflows import workflow_budget
from recovery.models import Workflow
from tests.browser.conftest import Browsing
from tests.browser.test_every_page import THEMES, check_page

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_workflow_pages_render_and_lead_from_a_job_to_its_workflow(
    browsing: Browsing, viewer: User
) -> None:
    """
    GIVEN the demo fleet, where a pretraining run went on from one job to the next
    WHEN a viewer opens a job of that workflow and follows its workflow link, in both themes
    THEN the workflow page lists both jobs, the budget they share and the nodes kept out, and
         draws every attempt of both jobs on one timeline; the list of workflows renders too
    """
    seed_demo_cluster()
    workflow = Workflow.objects.annotate(jobs=Count("workloads")).order_by("-jobs", "pk").first()
    assert workflow is not None and workflow.workloads.count() >= 2
    job = workflow.workloads.order_by("-submit_time").first()
    assert job is not None
    # Counted as the policy counts them: the first job ended at its time limit, as planned.
    budget = workflow_budget(workflow)
    assert budget is not None
    attempts = budget.attempts
    problems: dict[str, list[str]] = {}
    for theme in THEMES:
        page = browsing.page(viewer, color_scheme=theme)
        page.goto(f"/workloads/{job.pk}/")
        page.get_by_test_id("workload-workflow").get_by_role("link", name=workflow.name).click()
        expect(page).to_have_url(f"{browsing.stack.base_url}/workflows/{workflow.pk}/")
        problems[f"workflow-{theme}"] = check_page(page, "workflow", None, theme)
        for member in workflow.workloads.all():
            expect(page.get_by_role("link", name=member.job_id, exact=True)).to_be_visible()
        expect(page.get_by_test_id("workflow-attempts")).to_contain_text(f"{attempts} · budget")
        chart = page.locator('.chart[data-chart-source="workflow-timeline-figure"]')
        expect(chart).to_have_attribute("data-chart-drawn", "yes")
        rows = page.evaluate(
            "() => JSON.parse(document.getElementById('workflow-timeline-figure').textContent)"
            ".layout.yaxis.categoryarray"
        )
        assert len(rows) == sum(w.attempts.count() for w in workflow.workloads.all()), rows
        problems[f"workflows-{theme}"] = check_page(page, "workflows", "/workflows/", theme)
        expect(page.get_by_role("link", name=workflow.name)).to_be_visible()
        problems[f"console-{theme}"] = browsing.problems_on(page)
    assert not any(problems.values()), problems
