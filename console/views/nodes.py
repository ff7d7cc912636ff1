"""Nodes that need a look."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from console.access import console_view
from console.views.operator_actions import back, note_of, operator, refused
from recovery.loop.drains import request_resume
from recovery.loop.node_health import return_to_service
from recovery.models import Cluster, Node
from recovery.read.filters import NODE_FLAGS, FlaggedNodeFilterSet
from recovery.read.nodes import SUSPECT, standing
from recovery.read.queries import open_node_actions

NODES_PAGE_SIZE = 100


@console_view("recovery.view_node", "Viewing nodes")
def nodes(request: HttpRequest) -> HttpResponse:
    """Nodes that need a look: suspect, unhealthy, implicated in a failure, or excluded."""
    filters = {"cluster": request.GET.get("cluster", ""), "show": request.GET.get("show", "")}
    now = timezone.now()
    listed = FlaggedNodeFilterSet(
        request.GET, queryset=Node.objects.select_related("cluster"), now=now
    ).qs
    page = Paginator(listed, NODES_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "console/nodes.html",
        {
            "page": page,
            "filters": filters,
            "now": now,
            "clusters": Cluster.objects.values_list("name", flat=True),
            "shows": NODE_FLAGS,
            "suspect_count": listed.filter(SUSPECT).count(),
            "node_actions": open_node_actions([node.pk for node in page]),
            # Health and the Suspect column from one reading of the node (recovery.read.nodes).
            "standings": {node.pk: standing(node) for node in page},
        },
    )


@require_POST
def return_node(request: HttpRequest, node_id: int) -> HttpResponse:
    """An operator says the node is fit: restarts may use it again."""
    if answer := refused(request, "console:nodes", "return a node to service"):
        return answer
    get_object_or_404(Node, pk=node_id)
    outcome = return_to_service(node_id, operator=operator(request), note=note_of(request))
    return back(request, "console:nodes", outcome.message, changed=outcome.changed)


@require_POST
def resume_node(request: HttpRequest, node_id: int) -> HttpResponse:
    """An operator asks the cluster's controller to resume a node recovery drained."""
    if answer := refused(request, "console:nodes", "resume a node"):
        return answer
    get_object_or_404(Node, pk=node_id)
    outcome = request_resume(node_id, operator=operator(request), note=note_of(request))
    return back(request, "console:nodes", outcome.message, changed=outcome.changed)
