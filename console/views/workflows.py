"""Workflows: the list, and one workflow's jobs, budget and excluded nodes on one page."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from console.access import console_view
from console.charts import figure_payload
from console.workflow_timeline import chart_height, workflow_timeline_figure
from recovery.loop.workflows import workflow_budget
from recovery.models import Cluster, Workflow
from recovery.read.filters import WorkflowListFilterSet
from recovery.read.workflows import load_workflow_timeline, workflow_rows

WORKFLOWS_PAGE_SIZE = 50


@console_view("recovery.view_workflow", "Viewing workflows")
def workflow_list(request: HttpRequest) -> HttpResponse:
    filterset = WorkflowListFilterSet(request.GET, queryset=Workflow.objects.all())
    filters = {
        "cluster": filterset.value("cluster") or "",
        "user": filterset.value("user") or "",
        "search": filterset.value("q") or "",
    }
    page = Paginator(workflow_rows(filterset.qs), WORKFLOWS_PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render(
        request,
        "console/workflows.html",
        {
            "page": page,
            "filters": filters,
            "filtered": any(filters.values()),
            "ignored": [problem.message for problem in filterset.problems],
            "clusters": list(Cluster.objects.order_by("name").values_list("name", flat=True)),
        },
    )


@console_view("recovery.view_workflow", "Viewing a workflow")
def workflow_detail(request: HttpRequest, workflow_id: int) -> HttpResponse:
    workflow = get_object_or_404(Workflow.objects.select_related("cluster"), pk=workflow_id)
    timeline = load_workflow_timeline(workflow, now=timezone.now())
    return render(
        request,
        "console/workflow.html",
        {
            "workflow": workflow,
            "jobs": timeline.jobs[::-1],
            "older_jobs_hidden": timeline.older_jobs_hidden,
            "budget": workflow_budget(workflow),
            "timeline": figure_payload(workflow_timeline_figure(timeline)),
            "chart_height": chart_height(len(timeline.attempts)),
        },
    )


@console_view("recovery.view_workflow", "Viewing a workflow")
def workflow_timeline(request: HttpRequest, workflow_id: int) -> JsonResponse:
    """The workflow page's timeline figure as JSON, for scripts and for redrawing it."""
    workflow = get_object_or_404(Workflow.objects.select_related("cluster"), pk=workflow_id)
    return JsonResponse(figure_payload(workflow_timeline_figure(load_workflow_timeline(workflow))))
