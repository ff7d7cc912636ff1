"""``/metrics``: the system's own figures in Prometheus' text format."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse


def metrics(request: HttpRequest) -> HttpResponse:
    raise NotImplementedError
