"""Insights: latency distributions, goodput over time, anomalies by category and attribution."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse


@login_required
def insights(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError
