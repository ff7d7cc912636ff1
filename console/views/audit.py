"""The audit trail: filters, CSV export and permalinks."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse


@login_required
def audit_trail(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError


@login_required
def audit_csv(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError


@login_required
def audit_event(request: HttpRequest, event_id: int) -> HttpResponse:
    raise NotImplementedError
