"""Clusters: mode, acknowledgement and what is degraded."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.access import console_view
from recovery.read.cluster_status import STALE_AFTER_POLLS, cluster_statuses
from recovery.read.controllers import CONTROLLER_SEEN_WITHIN


@console_view("recovery.view_cluster", "Viewing clusters")
def clusters(request: HttpRequest) -> HttpResponse:
    """Every cluster: what it may do on its own, what runs degraded, and what waits."""
    now = timezone.now()
    return render(
        request,
        "console/clusters.html",
        {
            "statuses": cluster_statuses(now),
            "now": now,
            # Admin pages are for staff; everyone else would only meet a login wall there.
            "show_admin_links": request.user.is_staff,
            "stale_after_polls": STALE_AFTER_POLLS,
            "controller_seen_minutes": int(CONTROLLER_SEEN_WITHIN.total_seconds() // 60),
        },
    )
