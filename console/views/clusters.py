"""Clusters: mode, acknowledgement and what is degraded."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse


@login_required
def clusters(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError
