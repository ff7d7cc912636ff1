"""Nodes that need a look."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.access import console_view
from console.forms import DecisionForm
from recovery.loop.node_health import return_to_service
from recovery.models import Cluster, Node
from recovery.read.filters import NODE_FLAGS, FlaggedNodeFilterSet
from recovery.roles import actor_name, can_decide

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
            "suspect_count": listed.filter(suspect_since__isnull=False).count(),
        },
    )


@require_POST
def return_node(request: HttpRequest, node_id: int) -> HttpResponse:
    """An operator says the node is fit: restarts may use it again."""
    if not request.user.is_authenticated:
        return redirect_to_login(reverse("console:nodes"))
    if not can_decide(request.user):
        raise PermissionDenied("Only operators may return a node to service.")
    get_object_or_404(Node, pk=node_id)
    form = DecisionForm(request.POST)
    note = form.cleaned_data["note"] if form.is_valid() else ""
    outcome = return_to_service(node_id, operator=actor_name(request.user), note=note)
    level = messages.SUCCESS if outcome.changed else messages.INFO
    messages.add_message(request, level, outcome.message)
    next_url = request.POST.get("next", "")
    if next_url and url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(next_url)
    return redirect("console:nodes")
